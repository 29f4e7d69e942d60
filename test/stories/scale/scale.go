// Package scale brings up kubelift's scale simulation: a real etcd,
// kube-apiserver and kube-controller-manager on loopback, KWOK playing the
// Nodes (test/env/simcluster), an SSH fleet playing each node's side of the
// engine's commands (test/env/fleet: one x/crypto/ssh server per node, each on
// its own 127.x address with its own host key), a real private registry
// (TLS, htpasswd), and a signed bundle of the target made from real builds
// and imported, so that the unmodified upgrade program runs against as
// many nodes as the machine holds. make bench-scale and test/stories/scale's
// 50-node test use it.
package scale

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/test/env/fleet"
	"github.com/kubelift/kubelift/test/env/internet"
	"github.com/kubelift/kubelift/test/env/kube"
	"github.com/kubelift/kubelift/test/env/programs"
	"github.com/kubelift/kubelift/test/env/simcluster"
)

// The versions the simulation upgrades between.
const (
	From = "v1.30.14"
	To   = "v1.31.4"
)

// APIHost is the control-plane node's address: the real API server
// listens there, and so does that node's SSH server in the fleet.
const APIHost = "127.1.0.1"

// Options size the simulation.
type Options struct {
	// Dir holds everything; the caller removes it.
	Dir string
	// Workers is the number of simulated workers (one control-plane node
	// comes with them).
	Workers int
	// PodsPerNode bare pods on every worker; every NoTolerationsEvery-th
	// has no not-ready/unreachable tolerations.
	PodsPerNode, NoTolerationsEvery int
	// RestartDelay and RestartJitter: a restarted kubelet is Ready again
	// after RestartDelay plus up to RestartJitter (KWOK's stage).
	RestartDelay, RestartJitter time.Duration
	// LeaseDuration of the simulated nodes' leases (default 40 s, as
	// kubelets'): KWOK renews each a few times per duration, the load a
	// cluster of that size puts on its API server at rest.
	LeaseDuration time.Duration
	// Agent: the bundle carries the agent's image too (agent mode: the
	// fleet's agents answer the step requests, ServeAgents).
	Agent bool
	Log   func(format string, args ...any)
}

// Env is a running simulation.
type Env struct {
	Dir, Bin string
	Cluster  *simcluster.Cluster
	Fleet    *fleet.Fleet
	Registry *internet.Registry
	// Key is the team's public key; Bundle the signed bundle of To with
	// kubelift's hash-skip kubelet; Files its linux/amd64 files' sha256.
	Key, Bundle string
	Files       map[string]string
	Nodes       []fleet.NodeSpec
	closers     []func()
}

// WorkerAddress is worker i's (0-based) loopback address: 127.2.0.1 on.
func WorkerAddress(i int) string {
	return fmt.Sprintf("127.2.%d.%d", i/250, i%250+1)
}

