package registry

import (
	"context"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
)

func TestCredentialsCAFile(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		file, want string
	}{
		{filepath.Join(dir, "missing.pem"), "--ca-file: open " + filepath.Join(dir, "missing.pem") + ": no such file or directory"},
		{garbage, "--ca-file " + garbage + ": no PEM certificates in it"},
	} {
		_, err := Credentials{Domain: "registry.corp", CAFile: tc.file}.Access()
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v; want %q", tc.file, err, tc.want)
		}
	}
	a, err := Credentials{Domain: "registry.corp"}.Access()
	if err != nil || a.RootCAs != nil || a.Insecure != nil || a.Keychain != nil {
		t.Errorf("no flags: %+v, %v; want the defaults", a, err)
	}
}

// TestCredentialsTLS pushes to a TLS registry whose certificate no system
// trusts: it works with the CA file, or without verification, and fails
// otherwise.
func TestCredentialsTLS(t *testing.T) {
	tr := startTestRegistry(t, true)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tr.srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(500, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		creds   Credentials
		wantErr string
	}{
		{"CA file", Credentials{Domain: tr.host, CAFile: ca}, ""},
		{"no verification", Credentials{Domain: tr.host, SkipTLSVerify: true}, ""},
		{"untrusted", Credentials{Domain: tr.host}, "--ca-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := tc.creds.Access()
			if err != nil {
				t.Fatal(err)
			}
			src := newMemSource()
			imgs := []*PushImage{src.image(t, img, tr.ref(t, "lib/tls:"+strings.ReplaceAll(tc.name, " ", "-")), false)}
			p := &Pusher{Access: a, Source: src, Retry: noWait}
			plan, err := p.Plan(context.Background(), imgs)
			if err == nil {
				err = p.Push(context.Background(), plan)
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), tr.host)):
				t.Fatalf("err %v; want %q naming %s", err, tc.wantErr, tr.host)
			}
		})
	}
}

func TestCredentialsKeychain(t *testing.T) {
	// The docker config knows another registry, not ours.
	docker := t.TempDir()
	t.Setenv("DOCKER_CONFIG", docker)
	if err := os.WriteFile(filepath.Join(docker, "config.json"),
		[]byte(`{"auths":{"mirror.corp":{"username":"docker","password":"from-config"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	resolve := func(t *testing.T, kc authn.Keychain, reg string) authn.AuthConfig {
		t.Helper()
		r, err := name.NewRegistry(reg)
		if err != nil {
			t.Fatal(err)
		}
		au, err := kc.Resolve(r)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := au.Authorization()
		if err != nil {
			t.Fatal(err)
		}
		return *cfg
	}
	for _, domain := range []string{"registry.corp:5000", "registry.corp:5000/", "registry.corp:5000/team"} {
		t.Run(domain, func(t *testing.T) {
			a, err := Credentials{Domain: domain, Username: "admin", Password: "s3cret", PlainHTTP: true}.Access()
			if err != nil {
				t.Fatal(err)
			}
			if got := resolve(t, a.Keychain, "registry.corp:5000"); got.Username != "admin" || got.Password != "s3cret" {
				t.Errorf("its registry: %+v", got)
			}
			for _, other := range []string{"registry.corp", "registry.corp:5001", "registry.k8s.io", "index.docker.io"} {
				if got := resolve(t, a.Keychain, other); got != (authn.AuthConfig{}) {
					t.Errorf("%s gets %+v; want anonymous", other, got)
				}
			}
			if got := resolve(t, a.Keychain, "mirror.corp"); got.Username != "docker" || got.Password != "from-config" {
				t.Errorf("other registries: %+v; want the docker config's", got)
			}
			if len(a.Insecure) != 1 || a.Insecure[0] != "registry.corp:5000" {
				t.Errorf("insecure %v", a.Insecure)
			}
		})
	}
	t.Run("docker.io", func(t *testing.T) {
		a, err := Credentials{Domain: "docker.io", Username: "admin", Password: "s3cret"}.Access()
		if err != nil {
			t.Fatal(err)
		}
		if got := resolve(t, a.Keychain, "docker.io"); got.Username != "admin" {
			t.Errorf("docker.io: %+v", got)
		}
	})
	for _, bad := range []string{"", "/lib", "registry corp"} {
		if _, err := (Credentials{Domain: bad}).Access(); err == nil || !strings.Contains(err.Error(), "registry domain") {
			t.Errorf("domain %q: %v", bad, err)
		}
	}
}
