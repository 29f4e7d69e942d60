package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kubelift/kubelift/internal/cli"
)

func parseImport(t *testing.T, stdin string, args ...string) (*importOptions, error) {
	t.Helper()
	s := &cli.IO{In: strings.NewReader(stdin), Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}
	var got *importOptions
	cmd := newCmdImport(s, func(_ context.Context, o *importOptions) error { got = o; return nil })
	cmd.SetArgs(args)
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	return got, cmd.Execute()
}

func TestImportFlags(t *testing.T) {
	o, err := parseImport(t, "", "b.run", "--key", "k.pub", "--domain", "registry.corp:5000", "--namespace", "library",
		"--username", "admin", "--password-stdin", "--ca-file", "ca.pem", "--jobs", "8", "--keep-path", "--dry-run", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if o.Bundle != "b.run" || o.Trust.KeyFile != "k.pub" || o.Domain != "registry.corp:5000" || o.Namespace != "library" ||
		o.Username != "admin" || !o.PasswordStdin || o.CAFile != "ca.pem" || o.Jobs != 8 || !o.KeepPath || !o.DryRun || o.Output != "json" {
		t.Errorf("parsed %+v", o)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"b.run", "--key", "k"}, "--domain HOST[:PORT] is required"},
		{[]string{"b.run", "--domain", "r", "--username", "u", "--password", "p", "--password-stdin"}, "exclude each other"},
		{[]string{"b.run", "--domain", "r", "--password-stdin"}, "a password needs --username"},
		{[]string{"--domain", "r"}, "accepts 1 arg"},
	} {
		_, err := parseImport(t, "", tc.args...)
		var ue *cli.UsageError
		if err == nil || !strings.Contains(err.Error(), tc.want) || (!errors.As(err, &ue) && !strings.Contains(tc.want, "arg")) {
			t.Errorf("%v: %v; want usage error %q", tc.args, err, tc.want)
		}
	}
}

func TestImportCredentials(t *testing.T) {
	o := &importOptions{IO: &cli.IO{In: strings.NewReader("s3cret\nignored\n")}, Domain: "registry.corp", Username: "admin", PasswordStdin: true}
	a, err := o.access()
	if err != nil {
		t.Fatal(err)
	}
	if a.Keychain == nil {
		t.Fatal("no keychain")
	}
	t.Setenv(passwordEnv, "")
	o = &importOptions{IO: &cli.IO{In: strings.NewReader("")}, Domain: "registry.corp", Username: "admin"}
	if _, err := o.access(); err == nil || !strings.Contains(err.Error(), passwordEnv) {
		t.Errorf("no password: %v", err)
	}
	t.Setenv(passwordEnv, "from-env")
	if _, err := o.access(); err != nil {
		t.Errorf("password from %s: %v", passwordEnv, err)
	}
	o = &importOptions{IO: &cli.IO{}, Domain: "r", CAFile: "/nonexistent/ca.pem"}
	if _, err := o.access(); err == nil || !strings.Contains(err.Error(), "--ca-file") {
		t.Errorf("missing CA file: %v", err)
	}
}
