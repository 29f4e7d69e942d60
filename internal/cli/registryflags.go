package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/registry"
)

// PasswordEnv may hold the registry password.
const PasswordEnv = "KUBELIFT_REGISTRY_PASSWORD"

// RegistryFlags are the flags naming the private registry and the way
// into it, for every command that pushes there.
type RegistryFlags struct {
	Domain        string
	Username      string
	Password      string
	PasswordStdin bool
	// CredentialHelper, when set, gives user and password
	// (docker-credential-NAME).
	CredentialHelper string
	CAFile           string
	SkipTLSVerify    bool
	PlainHTTP        bool
}

// AddFlags registers --domain, --username, --password, --password-stdin,
// --ca-file, --insecure-skip-tls-verify and --plain-http.
func (f *RegistryFlags) AddFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.Domain, "domain", "", "private registry host[:port]")
	fs.StringVar(&f.Username, "username", "", "registry user (default: credentials from the docker config)")
	fs.StringVar(&f.Password, "password", "", "registry password (visible to other users in ps: prefer --password-stdin or "+PasswordEnv+")")
	fs.BoolVar(&f.PasswordStdin, "password-stdin", false, "read the password from standard input")
	fs.StringVar(&f.CredentialHelper, "credential-helper", "", "a docker credential helper NAME gives the registry's user and password (docker-credential-NAME get, as docker and crane ask it)")
	fs.StringVar(&f.CAFile, "ca-file", "", "PEM CA bundle that signed the registry's certificate")
	fs.BoolVar(&f.SkipTLSVerify, "insecure-skip-tls-verify", false, "do not verify the registry's certificate")
	fs.BoolVar(&f.PlainHTTP, "plain-http", false, "the registry speaks plain HTTP")
}

// Validate reports flag combinations that cannot work, as usage errors.
// It reads nothing: the password is read by Access.
func (f *RegistryFlags) Validate() error {
	if f.Domain == "" {
		return Usagef("--domain HOST[:PORT] is required: the private registry")
	}
	if f.PasswordStdin && f.Password != "" {
		return Usagef("--password and --password-stdin exclude each other")
	}
	if f.CredentialHelper != "" && (f.PasswordStdin || f.Password != "" || f.Username != "") {
		return Usagef("--credential-helper gives the user and password: no --username, --password or --password-stdin beside it (one of them may come from the kubelift context: 'upgrade config view')")
	}
	if (f.PasswordStdin || f.Password != "") && f.Username == "" {
		return Usagef("a password needs --username")
	}
	return nil
}

// Access reads the password (the first line of in with --password-stdin,
// else --password, else $KUBELIFT_REGISTRY_PASSWORD) when there is a
// --username, and returns how to reach the registry.
func (f *RegistryFlags) Access(in io.Reader) (registry.Access, error) {
	c, err := f.Credentials(in)
	if err != nil {
		return registry.Access{}, err
	}
	return c.Access()
}

// Credentials reads the password as Access does and returns the
// registry's credentials.
func (f *RegistryFlags) Credentials(in io.Reader) (registry.Credentials, error) {
	c := registry.Credentials{Domain: f.Domain, Username: f.Username, CAFile: f.CAFile,
		SkipTLSVerify: f.SkipTLSVerify, PlainHTTP: f.PlainHTTP}
	if f.CredentialHelper != "" {
		host, _, _ := strings.Cut(f.Domain, "/")
		user, password, err := registry.HelperCredentials(context.Background(), f.CredentialHelper, host)
		if err != nil {
			return registry.Credentials{}, err
		}
		c.Username, c.Password = user, password
		return c, nil
	}
	if f.Username != "" {
		password, err := f.password(in)
		if err != nil {
			return registry.Credentials{}, err
		}
		c.Password = password
	}
	return c, nil
}

func (f *RegistryFlags) password(in io.Reader) (string, error) {
	switch {
	case f.PasswordStdin:
		line, err := bufio.NewReader(in).ReadString('\n')
		if err != nil && err != io.EOF {
			return "", fmt.Errorf("--password-stdin: %w", err)
		}
		if p := strings.TrimRight(line, "\r\n"); p != "" {
			return p, nil
		}
	case f.Password != "":
		return f.Password, nil
	default:
		if p := os.Getenv(PasswordEnv); p != "" {
			return p, nil
		}
	}
	return "", Usagef("--username %s needs a password: --password-stdin, --password or %s", f.Username, PasswordEnv)
}
