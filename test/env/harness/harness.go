// Package harness runs the built kubelift programs on a sandbox of their
// own, as an operator inside the air gap would: the engine's end-to-end
// tests (test/stories/engine, test/stories/apply) share it.
package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/test/env/kube"
	"github.com/kubelift/kubelift/test/env/programs"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

// Harness is a sandbox with the programs built from this tree, a team key,
// and two bundles of the new version.
type Harness struct {
	SB     *sandbox.State
	Client kubernetes.Interface
	// Bin holds bundle, upgrade and kubelift-sandbox; Work the keys and bundles.
	Bin, Work string
	// HashSkipBundle carries kubelift's hash-skip kubelet; UpstreamBundle,
	// made a second later, upstream's.
	HashSkipBundle, UpstreamBundle string
	tmp                            string
	cfg                            sandbox.Config
	agent                          bool
	// teardown takes the sandbox down and removes tmp, at Close or at
	// the first interrupt.
	teardown *sandbox.Teardown
	// said is every line the upgrade program wrote to standard error
	// here, timed: a failed availability check shows the steps around
	// each failure (NoDisruption).
	said transcript
}

// Option changes the sandbox Setup brings up, or its bundles.
type Option func(*setup)

// setup is what the options change.
type setup struct {
	sandbox.Config
	agent bool
}

// Agent puts the agent's image in the hash-skip bundle (bundle create
// --agent, from the upgrade program built here): agent mode's.
func Agent() Option { return func(c *setup) { c.agent = true } }

// From starts the sandbox's nodes at version instead of the sandbox's
// default old version (the bundles stay at its new version).
func From(version string) Option { return func(c *setup) { c.OldVersion = version } }

// StandIn runs the nodes on the CRI stand-in (containers as records, no
// processes, no pod network) instead of containerd; why says what the
// package needs it for.
func StandIn(why string) Option {
	return func(c *setup) {
		c.Runtime = sandbox.RuntimeStandIn
		fmt.Fprintf(os.Stderr, "harness: nodes on the CRI stand-in: %s\n", why)
	}
}

// Target makes the bundles (and the sandbox's new version) version; more
// than one minor ahead of the nodes, the bundles carry the hops in between
// (bundle create --from).
func Target(version string) Option { return func(c *setup) { c.NewVersion = version } }

// Kubeadm builds the sandbox with kubeadm (sandbox.Config.Kubeadm).
func Kubeadm() Option { return func(c *setup) { c.Kubeadm = true } }

// OldRuntime starts every node on containerd version (a version
// kube.RuntimeFor knows) instead of the sandbox's default, and makes the
// bundles carry the node stack (bundle create --node-stack) that moves
// the nodes to the default, as a cluster on an older runtime needs.
func OldRuntime(version string) Option { return func(c *setup) { c.RuntimeVersion = version } }

// CoreDNS runs CoreDNS at version on the binary sandbox
// (sandbox.Config.CoreDNS), as an installer of an earlier release left it.
func CoreDNS(version string) Option { return func(c *setup) { c.CoreDNS = version } }

// Etcd runs the binary sandbox's etcd as a cluster at version from, a
// member on every control plane (sandbox.Config.Etcd), and makes the
// bundles carry etcd at version to (bundle create --etcd), which the
// stand-in internet serves (sandbox.Config.EtcdTo).
func Etcd(from, to string) Option {
	return func(c *setup) { c.Etcd, c.EtcdTo = from, to }
}

// APIServerFeatureGates gives the binary sandbox's API servers
// --feature-gates=gates (sandbox.Config.APIServerFeatureGates).
func APIServerFeatureGates(gates string) Option {
	return func(c *setup) { c.APIServerFeatureGates = gates }
}

// StaticPod runs a static pod on the last worker (sandbox.Config.StaticPod).
func StaticPod() Option { return func(c *setup) { c.StaticPod = true } }