// Up brings the simulation up; Close takes it down.
func Up(ctx context.Context, o Options) (_ *Env, err error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	e := &Env{Dir: o.Dir, Bin: filepath.Join(o.Dir, "bin")}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	start := time.Now()
	if err := e.buildPrograms(); err != nil {
		return nil, err
	}
	o.Log("building (or finding cached) Kubernetes %s and %s, and kubelift's hash-skip kubelet", From, To)
	oldBin, err := kube.Binaries(ctx, From, "kube-apiserver", "kube-controller-manager")
	if err != nil {
		return nil, err
	}
	newBin, err := kube.Binaries(ctx, To, "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")
	if err != nil {
		return nil, err
	}
	hashSkip, err := hashSkipKubelet(ctx)
	if err != nil {
		return nil, err
	}
	o.Log("making the signed bundle of %s from the real builds", To)
	if err := e.makeBundle(ctx, newBin, hashSkip, o.Agent); err != nil {
		return nil, err
	}
	if e.Registry, err = internet.StartRegistry(ctx, filepath.Join(o.Dir, "registry"), internet.RegistryOptions{TLS: true, User: "kubelift", Password: "scale-secret"}); err != nil {
		return nil, err
	}
	e.closers = append(e.closers, e.Registry.Stop)

	o.Log("control plane on %s (etcd, kube-apiserver and kube-controller-manager %s) with KWOK", APIHost, From)
	if e.Cluster, err = simcluster.Start(ctx, simcluster.Options{Dir: filepath.Join(o.Dir, "cluster"), KubeBin: oldBin, Host: APIHost,
		RestartDelay: o.RestartDelay, RestartJitter: o.RestartJitter, LeaseDuration: o.LeaseDuration, Log: o.Log}); err != nil {
		return nil, err
	}
	e.closers = append(e.closers, e.Cluster.Stop)

	e.Nodes = append(e.Nodes, fleet.NodeSpec{Name: "cp-1", Address: APIHost, ControlPlane: true, KubeletVersion: From})
	for i := 0; i < o.Workers; i++ {
		e.Nodes = append(e.Nodes, fleet.NodeSpec{Name: fmt.Sprintf("worker-%04d", i+1), Address: WorkerAddress(i), KubeletVersion: From})
	}
	bins := map[string]fleet.Binary{}
	for name, sum := range e.Files {
		bins[sum] = fleet.Binary{Component: name, Version: To}
	}
	o.Log("an SSH fleet of %d nodes", len(e.Nodes))
	if e.Fleet, err = fleet.Start(ctx, fleet.Config{Dir: filepath.Join(o.Dir, "fleet"), Client: e.Cluster.Client, Binaries: bins, Log: o.Log}, e.Nodes); err != nil {
		return nil, err
	}
	e.closers = append(e.closers, e.Fleet.Close)
	var nodes []simcluster.Node
	for _, n := range e.Nodes {
		nodes = append(nodes, simcluster.Node{Name: n.Name, Address: n.Address, ControlPlane: n.ControlPlane, KubeletVersion: n.KubeletVersion})
	}
	o.Log("%d Nodes for KWOK", len(nodes))
	if err := e.Cluster.AddNodes(ctx, nodes); err != nil {
		return nil, err
	}
	if o.PodsPerNode > 0 {
		o.Log("%d pods", o.PodsPerNode*o.Workers)
		if err := e.Cluster.AddPods(ctx, o.PodsPerNode, o.NoTolerationsEvery); err != nil {
			return nil, err
		}
	}
	o.Log("importing the bundle")
	if r := e.Upgrade(ctx, e.Registry.Password+"\n", append([]string{"import", e.Bundle, "--key", e.Key, "--domain", e.Registry.Host, "--namespace", "library", "-q",
		"--kubeconfig", e.Cluster.Kubeconfig}, e.RegistryFlags()...)...); r.Err != nil {
		return nil, r.Err
	}
	o.Log("simulation up in %s", time.Since(start).Round(time.Second))
	return e, nil
}

// Close stops every process and server it started.
func (e *Env) Close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
	e.closers = nil
}

func (e *Env) buildPrograms() error {
	var err error
	e.Bin, err = programs.Dir(e.Bin)
	return err
}

func hashSkipKubelet(ctx context.Context) (string, error) {
	return kube.HashSkipKubelet(ctx, To)
}

