package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/test/env/images"
	"github.com/kubelift/kubelift/test/env/programs"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

// One sandbox for the package: 1 control plane and 4 workers, each test
// on a worker of its own. Its names and subnet differ from make
// sandbox-up's, so both can run at once.
var (
	sb     *sandbox.State
	client kubernetes.Interface
	cfg    sandbox.Config
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(interruptChildEnv); dir != "" {
		interruptChild(dir)
		return
	}
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	tmp, err := os.MkdirTemp("", "kubelift-sandbox-test-")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(tmp)
	bin, err := programs.Dir(filepath.Join(tmp, "bin"))
	if err != nil {
		return 1, err
	}
	tool := filepath.Join(bin, "kubelift-sandbox")
	// The machines share the host's root file system below their own
	// directories: nothing they do may change what is at the top of it.
	rootBefore, err := topLevel()
	if err != nil {
		return 1, err
	}
	existed := runtimeDirs()
	cfg = sandbox.Config{Dir: filepath.Join(tmp, "sandbox"), Name: fmt.Sprintf("klt%d", os.Getpid()%1000), Subnet: "10.78.0",
		Workers: 4, Tool: tool, Workloads: true,
		Log: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "sandbox: "+format+"\n", args...) }}
	cfg.Defaults()
	teardown := sandbox.DownOnInterrupt(cfg.Dir, cfg.Log)
	sb, err = sandbox.Up(teardown.Ctx, cfg)
	if err != nil {
		_ = teardown.Down()
		return 1, err
	}
	if client, err = sb.Client(); err != nil {
		_ = teardown.Down()
		return 1, err
	}
	// The machines' mount namespaces, where containerd's shims run: after
	// Down no process may be left in one. Each is held open until that is
	// checked: a freed namespace's number goes to the next one made (a
	// container in a story's sandbox beside this one), and the landing
	// run of stop 62 took such a shopd for one left in cp-1's.
	mountNS := map[string]string{}
	for _, mc := range sb.Nodes() {
		path := fmt.Sprintf("/proc/%d/ns/mnt", mc.Pid)
		f, err := os.Open(path)
		if err != nil {
			_ = teardown.Down()
			return 1, fmt.Errorf("hold %s's mount namespace: %w", mc.Name, err)
		}
		defer f.Close()
		ns, err := os.Readlink(path)
		if err != nil {
			_ = teardown.Down()
			return 1, fmt.Errorf("read %s's mount namespace: %w", mc.Name, err)
		}
		mountNS[ns] = mc.Name
	}
	code := m.Run()
	state := *sb
	if err := teardown.Down(); err != nil {
		return 1, err
	}
	// Down leaves nothing behind: no process, no namespace, no directory.
	for _, mc := range state.Machines {
		if syscall.Kill(mc.Pid, 0) == nil {
			return 1, fmt.Errorf("after Down, init of %s (pid %d) still runs", mc.Name, mc.Pid)
		}
		if _, err := os.Stat("/run/netns/" + mc.NetNS); err == nil {
			return 1, fmt.Errorf("after Down, namespace %s still exists", mc.NetNS)
		}
	}
	if _, err := os.Stat(cfg.Dir); err == nil {
		return 1, fmt.Errorf("after Down, %s still exists", cfg.Dir)
	}
	if err := hostClean(cfg, mountNS, existed); err != nil {
		return 1, err
	}
	rootAfter, err := topLevel()
	if err != nil {
		return 1, err
	}
	if rootAfter != rootBefore {
		return 1, fmt.Errorf("the host's / changed while the sandbox ran:\nbefore %s\nafter  %s", rootBefore, rootAfter)
	}
	return code, nil
}

