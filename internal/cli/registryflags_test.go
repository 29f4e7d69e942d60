package cli

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/cobra"
)

func parseRegistryFlags(t *testing.T, args ...string) (*RegistryFlags, error) {
	t.Helper()
	f := &RegistryFlags{}
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return f.Validate() }}
	f.AddFlags(cmd)
	cmd.SetArgs(args)
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	return f, cmd.Execute()
}

func TestRegistryFlags(t *testing.T) {
	f, err := parseRegistryFlags(t, "--domain", "registry.corp:5000", "--username", "admin", "--password-stdin",
		"--ca-file", "ca.pem", "--insecure-skip-tls-verify", "--plain-http")
	if err != nil {
		t.Fatal(err)
	}
	want := RegistryFlags{Domain: "registry.corp:5000", Username: "admin", PasswordStdin: true, CAFile: "ca.pem", SkipTLSVerify: true, PlainHTTP: true}
	if *f != want {
		t.Errorf("parsed %+v", *f)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--domain HOST[:PORT] is required: the private registry"},
		{[]string{"--domain", "r", "--username", "u", "--password", "p", "--password-stdin"}, "--password and --password-stdin exclude each other"},
		{[]string{"--domain", "r", "--password-stdin"}, "a password needs --username"},
		{[]string{"--domain", "r", "--password", "p"}, "a password needs --username"},
		{[]string{"--domain", "r", "--username", "u"}, ""}, // the password may come from the environment
	} {
		_, err := parseRegistryFlags(t, tc.args...)
		var ue *UsageError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.want != "" && (!errors.As(err, &ue) || err.Error() != tc.want):
			t.Errorf("%v: %v; want usage error %q", tc.args, err, tc.want)
		}
	}
}

// TestRegistryFlagsPassword checks where the password comes from, and that
// it goes to the registry and nowhere else.
func TestRegistryFlagsPassword(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir()) // no credentials from the machine
	auth := func(t *testing.T, f RegistryFlags, stdin string) (*authn.AuthConfig, error) {
		t.Helper()
		a, err := f.Access(strings.NewReader(stdin))
		if err != nil {
			return nil, err
		}
		if a.Keychain == nil {
			return nil, nil
		}
		reg, _ := name.NewRegistry(f.Domain)
		au, err := a.Keychain.Resolve(reg)
		if err != nil {
			t.Fatal(err)
		}
		return au.Authorization()
	}
	t.Setenv(PasswordEnv, "from-env")
	for _, tc := range []struct {
		name  string
		flags RegistryFlags
		stdin string
		want  string
	}{
		{"stdin, first line only", RegistryFlags{Username: "admin", PasswordStdin: true}, "s3cret\r\nignored\n", "s3cret"},
		{"stdin without newline", RegistryFlags{Username: "admin", PasswordStdin: true}, "s3cret", "s3cret"},
		{"flag", RegistryFlags{Username: "admin", Password: "p"}, "", "p"},
		{"environment", RegistryFlags{Username: "admin"}, "", "from-env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.flags.Domain = "registry.corp:5000"
			cfg, err := auth(t, tc.flags, tc.stdin)
			if err != nil {
				t.Fatal(err)
			}
			if cfg == nil || cfg.Username != "admin" || cfg.Password != tc.want {
				t.Errorf("auth %+v, want admin:%s", cfg, tc.want)
			}
		})
	}
	t.Run("no username: docker config", func(t *testing.T) {
		a, err := (&RegistryFlags{Domain: "registry.corp"}).Access(strings.NewReader("s3cret\n"))
		if err != nil || a.Keychain != nil {
			t.Errorf("keychain %v, err %v; want the default", a.Keychain, err)
		}
	})
	t.Setenv(PasswordEnv, "")
	for _, tc := range []struct {
		name  string
		flags RegistryFlags
		stdin string
	}{
		{"none anywhere", RegistryFlags{Username: "admin"}, ""},
		{"empty stdin", RegistryFlags{Username: "admin", PasswordStdin: true}, "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.flags.Domain = "registry.corp"
			_, err := auth(t, tc.flags, tc.stdin)
			var ue *UsageError
			want := "--username admin needs a password: --password-stdin, --password or " + PasswordEnv
			if !errors.As(err, &ue) || err.Error() != want {
				t.Errorf("%v; want usage error %q", err, want)
			}
		})
	}
	t.Run("CA file", func(t *testing.T) {
		_, err := (&RegistryFlags{Domain: "r", CAFile: "/nonexistent/ca.pem"}).Access(strings.NewReader(""))
		if err == nil || !strings.HasPrefix(err.Error(), "--ca-file: ") || !strings.Contains(err.Error(), "/nonexistent/ca.pem") {
			t.Errorf("missing CA file: %v", err)
		}
	})
}