// makeBundle makes the signed bundle outside the air gap: a source
// registry seeded with the release's images and a file server with the
// real builds (stand-ins for the files the simulation does not build, as
// the sandbox does), then bundle create with kubelift's hash-skip kubelet.
func (e *Env) makeBundle(ctx context.Context, newBin, hashSkip string, withAgent bool) error {
	cat, err := catalog.Default()
	if err != nil {
		return err
	}
	rel, err := cat.Lookup(To)
	if err != nil {
		return err
	}
	src, err := internet.StartRegistry(ctx, filepath.Join(e.Dir, "source-registry"), internet.RegistryOptions{})
	if err != nil {
		return err
	}
	defer src.Stop()
	if _, err := internet.Seed(ctx, src.Backend, internet.ReleaseRepos(rel), internet.ImageShape{BaseBytes: 64 << 10, UniqueBytes: 16 << 10}); err != nil {
		return err
	}
	files, err := internet.StartFileServer()
	if err != nil {
		return err
	}
	defer files.Close()
	flags := []string{"--registry-mirror", "registry.k8s.io=" + src.Host, "--insecure-registry", src.Host}
	hosts := map[string]bool{}
	for _, f := range rel.Files {
		u := f.URLFor("amd64")
		content, err := os.ReadFile(filepath.Join(newBin, f.Name))
		if errors.Is(err, os.ErrNotExist) {
			content, err = []byte(fmt.Sprintf("kubelift scale stand-in for %s %s (%s)\n", f.Name, To, u)), nil
		}
		if err != nil {
			return err
		}
		files.Add(u, content)
		if pu, err := url.Parse(u); err == nil && !hosts[pu.Host] {
			hosts[pu.Host] = true
			flags = append(flags, "--url-mirror", files.Mirror(pu.Host))
		}
	}
	prefix := filepath.Join(e.Dir, "team")
	if r := e.run(ctx, "", filepath.Join(e.Bin, "bundle"), "keygen", "--out", prefix); r.Err != nil {
		return r.Err
	}
	e.Key, e.Bundle = prefix+".pub", filepath.Join(e.Dir, "k8s-"+To+".tar")
	args := append([]string{"create", "--kubernetes-version", To, "--sign-key", prefix + ".key", "-o", e.Bundle, "--cache-dir", filepath.Join(e.Dir, "bundle-cache"),
		"-q", "--kubelet-binary", hashSkip}, flags...)
	if withAgent {
		args = append(args, "--agent", filepath.Join(e.Bin, "upgrade"))
	}
	if r := e.run(ctx, "", filepath.Join(e.Bin, "bundle"), args...); r.Err != nil {
		return r.Err
	}
	r := e.run(ctx, "", filepath.Join(e.Bin, "bundle"), "inspect", "-o", "json", e.Bundle)
	if r.Err != nil {
		return r.Err
	}
	var m struct {
		Files []struct{ Name, SHA256, Arch string }
	}
	if err := json.Unmarshal([]byte(r.Stdout), &m); err != nil {
		return fmt.Errorf("bundle inspect: %w", err)
	}
	e.Files = map[string]string{}
	for _, f := range m.Files {
		if f.Arch == "" || f.Arch == "amd64" {
			e.Files[f.Name] = f.SHA256
		}
	}
	return nil
}

// RegistryFlags are the private registry's credentials flags (the password
// goes on stdin).
func (e *Env) RegistryFlags() []string {
	return []string{"--username", e.Registry.User, "--password-stdin", "--ca-file", e.Registry.CAFile}
}

// NodeFlags reach the cluster and the fleet. The fleet's nodes play a
// gzip stream from a file's first byte, and nothing else (test/env/fleet,
// playStage), so the codec is gzip: --codec auto would first send a
// probe as it is (the unit tests and make bench cover that, on real
// shells and real sshd).
func (e *Env) NodeFlags() []string {
	return []string{"--kubeconfig", e.Cluster.Kubeconfig, "--inventory", e.Fleet.Inventory(), "--known-hosts", e.Fleet.KnownHosts(), "--ssh-key", e.Fleet.Key(),
		"--codec", "gzip"}
}

// ApplyArgs is upgrade apply to To with every flag the simulation needs.
func (e *Env) ApplyArgs(extra ...string) []string {
	args := append([]string{"apply", "--to", To, "--key", e.Key}, e.RegistryFlags()...)
	return append(append(args, e.NodeFlags()...), extra...)
}

// AgentArgs is upgrade CMD to To in agent mode: no inventory, no SSH
// key, the nodes reached through their agents (ServeAgents).
func (e *Env) AgentArgs(cmd string, extra ...string) []string {
	args := append([]string{cmd, "--to", To, "--key", e.Key, "--kubeconfig", e.Cluster.Kubeconfig, "--via", "agent"}, e.RegistryFlags()...)
	return append(args, extra...)
}