// hostClean checks that the real runtime left nothing on the host: no
// process in a machine's mount namespace (shims), no cgroup of the
// sandbox's (containers), no mount of its directory or of containerd's.
func hostClean(cfg sandbox.Config, mountNS map[string]string, existed map[string]bool) error {
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/mnt")
	for _, p := range procs {
		if ns, err := os.Readlink(p); err == nil && mountNS[ns] != "" {
			cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(p)), "cmdline"))
			return fmt.Errorf("after Down, %s (%s) still runs in %s's mount namespace", filepath.Dir(filepath.Dir(p)), strings.ReplaceAll(string(cmdline), "\x00", " "), mountNS[ns])
		}
	}
	if left := sandbox.CgroupDirs(cfg.Name); len(left) > 0 {
		return fmt.Errorf("after Down, cgroups left: %v", left)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, cfg.Dir) || strings.Contains(line, "/run/containerd") || strings.Contains(line, "/var/lib/containerd") {
			return fmt.Errorf("after Down, the host has a mount: %s", line)
		}
	}
	for d, was := range runtimeDirs() {
		if was != existed[d] {
			return fmt.Errorf("after Down, the host's %s exists: %v, before the sandbox: %v", d, was, existed[d])
		}
	}
	return nil
}

// runtimeDirs says which of the host's container runtime paths exist.
func runtimeDirs() map[string]bool {
	out := map[string]bool{}
	for _, d := range []string{"/run/containerd", "/var/lib/containerd", "/etc/containerd", "/etc/cni", "/var/lib/cni", "/opt/cni"} {
		_, err := os.Stat(d)
		out[d] = err == nil
	}
	return out
}

// topLevel lists the entries of the host's / with their types.
func topLevel() (string, error) {
	entries, err := os.ReadDir("/")
	if err != nil {
		return "", err
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name()+":"+e.Type().String())
	}
	return strings.Join(out, " "), nil
}

func node(t *testing.T, name string) sandbox.Machine {
	t.Helper()
	m, err := sb.Machine(name)
	if err != nil {
		t.Fatal(err)
	}
	return *m
}

// ssh runs a command on node over SSH (strict host key checking) and
// returns its output; stdin may be nil. A failure fails the test.
func ssh(t *testing.T, nodeName, command string, stdin io.Reader) string {
	t.Helper()
	out, errOut, err := sshRun(nodeName, command, stdin)
	if err != nil {
		t.Fatalf("ssh %s %q: %v\n%s%s", nodeName, command, err, out, errOut)
	}
	return out
}

// sshOutput runs a command on a node over SSH and returns its standard
// output and error (a non-zero exit is an error).
func sshOutput(nodeName, command string) (string, error) {
	out, _, err := sshRun(nodeName, command, nil)
	return out, err
}

func sshRun(nodeName, command string, stdin io.Reader) (stdout, stderr string, err error) {
	c, err := sb.SSH(context.Background(), nodeName)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		return "", "", err
	}
	defer sess.Close()
	var out, errb bytes.Buffer
	sess.Stdout, sess.Stderr, sess.Stdin = &out, &errb, stdin
	err = sess.Run(command)
	return out.String(), errb.String(), err
}

