package registry

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// helper installs docker-credential-NAME answering body (a shell
// script's), on a PATH of its own.
func helper(t *testing.T, name, body string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "docker-credential-"+name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// A credential helper is asked as docker asks it: `get`, the server on
// stdin; what it answers is checked.
func TestHelperCredentials(t *testing.T) {
	helper(t, "kltest", `[ "$1" = get ] || exit 2; read server; [ "$server" = "reg.corp:5000" ] || { printf '{"Username":"admin","Secret":"s3cret"}'; echo "credentials not found in native keychain" >&2; exit 1; }
printf '{"ServerURL":"reg.corp:5000","Username":"admin","Secret":"s3cret"}'`)
	user, pw, err := HelperCredentials(context.Background(), "kltest", "reg.corp:5000")
	if err != nil || user != "admin" || pw != "s3cret" {
		t.Fatalf("got %q %q %v", user, pw, err)
	}
	if _, _, err := HelperCredentials(context.Background(), "kltest", "other:5000"); err == nil || !strings.Contains(err.Error(), "docker-credential-kltest for other:5000") ||
		!strings.Contains(err.Error(), "not found in native keychain") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("a server it does not know: %v", err)
	}
	for body, want := range map[string]string{
		`echo 'not json'`:                           "not docker's JSON",
		`printf '{"Username":"a:b","Secret":"x"}'`:  `user "a:b"`,
		`printf '{"Username":"admin","Secret":""}'`: "no secret for user admin",
	} {
		helper(t, "klbad", body)
		if _, _, err := HelperCredentials(context.Background(), "klbad", "reg.corp:5000"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("helper %q: want %q, got %v", body, want, err)
		}
	}
	if _, _, err := HelperCredentials(context.Background(), "../../bin/sh", "reg.corp:5000"); err == nil || !strings.Contains(err.Error(), "want the NAME") {
		t.Errorf("a path as the helper's name: %v", err)
	}
	if _, _, err := HelperCredentials(context.Background(), "kl-none", "reg.corp:5000"); err == nil || !strings.Contains(err.Error(), "docker-credential-kl-none") {
		t.Errorf("a helper not installed: %v", err)
	}
}
