// Package engine tests kubelift's upgrade engine end to end on a sandbox of
// its own (1 control plane, 3 workers): the built upgrade program, run on
// the sandbox's admin machine, stages binaries over the nodes' real sshd
// and plans against the real API server, registry and kubelets.
package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/test/kube"
	"github.com/kubelift/kubelift/test/sandbox"
)

var (
	sb     *sandbox.State
	client kubernetes.Interface
	bin    string // bundle, upgrade and kubelift-sandbox, built from this tree
	work   string // keys and bundles
	// Bundles of the new version: with kubelift's hash-skip kubelet, and
	// with upstream's.
	hashSkipBundle, upstreamBundle string
)

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "kubelift-engine-test-")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(tmp)
	bin, work = filepath.Join(tmp, "bin"), filepath.Join(tmp, "work")
	for pkg, out := range map[string]string{"cmd/bundle": "bundle", "cmd/upgrade": "upgrade", "test/sandbox/cmd/kubelift-sandbox": "kubelift-sandbox"} {
		if b, err := exec.Command("go", "build", "-o", filepath.Join(bin, out), "github.com/kubelift/kubelift/"+pkg).CombinedOutput(); err != nil {
			return 1, fmt.Errorf("build %s: %v\n%s", pkg, err, b)
		}
	}
	_, file, _, _ := runtime.Caller(0)
	hashSkipKubelet, err := exec.Command(filepath.Join(filepath.Dir(file), "..", "..", "hack", "build-kubelet.sh"), "v1.31.4").Output()
	if err != nil {
		return 1, fmt.Errorf("hack/build-kubelet.sh: %w", err)
	}
	cfg := sandbox.Config{Dir: filepath.Join(tmp, "sandbox"), Name: fmt.Sprintf("kle%d", os.Getpid()%1000), Subnet: "10.82.0",
		Workers: 3, Tool: filepath.Join(bin, "kubelift-sandbox"), Workloads: true,
		Log: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "sandbox: "+format+"\n", args...) }}
	cfg.Defaults()
	if sb, err = sandbox.Up(ctx, cfg); err != nil {
		_ = sandbox.Down(ctx, cfg.Dir, nil)
		return 1, err
	}
	defer func() { _ = sandbox.Down(ctx, cfg.Dir, cfg.Log) }()
	if client, err = sb.Client(); err != nil {
		return 1, err
	}
	// Bundles are made outside the air gap, on the stand-in internet.
	if err := os.MkdirAll(work, 0o755); err != nil {
		return 1, err
	}
	if _, err := programOut(nil, "", filepath.Join(bin, "bundle"), "keygen", "--out", filepath.Join(work, "team")); err != nil {
		return 1, err
	}
	hashSkipBundle, upstreamBundle = filepath.Join(work, "hashskip.tar"), filepath.Join(work, "upstream.tar")
	// The upstream bundle is made a second later: of two imported bundles
	// of a version, the engine takes the most recently made.
	for i, b := range []struct {
		out   string
		extra []string
	}{{hashSkipBundle, []string{"--kubelet-binary", strings.TrimSpace(string(hashSkipKubelet))}}, {upstreamBundle, nil}} {
		if i > 0 {
			time.Sleep(1100 * time.Millisecond)
		}
		args := append([]string{"create", "--kubernetes-version", sb.NewVersion, "--sign-key", filepath.Join(work, "team.key"), "-o", b.out,
			"--cache-dir", filepath.Join(work, "cache"), "-q"}, sb.Internet.BundleFlags...)
		if _, err := programOut(&kube.NetNS{Name: sb.Internet.NetNS}, "", filepath.Join(bin, "bundle"), append(args, b.extra...)...); err != nil {
			return 1, err
		}
	}
	return m.Run(), nil
}

// programOut runs a program (in a namespace, if given) with a time limit.
func programOut(ns *kube.NetNS, stdin, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var cmd *exec.Cmd
	if ns != nil {
		cmd = ns.Command(name, args...)
	} else {
		cmd = exec.Command(name, args...)
	}
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return out.String(), fmt.Errorf("%s %s: %w\nstdout: %s\nstderr: %s", filepath.Base(name), strings.Join(args, " "), err, out.String(), errb.String())
		}
		return out.String(), nil
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		return out.String(), fmt.Errorf("%s: timed out", name)
	}
}

// result is a finished run of the upgrade program on the admin machine.
type result struct {
	stdout, stderr string
	code           int
}

// upgrade runs the upgrade program on the admin machine, as an operator
// inside the air gap would, with the cluster's kubeconfig.
func upgrade(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := sb.Admin().Net().Command(filepath.Join(bin, "upgrade"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(sb.Dir, "kubeconfig"), "KUBELIFT_CACHE_DIR="+filepath.Join(t.TempDir(), "cache"))
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		t.Fatalf("upgrade %s: timed out", strings.Join(args, " "))
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{out.String(), errb.String(), code}
}

// registryFlags reach the sandbox's private registry (the password on stdin).
func registryFlags() ([]string, string) {
	pw, _ := os.ReadFile(filepath.Join(sb.Dir, "registry", "password"))
	return []string{"--username", sb.Registry.User, "--password-stdin", "--ca-file", sb.Registry.CAFile}, strings.TrimSpace(string(pw)) + "\n"
}

// sshFlags reach the nodes with the sandbox's key and known_hosts.
func sshFlags() []string {
	return []string{"--ssh-key", filepath.Join(sb.Dir, "ssh", "id_ed25519"), "--known-hosts", filepath.Join(sb.Dir, "ssh", "known_hosts")}
}

// importBundle imports file into the sandbox's registry and cluster.
func importBundle(t *testing.T, file string, extra ...string) result {
	t.Helper()
	reg, pw := registryFlags()
	args := append([]string{"import", file, "--key", filepath.Join(work, "team.pub"), "--domain", sb.Registry.Address, "--namespace", "library", "-q"}, reg...)
	r := upgrade(t, pw, append(args, extra...)...)
	if r.code != 0 {
		t.Fatalf("import %s: exit %d\n%s%s", filepath.Base(file), r.code, r.stdout, r.stderr)
	}
	return r
}

// ssh runs a command on a node over SSH, as kubelift does.
func ssh(t *testing.T, node, command string) string {
	t.Helper()
	c, err := sb.SSH(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out, errb bytes.Buffer
	s.Stdout, s.Stderr = &out, &errb
	if err := s.Run(command); err != nil {
		t.Fatalf("ssh %s %q: %v\n%s%s", node, command, err, out.String(), errb.String())
	}
	return out.String()
}