// waitFor polls cond (bounded: 3 minutes), failing with what describe says.
func waitFor(t *testing.T, what string, cond func() (bool, error), describe ...func() string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			var more string
			for _, d := range describe {
				more += "\n" + d()
			}
			t.Fatalf("gave up waiting for %s%s", what, more)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func kubeletLog(m sandbox.Machine) func() string {
	return func() string { return "kubelet log tail:\n" + sb.UnitLog(m, "kubelet", 3000) }
}

func TestNodesReadyAtOldVersion(t *testing.T) {
	nodes, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 5 {
		t.Fatalf("%d nodes, want 5", len(nodes.Items))
	}
	for _, n := range nodes.Items {
		if !sandbox.NodeReady(&n) {
			t.Errorf("%s not Ready", n.Name)
		}
		if n.Status.NodeInfo.KubeletVersion != cfg.OldVersion {
			t.Errorf("%s kubelet %s, want %s", n.Name, n.Status.NodeInfo.KubeletVersion, cfg.OldVersion)
		}
		m := node(t, n.Name)
		if len(n.Status.Addresses) == 0 || n.Status.Addresses[0].Address != m.Address {
			t.Errorf("%s addresses %v, want %s", n.Name, n.Status.Addresses, m.Address)
		}
	}
	v, err := client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != cfg.OldVersion {
		t.Errorf("kube-apiserver %s, want %s", v.GitVersion, cfg.OldVersion)
	}
	// The controller manager and scheduler run the old version too.
	cp := node(t, "cp-1")
	for _, c := range []string{"kube-controller-manager", "kube-scheduler"} {
		out := ssh(t, "cp-1", "/usr/local/bin/"+c+" --version; systemctl is-active "+c, nil)
		if !strings.Contains(out, "Kubernetes "+cfg.OldVersion) || !strings.Contains(out, "\nactive") {
			t.Errorf("%s on %s: %q", c, cp.Name, out)
		}
	}
}

func TestUpIsIdempotent(t *testing.T) {
	again, err := sandbox.Up(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range again.Machines {
		if m.Pid != sb.Machines[i].Pid {
			t.Errorf("%s rebooted by a second Up: pid %d, was %d", m.Name, m.Pid, sb.Machines[i].Pid)
		}
	}
	// kubelift-sandbox status -o json says the same.
	out, err := exec.Command(cfg.Tool, "status", "--dir", cfg.Dir, "-o", "json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Complete bool
		Machines []struct {
			Name  string
			Pid   int
			State string
		}
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, out)
	}
	if !st.Complete || len(st.Machines) != len(sb.Machines) {
		t.Fatalf("status: %s", out)
	}
	for i, m := range st.Machines {
		if m.Name != sb.Machines[i].Name || m.Pid != sb.Machines[i].Pid || m.State != "running" {
			t.Errorf("status machine %d: %+v", i, m)
		}
	}
}

// Every node answers ssh with the sandbox's key only after its host key
// matched known_hosts; a node presenting another key is refused.
func TestSSHStrictHostKeyChecking(t *testing.T) {
	for _, m := range sb.Nodes() {
		if got := strings.TrimSpace(ssh(t, m.Name, "hostname; systemctl is-active kubelet containerd", nil)); got != m.Name+"\nactive\nactive" {
			t.Errorf("ssh %s: %q", m.Name, got)
		}
	}
	// OpenSSH's client, from the admin machine, with strict checking.
	w1 := node(t, "worker-1")
	openssh := func(knownHosts string) ([]byte, error) {
		return sb.NetNS().Command("ssh", "-i", filepath.Join(sb.Dir, "ssh", "id_ed25519"),
			"-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "UserKnownHostsFile="+knownHosts,
			"root@"+w1.Address, "cat /etc/kubernetes/kubelet.conf | grep -c system:node:worker-1").CombinedOutput()
	}
	out, err := openssh(filepath.Join(sb.Dir, "ssh", "known_hosts"))
	if err != nil || strings.TrimSpace(string(out)) == "0" {
		t.Errorf("OpenSSH to worker-1: %v: %s", err, out)
	}
	// worker-1's address with worker-2's host key pinned: refused.
	known, err := os.ReadFile(filepath.Join(sb.Dir, "ssh", "known_hosts"))
	if err != nil {
		t.Fatal(err)
	}
	var forged string
	for _, line := range strings.Split(string(known), "\n") {
		if strings.HasPrefix(line, "worker-2,") {
			forged = w1.Address + " " + strings.SplitN(line, " ", 2)[1] + "\n"
		}
	}
	bad := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(bad, []byte(forged), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = openssh(bad)
	if err == nil || !strings.Contains(string(out), "HOST IDENTIFICATION HAS CHANGED") {
		t.Errorf("a node with an unexpected host key was accepted: %v: %s", err, out)
	}
}

// The sandbox's workloads give the engine's checks real work.
func TestWorkloads(t *testing.T) {
	ctx := context.Background()
	pods, err := client.CoreV1().Pods(sandbox.WorkloadNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	var without, with, mismatched int
	for _, p := range pods.Items {
		if len(p.OwnerReferences) > 0 {
			kinds[p.OwnerReferences[0].Kind] = true
		} else {
			kinds["bare"] = true
		}
		tolerates := 0
		for _, tol := range p.Spec.Tolerations {
			if tol.Effect == corev1.TaintEffectNoExecute && (tol.Key == corev1.TaintNodeNotReady || tol.Key == corev1.TaintNodeUnreachable) {
				tolerates++
			}
		}
		switch tolerates {
		case 0:
			without++
		case 2:
			with++
		}
		if len(p.Spec.NodeSelector) > 0 {
			n := getNode(t, p.Spec.NodeName)
			for k, v := range p.Spec.NodeSelector {
				if n.Labels[k] != v {
					mismatched++
				}
			}
		}
	}
	for _, k := range []string{"ReplicaSet", "DaemonSet", "bare"} {
		if !kinds[k] {
			t.Errorf("no %s pods in %s", k, sandbox.WorkloadNamespace)
		}
	}
	if without == 0 || with == 0 || mismatched != 1 {
		t.Errorf("pods without the NoExecute tolerations %d, with %d, nodeSelector mismatches %d (want >0, >0, 1)", without, with, mismatched)
	}
}

// The stand-in internet serves the new version's images and files (the
// kubelet is the real build, with its checksum beside it) and has no route
// into the air gap; the admin machine has none out to it.
func TestInternetOutsideTheAirGap(t *testing.T) {
	inet := node(t, "internet")
	get := func(args ...string) string {
		out, err := sb.Command(inet, "curl", append([]string{"-sf", "-m", "5"}, args...)...).Output()
		if err != nil {
			t.Fatalf("curl %s in the internet namespace: %v", args, err)
		}
		return string(out)
	}
	if cat := get("http://" + sb.Internet.Registry + "/v2/_catalog"); !strings.Contains(cat, `"kube-apiserver"`) || !strings.Contains(cat, `"coredns/coredns"`) {
		t.Errorf("source registry catalog: %s", cat)
	}
	sum := get(sb.Internet.Files + "/dl.k8s.io/release/" + cfg.NewVersion + "/bin/linux/amd64/kubelet.sha256")
	want, err := exec.Command("sha256sum", filepath.Join(sb.Binaries.New, "kubelet")).Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Fields(sum)[0] != strings.Fields(string(want))[0] {
		t.Errorf("kubelet.sha256 %q, built kubelet %q", sum, want)
	}
	// pause is the real one (a bundle carries it into the air gap, and
	// pods started after the import run it): its amd64 image runs /pause.
	var index struct {
		Manifests []struct {
			Digest   string
			Platform struct{ Architecture string }
		}
	}
	accept := "application/vnd.docker.distribution.manifest.list.v2+json,application/vnd.oci.image.index.v1+json"
	if err := json.Unmarshal([]byte(get("-H", "Accept: "+accept, "http://"+sb.Internet.Registry+"/v2/pause/manifests/"+images.PauseTag)), &index); err != nil || len(index.Manifests) == 0 {
		t.Fatalf("pause:%s in the source registry: not an index (%v)", images.PauseTag, err)
	}
	var manifest struct{ Config struct{ Digest string } }
	if err := json.Unmarshal([]byte(get("-H", "Accept: application/vnd.docker.distribution.manifest.v2+json,application/vnd.oci.image.manifest.v1+json",
		"http://"+sb.Internet.Registry+"/v2/pause/manifests/"+index.Manifests[0].Digest)), &manifest); err != nil {
		t.Fatal(err)
	}
	if config := get("http://" + sb.Internet.Registry + "/v2/pause/blobs/" + manifest.Config.Digest); index.Manifests[0].Platform.Architecture != "amd64" || !strings.Contains(config, `"Entrypoint":["/pause"]`) {
		t.Errorf("pause:%s in the source registry (%s) is not the real pause: %.300s", images.PauseTag, index.Manifests[0].Platform.Architecture, config)
	}
	if out, err := sb.Command(inet, "curl", "-s", "-m", "3", "-k", "https://"+sb.Registry.Address+"/v2/").CombinedOutput(); err == nil {
		t.Errorf("the internet reached the private registry: %s", out)
	}
	if out, err := sb.NetNS().Command("curl", "-s", "-m", "3", "http://"+sb.Internet.Registry+"/v2/").CombinedOutput(); err == nil {
		t.Errorf("the admin machine reached the internet's registry: %s", out)
	}
}

// A second sandbox under a name in use is refused before it touches
// anything, and taking it down leaves the first one alone.
func TestSameNameRefused(t *testing.T) {
	ctx := context.Background()
	other := cfg
	other.Dir = filepath.Join(t.TempDir(), "other")
	other.Subnet = "10.80.0"
	w := node(t, "worker-1")
	onW, err := client.CoreV1().Pods(sandbox.WorkloadNamespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + w.Name})
	if err != nil {
		t.Fatal(err)
	}
	var pods []string
	for _, p := range onW.Items {
		pods = append(pods, p.Name)
	}
	before := runningContainers(t, w, pods)
	_, err = sandbox.Up(ctx, other)
	if err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Fatalf("Up under a used name: %v", err)
	}
	if err := sandbox.Down(ctx, other.Dir, nil); err != nil {
		t.Fatal(err)
	}
	for _, m := range sb.Machines {
		if _, err := os.Stat("/run/netns/" + m.NetNS); err != nil {
			t.Errorf("Down of the refused sandbox removed %s: %v", m.NetNS, err)
		}
		if syscall.Kill(m.Pid, 0) != nil {
			t.Errorf("Down of the refused sandbox stopped %s", m.Name)
		}
	}
	if n := getNode(t, "worker-1"); !sandbox.NodeReady(n) {
		t.Error("worker-1 not Ready after the refused sandbox went down")
	}
	// Its cgroups are the first one's too, by name: they stay, and so do
	// the processes in them.
	if after := runningContainers(t, w, pods); after != before || before == "" {
		t.Errorf("Down of the refused sandbox touched the first one's containers on %s:\nbefore %s\nafter  %s", w.Name, before, after)
	}
}

// extraSandbox brings up a second sandbox, without workloads, for one
// test (its name is the package sandbox's plus suffix) and takes it down
// when the test ends.
func extraSandbox(t *testing.T, suffix, subnet string, controlPlanes, workers int) (sandbox.Config, *sandbox.State) {
	t.Helper()
	c := cfg
	c.Dir = filepath.Join(t.TempDir(), "sandbox-"+suffix)
	c.Name, c.Subnet = cfg.Name+suffix, subnet
	c.ControlPlanes, c.Workers, c.Workloads = controlPlanes, workers, false
	s, err := sandbox.Up(context.Background(), c)
	t.Cleanup(func() {
		if err := sandbox.Down(context.Background(), c.Dir, nil); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

// Three control planes: one etcd, an API server on each, and the
// controller manager and scheduler elect leaders.
func TestHAControlPlanes(t *testing.T) {
	ctx := context.Background()
	_, s := extraSandbox(t, "h", "10.79.0", 3, 1)
	rc, err := s.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range s.Nodes() {
		if m.Role != "control-plane" {
			continue
		}
		c := *rc
		c.Host = "https://" + m.Address + ":6443"
		cs, err := kubernetes.NewForConfig(&c)
		if err != nil {
			t.Fatal(err)
		}
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("API server on %s: %v", m.Name, err)
		}
		if len(nodes.Items) != 4 {
			t.Errorf("API server on %s lists %d nodes, want 4", m.Name, len(nodes.Items))
		}
	}
	cs, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	for _, lease := range []string{"kube-controller-manager", "kube-scheduler"} {
		waitFor(t, lease+" leader", func() (bool, error) {
			l, err := cs.CoordinationV1().Leases("kube-system").Get(ctx, lease, metav1.GetOptions{})
			return err == nil && l.Spec.HolderIdentity != nil && strings.HasPrefix(*l.Spec.HolderIdentity, "cp-"), nil
		})
	}
}

// A sandbox with a dead machine is not "up": Up takes the rest down (the
// dead init's orphaned services too, by their pid files) and brings a
// fresh one up.
func TestUpRecoversFromDeadMachine(t *testing.T) {
	ctx := context.Background()
	small, s := extraSandbox(t, "s", "10.81.0", 1, 0)
	inet, err := s.Machine("internet")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(inet.Root, "run/kubelift-units/source-registry.service.pid"))
	if err != nil {
		t.Fatal(err)
	}
	var orphan int
	if _, err := fmt.Sscan(string(data), &orphan); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(inet.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the internet's init gone", func() (bool, error) { return !sandbox.Running(inet.Pid), nil })
	if !sandbox.Running(orphan) {
		t.Fatalf("the source registry (pid %d) died with its init; the test needs an orphan", orphan)
	}
	again, err := sandbox.Up(ctx, small)
	if err != nil {
		t.Fatal(err)
	}
	if sandbox.Running(orphan) {
		t.Errorf("the orphaned source registry (pid %d) still runs", orphan)
	}
	for i, m := range again.Machines {
		if m.Pid == s.Machines[i].Pid || !sandbox.Running(m.Pid) {
			t.Errorf("%s: init pid %d (was %d), want a new, running one", m.Name, m.Pid, s.Machines[i].Pid)
		}
	}
}
