package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/kubelift/kubelift/internal/cli"
)

func parseCreate(t *testing.T, args ...string) (*createOptions, error) {
	t.Helper()
	s := &cli.IO{Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}
	var got *createOptions
	cmd := newCmdCreate(s, func(_ context.Context, o *createOptions) error { got = o; return nil })
	cmd.SetArgs(args)
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	return got, cmd.Execute()
}

func TestCreateFlags(t *testing.T) {
	o, err := parseCreate(t, "--kubernetes-version", "v1.31.4", "--arch", "amd64,arm64", "--sign-key", "team.key", "-o", "x.tar",
		"--registry-mirror", "registry.k8s.io=m/k8s", "--registry-mirror", "docker.io=m/hub", "--url-mirror", "https://dl.k8s.io=https://f",
		"--image", "nginx:1.27", "--file", "helm=https://x/helm.tgz", "--insecure-registry", "m", "--jobs", "2", "--all-platforms", "--node-stack", "-q")
	if err != nil {
		t.Fatal(err)
	}
	if o.KubernetesVersion != "v1.31.4" || strings.Join(o.Arches, ",") != "amd64,arm64" || o.SignKey != "team.key" || o.Output != "x.tar" ||
		len(o.RegistryMirrors) != 2 || len(o.URLMirrors) != 1 || o.Images[0] != "nginx:1.27" || o.Files[0] != "helm=https://x/helm.tgz" ||
		o.InsecureRegistry[0] != "m" || o.Jobs != 2 || !o.AllPlatforms || !o.NodeStack || !o.Quiet || o.Format != "tar" {
		t.Errorf("parsed %+v", o)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sign-key", "k"}, "--kubernetes-version is required"},
		{[]string{"--kubernetes-version", "v1.31.4"}, "--sign-key KEY is required"},
		{[]string{"--kubernetes-version", "v1.31.4", "--sign-key", "k", "--unsigned"}, "exclude each other"},
	} {
		if _, err := parseCreate(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want %q", tc.args, err, tc.want)
		}
	}
	// A dry run needs no key.
	if _, err := parseCreate(t, "--kubernetes-version", "v1.31.4", "--dry-run"); err != nil {
		t.Errorf("dry run: %v", err)
	}
}

func TestCatalogListsTheNodeStack(t *testing.T) {
	out := &bytes.Buffer{}
	cmd := newCmdCatalog(&cli.IO{Out: out, ErrOut: &bytes.Buffer{}})
	cmd.SetArgs(nil)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out.String(), "\n") {
		switch {
		case strings.HasPrefix(line, "VERSION"):
			if !strings.HasSuffix(line, "NODE STACK") {
				t.Errorf("header %q", line)
			}
		case strings.HasPrefix(line, "v1.28.15 "):
			if !strings.HasSuffix(line, " -") {
				t.Errorf("v1.28.15 has no node stack: %q", line)
			}
		case strings.HasPrefix(line, "v1.34.4 "):
			if !strings.HasSuffix(line, "containerd v2.3.7, runc v1.5.2, etcd v3.6.5") {
				t.Errorf("v1.34.4: %q", line)
			}
		}
	}
}