// Setup builds the programs, brings up a sandbox (controlPlanes, workers)
// named name on subnet, and makes the bundles. Close takes it all down,
// and so does an interrupt (sandbox.DownOnInterrupt), which then ends the
// process.
func Setup(name, subnet string, controlPlanes, workers int, opts ...Option) (*Harness, error) {
	tmp, err := os.MkdirTemp("", "kubelift-"+name+"-")
	if err != nil {
		return nil, err
	}
	h := &Harness{tmp: tmp, Work: filepath.Join(tmp, "work")}
	h.cfg = sandbox.Config{Dir: filepath.Join(tmp, "sandbox"), Name: fmt.Sprintf("%s%d", name, os.Getpid()%1000), Subnet: subnet,
		ControlPlanes: controlPlanes, Workers: workers, Workloads: true,
		Log: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "sandbox: "+format+"\n", args...) }}
	h.teardown = sandbox.DownOnInterrupt(h.cfg.Dir, h.cfg.Log, tmp)
	ctx := h.teardown.Ctx
	if h.Bin, err = programs.Dir(filepath.Join(tmp, "bin")); err != nil {
		h.Close()
		return nil, err
	}
	h.cfg.Tool = filepath.Join(h.Bin, "kubelift-sandbox")
	set := setup{Config: h.cfg}
	for _, o := range opts {
		o(&set)
	}
	h.cfg, h.agent = set.Config, set.agent
	h.cfg.Defaults()
	// The sandbox first: it boots its nodes while the target builds, and
	// the hash-skip kubelet is built on the target's stock one.
	if h.SB, err = sandbox.Up(ctx, h.cfg); err != nil {
		h.Close()
		return nil, err
	}
	hashSkipKubelet, err := kube.HashSkipKubelet(ctx, h.cfg.NewVersion)
	if err != nil {
		h.Close()
		return nil, err
	}
	if h.Client, err = h.SB.Client(); err != nil {
		h.Close()
		return nil, err
	}
	if err := h.makeBundles(hashSkipKubelet); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// Main is a test package's TestMain: it sets up a harness (as Setup),