// AgentUserAgent is the user agent of the fleet's agents' requests.
const AgentUserAgent = "fleet-agent"

// ServeAgents starts kubelift's agent loop for every node (the fleet's
// ServeAgents), through one client with the request budget of as many
// agents (none: each real agent has its own); stop ends them.
func (e *Env) ServeAgents(ctx context.Context) (stop func(), err error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", e.Cluster.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.UserAgent = -1, AgentUserAgent
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return e.Fleet.ServeAgents(ctx, c, slog.New(slog.DiscardHandler)), nil
}

// PreStage places To's files, as staging would, on every node but the
// first sample ones: a benchmark stages a sample for real and the rest
// this way.
func (e *Env) PreStage(sample int) error {
	for i, n := range e.Nodes {
		if i < sample {
			continue
		}
		files := map[string]string{}
		for _, name := range release.FilesFor(role(n)) {
			if sum, ok := e.Files[name]; ok {
				files[name] = sum
			}
		}
		if err := e.Fleet.PreStage(n.Name, release.DefaultStageDir, To, files); err != nil {
			return err
		}
	}
	return nil
}

func role(n fleet.NodeSpec) string {
	if n.ControlPlane {
		return release.RoleControlPlane
	}
	return release.RoleWorker
}

// Result is one program run.
type Result struct {
	Stdout, Stderr string
	Code           int
	Wall           time.Duration
	// MaxRSS (KiB) and CPU (user+system) of the program.
	MaxRSS int64
	CPU    time.Duration
	Err    error // set when the program failed or could not run
}

// Upgrade runs the upgrade program with stdin.
func (e *Env) Upgrade(ctx context.Context, stdin string, args ...string) Result {
	return e.run(ctx, stdin, filepath.Join(e.Bin, "upgrade"), args...)
}

// run runs a program under GNU time, for its peak RSS and CPU: the
// rusage of a child Go starts also counts the parent's memory before the
// exec (Linux keeps the old mm's high-water mark), so it is not used.
func (e *Env) run(ctx context.Context, stdin, name string, args ...string) Result {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Hour)
	defer cancel()
	usage, err := os.CreateTemp(e.Dir, "usage-")
	if err != nil {
		return Result{Err: err}
	}
	usage.Close()
	defer os.Remove(usage.Name())
	cmd := exec.CommandContext(ctx, "/usr/bin/time", append([]string{"-q", "-f", "%M %U %S", "-o", usage.Name(), name}, args...)...)
	// Its own process group, killed whole on a timeout: GNU time and the
	// program under it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// Its cache in the run's directory: the default, ~/.cache/kubelift,
	// got a simulated etcd snapshot's copy from every run.
	cmd.Env = append(os.Environ(), cli.CacheDirEnv+"="+filepath.Join(e.Dir, "cache"))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Stdin = &out, &errb, strings.NewReader(stdin)
	start := time.Now()
	err = cmd.Run()
	r := Result{Stdout: out.String(), Stderr: errb.String(), Wall: time.Since(start)}
	if cmd.ProcessState != nil {
		r.Code = cmd.ProcessState.ExitCode()
	}
	if b, rerr := os.ReadFile(usage.Name()); rerr == nil {
		var user, sys float64
		if _, serr := fmt.Sscanf(strings.TrimSpace(lastLines(string(b), 1)), "%d %f %f", &r.MaxRSS, &user, &sys); serr == nil {
			r.CPU = time.Duration((user + sys) * float64(time.Second))
		}
	}
	if err != nil {
		r.Err = fmt.Errorf("%s %s: %w\nstdout: %s\nstderr: %s", filepath.Base(name), strings.Join(args, " "), err, lastLines(r.Stdout, 20), lastLines(r.Stderr, 40))
	}
	return r
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
