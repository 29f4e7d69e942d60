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
	want := cli.RegistryFlags{Domain: "registry.corp:5000", Username: "admin", PasswordStdin: true, CAFile: "ca.pem"}
	if o.Bundle != "b.run" || o.Trust.KeyFile != "k.pub" || o.Registry != want || o.Namespace != "library" ||
		o.Jobs != 8 || !o.KeepPath || !o.DryRun || o.Output != "json" {
		t.Errorf("parsed %+v", o)
	}
	o, err = parseImport(t, "", "b.run", "--domain", "r", "--insecure-skip-tls-verify", "--plain-http", "--username", "u", "--password", "p")
	if err != nil {
		t.Fatal(err)
	}
	if want := (cli.RegistryFlags{Domain: "r", Username: "u", Password: "p", SkipTLSVerify: true, PlainHTTP: true}); o.Registry != want {
		t.Errorf("parsed %+v", o.Registry)
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