// hands it to use, runs the tests, takes it all down and exits.
func Main(m *testing.M, name, subnet string, controlPlanes, workers int, use func(*Harness), opts ...Option) {
	h, err := Setup(name, subnet, controlPlanes, workers, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	use(h)
	code := m.Run()
	h.Close()
	os.Exit(code)
}

// Close takes the sandbox down and removes every file.
func (h *Harness) Close() { _ = h.teardown.Down() }

// makeBundles makes the bundles outside the air gap, on the stand-in
// internet. The upstream bundle is made a second later: of two imported
// bundles of a version, the engine takes the most recently made.
func (h *Harness) makeBundles(hashSkipKubelet string) error {
	if err := os.MkdirAll(h.Work, 0o755); err != nil {
		return err
	}
	if _, err := ProgramOut(nil, "", filepath.Join(h.Bin, "bundle"), "keygen", "--out", filepath.Join(h.Work, "team")); err != nil {
		return err
	}
	h.HashSkipBundle, h.UpstreamBundle = filepath.Join(h.Work, "hashskip.tar"), filepath.Join(h.Work, "upstream.tar")
	for i, b := range []struct {
		out   string
		extra []string
	}{{h.HashSkipBundle, []string{"--kubelet-binary", hashSkipKubelet}}, {h.UpstreamBundle, nil}} {
		if h.agent && i == 0 {
			b.extra = append(b.extra, "--agent", filepath.Join(h.Bin, "upgrade"))
		}
		if i > 0 {
			time.Sleep(1100 * time.Millisecond)
		}
		args := append([]string{"create", "--kubernetes-version", h.SB.NewVersion, "--sign-key", filepath.Join(h.Work, "team.key"), "-o", b.out,
			"--cache-dir", filepath.Join(h.Work, "cache"), "-q"}, h.SB.Internet.BundleFlags...)
		if len(h.SB.Binaries.Hops) > 0 {
			args = append(args, "--from", h.SB.OldVersion)
		}
		if h.SB.RuntimeVersion != "" && h.SB.RuntimeVersion != kube.ContainerdVersion {
			args = append(args, "--node-stack")
		}
		if h.SB.EtcdTo != "" {
			// etcd's archive alone, not the whole node stack
			args = append(args, "--etcd", h.SB.EtcdTo)
		}
		for _, img := range h.SB.Internet.UserImages {
			args = append(args, "--image", img) // the team's own, as a user bundles them
		}
		if _, err := ProgramOut(&kube.NetNS{Name: h.SB.Internet.NetNS}, "", filepath.Join(h.Bin, "bundle"), append(args, b.extra...)...); err != nil {
			return err
		}
	}
	return nil
}

// Key is the team's public key file.
func (h *Harness) Key() string { return filepath.Join(h.Work, "team.pub") }

// ProgramOut runs a program (in a namespace, if given) with a time limit.
func ProgramOut(ns *kube.NetNS, stdin, name string, args ...string) (string, error) {
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

// Result is a finished run of the upgrade program on the admin machine.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// Upgrade runs the upgrade program on the admin machine, as an operator
// inside the air gap would, with the cluster's kubeconfig. The limit is
// a bound against a hang, not a claim of speed: 10 minutes, since on a
// new machine applyha's first apply (etcd and an HA control plane moved)
// ran past 5 beside the background builds (FC59, cold).
func (h *Harness) Upgrade(t *testing.T, stdin string, args ...string) Result {
	t.Helper()
	return h.UpgradeWithin(t, 10*time.Minute, stdin, args...)
}

// UpgradeWithin is Upgrade with another time limit (kubeadm waits up to
// 5 minutes for a static pod before it rolls back).
func (h *Harness) UpgradeWithin(t *testing.T, limit time.Duration, stdin string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := h.SB.Admin().Net().Command(filepath.Join(h.Bin, "upgrade"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(h.SB.Dir, "kubeconfig"), "KUBELIFT_CACHE_DIR="+filepath.Join(t.TempDir(), "cache"))
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	tl := &timedLines{said: &h.said, prefix: saidBy(args)}
	if testing.Verbose() {
		// go test -v: the transcript as it happens, each line timed, to
		// see where a slow story spends its time.
		tl.t = t
	}
	defer tl.stop() // what the program writes after this returns is not logged
	cmd.Stdout, cmd.Stderr = &out, io.MultiWriter(&errb, tl)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.said.started(args)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		h.said.add(time.Now(), saidBy(args)+"(killed: timed out)")
		t.Fatalf("upgrade %s: timed out", strings.Join(args, " "))
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	h.said.add(time.Now(), saidBy(args)+fmt.Sprintf("(exited %d)", code))
	return Result{out.String(), errb.String(), code}
}

// Start starts the upgrade program on the admin machine without waiting
// for it (the caller kills it, by pid, or waits); its standard error
// collects in the buffer.
func (h *Harness) Start(stdin string, args ...string) (*exec.Cmd, *bytes.Buffer, error) {
	cmd, _, stderr, err := h.StartOutput(stdin, args...)
	return cmd, stderr, err
}

// StartOutput is Start, with the program's standard output collected too
// (read the buffers once cmd.Wait returned).
func (h *Harness) StartOutput(stdin string, args ...string) (cmd *exec.Cmd, stdout, stderr *bytes.Buffer, err error) {
	cmd = h.SB.Admin().Net().Command(filepath.Join(h.Bin, "upgrade"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(h.SB.Dir, "kubeconfig"), "KUBELIFT_CACHE_DIR="+filepath.Join(h.tmp, "cache"))
	cmd.Stdin = strings.NewReader(stdin)
	stdout, stderr = &bytes.Buffer{}, &bytes.Buffer{}
	cmd.Stdout = stdout
	cmd.Stderr = io.MultiWriter(stderr, &timedLines{said: &h.said, prefix: saidBy(args)})
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, err
	}
	h.said.started(args)
	return cmd, stdout, stderr, nil
}

// StartLines starts the upgrade program as Start does; its standard error
// comes line by line on the channel, which is closed once the program has
// closed it (read it to the end before cmd.Wait).
func (h *Harness) StartLines(stdin string, args ...string) (*exec.Cmd, <-chan string, error) {
	cmd := h.SB.Admin().Net().Command(filepath.Join(h.Bin, "upgrade"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(h.SB.Dir, "kubeconfig"), "KUBELIFT_CACHE_DIR="+filepath.Join(h.tmp, "cache"))
	cmd.Stdin = strings.NewReader(stdin)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	h.said.started(args)
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		defer func() { h.said.add(time.Now(), saidBy(args)+"(closed its standard error)") }()
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			h.said.add(time.Now(), saidBy(args)+sc.Text())
			lines <- sc.Text()
		}
		if err := sc.Err(); err != nil { // a line past 1 MiB: say so, and keep the program from blocking on its pipe
			lines <- "harness: reading standard error: " + err.Error()
			_, _ = io.Copy(io.Discard, pipe)
		}
	}()
	return cmd, lines, nil
}

// RegistryFlags reach the sandbox's private registry (the password on stdin).
func (h *Harness) RegistryFlags() ([]string, string) {
	pw, _ := os.ReadFile(filepath.Join(h.SB.Dir, "registry", "password"))
	return []string{"--username", h.SB.Registry.User, "--password-stdin", "--ca-file", h.SB.Registry.CAFile}, strings.TrimSpace(string(pw)) + "\n"
}

// SSHFlags reach the nodes with the sandbox's key and known_hosts.
func (h *Harness) SSHFlags() []string {
	return []string{"--ssh-key", filepath.Join(h.SB.Dir, "ssh", "id_ed25519"), "--known-hosts", filepath.Join(h.SB.Dir, "ssh", "known_hosts")}
}

// Import imports file into the sandbox's registry and cluster.
func (h *Harness) Import(t *testing.T, file string, extra ...string) Result {
	t.Helper()
	reg, pw := h.RegistryFlags()
	args := append([]string{"import", file, "--key", h.Key(), "--domain", h.SB.Registry.Address, "--namespace", "library", "-q"}, reg...)
	r := h.Upgrade(t, pw, append(args, extra...)...)
	if r.Code != 0 {
		t.Fatalf("import %s: exit %d\n%s%s", filepath.Base(file), r.Code, r.Stdout, r.Stderr)
	}
	return r
}

// SSH runs a command on a node over SSH, as kubelift does.
func (h *Harness) SSH(t *testing.T, node, command string) string {
	t.Helper()
	out, err := h.TrySSH(node, command)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TrySSH is SSH for a command that may fail (a check repeated until a
// process has settled): the error says the node, command and output.
func (h *Harness) TrySSH(node, command string) (string, error) {
	return h.trySSH(node, command, nil)
}

// SSHInput is SSH with stdin fed to the command: a file copied to a node
// (cat >FILE) as scp would.
func (h *Harness) SSHInput(t *testing.T, node, command string, stdin io.Reader) string {
	t.Helper()
	out, err := h.trySSH(node, command, stdin)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (h *Harness) trySSH(node, command string, stdin io.Reader) (string, error) {
	c, err := h.SB.SSH(context.Background(), node)
	if err != nil {
		return "", err
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		return "", err
	}
	defer s.Close()
	var out, errb bytes.Buffer
	s.Stdin, s.Stdout, s.Stderr = stdin, &out, &errb
	if err := s.Run(command); err != nil {
		return out.String(), fmt.Errorf("ssh %s %q: %v\n%s%s", node, command, err, out.String(), errb.String())
	}
	return out.String(), nil
}

// Eventually checks cond until it holds, at most within, and says what it
// last saw when it never did: for a state a process reaches after a
// restart (a unit's MainPID is 0 while it restarts). No test asserts on
// how long that takes.
func Eventually(t *testing.T, within time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("not within %s: %s", within, last)
			return
		}
		time.Sleep(time.Second)
	}
}
