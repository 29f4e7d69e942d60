// Package apply tests upgrade apply end to end on a sandbox of its own (1
// control plane, 3 workers at v1.30.14, on containerd 1.7): the lock, the
// refusal of a blocked plan, a kubelet that never becomes Ready rolled
// back with its node's containerd, resume, and the whole upgrade to
// v1.31.4 with the node stack in the bundle (every node on containerd
// 2.x after) with no container restarted and no task's PID changed but
// the static pod's, which the plan predicts and apply checks runs again,
// and CoreDNS's, which apply rolls from v1.11.1 to v1.11.3 while pods on
// every worker resolve a Service's name.
package apply

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/compat"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/report/reporttest"
	"github.com/kubelift/kubelift/internal/upgradelock"
	"github.com/kubelift/kubelift/test/env/harness"
	"github.com/kubelift/kubelift/test/env/kube"
	"github.com/kubelift/kubelift/test/env/prober"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

var h *harness.Harness

func TestMain(m *testing.M) {
	harness.Main(m, "kla", "10.84.0", 1, 3, func(x *harness.Harness) {
		h = x
	}, harness.StaticPod(), harness.OldRuntime(kube.Containerd17), harness.CoreDNS(oldCoreDNS))
}

// oldCoreDNS is the CoreDNS the sandbox runs, as the binary installer of
// v1.29 deployed it (never moved since); the bundle for v1.31.4 carries
// v1.11.3, and apply moves it.
const oldCoreDNS = "v1.11.1"

// staticPod is the sandbox's mirror pod of the static pod on worker-3.
func staticPod(t *testing.T) *corev1.Pod {
	t.Helper()
	ns, name, _ := strings.Cut(h.SB.StaticPod, "/")
	p, err := h.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("static pod %s: %v", h.SB.StaticPod, err)
	}
	return p
}

var staticBefore *corev1.Pod

// apply runs upgrade apply with the sandbox's registry and SSH flags.
func apply(t *testing.T, extra ...string) harness.Result {
	t.Helper()
	reg, pw := h.RegistryFlags()
	args := append(append([]string{"apply", "--to", h.SB.NewVersion, "--key", h.Key(), "--settle", "5s"}, reg...), h.SSHFlags()...)
	return h.Upgrade(t, pw, append(args, extra...)...)
}

func apiserverVersion(t *testing.T) string {
	v, err := h.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	return v.GitVersion
}

func node(t *testing.T, name string) *corev1.Node {
	n, err := h.Client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// containers maps every node to its running containers, over SSH.
func containers(t *testing.T) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, m := range h.SB.Nodes() {
		out[m.Name] = h.Running(t, m.Name)
	}
	return out
}

// tasks maps every node to its containerd tasks' PIDs, over SSH.
func tasks(t *testing.T) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, m := range h.SB.Nodes() {
		out[m.Name] = h.Tasks(t, m.Name)
	}
	return out
}

// The containers and tasks before the first apply, and the workloads'
// pods' addresses (by UID).
var (
	before      map[string]map[string]string
	beforeTasks map[string]map[string]int
	beforeIPs   map[string]string
)

// podIPs maps every workload pod with an address of its own (not the
// node's) to it, by UID.
func podIPs(t *testing.T) map[string]string {
	pods, err := h.Client.CoreV1().Pods(sandbox.WorkloadNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ips := map[string]string{}
	for _, p := range pods.Items {
		if !p.Spec.HostNetwork && p.Status.PodIP != "" {
			ips[string(p.UID)] = p.Namespace + "/" + p.Name + " " + p.Status.PodIP
		}
	}
	return ips
}

// bridgeOn is what node's CNI bridge plugin says of its version, over
// SSH ("CNI bridge plugin v1.5.1", on stderr; Debian's, which the
// sandbox's nodes start with, says "version unknown", on stdout).
func bridgeOn(t *testing.T, node string) string {
	out := h.SSH(t, node, "/opt/cni/bin/bridge --version 2>&1")
	first, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	return first
}

// bundledBridge is what the bundle's bridge plugin says: the CNI plugins
// the sandbox built at the catalog's version (its cache directory's name).
func bundledBridge() string { return "CNI bridge plugin " + filepath.Base(h.SB.Binaries.CNI) }

// runtimeOf is the runtime node reports (containerd://VERSION).
func runtimeOf(t *testing.T, name string) string {
	return node(t, name).Status.NodeInfo.ContainerRuntimeVersion
}

// The runtime the nodes start on, and the one the node stack moves them to.
var (
	oldRuntime = "containerd://" + strings.TrimPrefix(kube.Containerd17, "v")
	newRuntime = "containerd://" + strings.TrimPrefix(kube.ContainerdVersion, "v")
)

// probe measures availability from the first test on (startProbe) to the
// end of the complete upgrade, where it must have seen nothing fail.
var (
	probe     *prober.Prober
	probeOnce sync.Once
)

// startProbe starts the prober once: requests and held connections to
// the Service shop/api from every worker and to every shop pod, and
// lookups of the Service's name by a pod on every worker (through the
// cluster's DNS: CoreDNS, which apply moves).
func startProbe(t *testing.T) {
	t.Helper()
	probeOnce.Do(func() {
		targets, err := h.SB.ProbeTargets(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		dns, err := h.SB.DNSProbeTargets(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, dns...)
		if probe, err = prober.Start(context.Background(), prober.Config{Targets: targets, Rate: 10, Streams: 1}); err != nil {
			t.Fatal(err)
		}
	})
	if probe == nil {
		t.Fatal("the prober did not start")
	}
}

// A live lease of another holder (one that renews it while apply
// watches) refuses apply, naming it; nothing changes.
func TestApplyRefusedWhileAnotherHolds(t *testing.T) {
	h.Import(t, h.HashSkipBundle)
	before, beforeTasks, beforeIPs = containers(t), tasks(t), podIPs(t)
	for _, m := range h.SB.Nodes() {
		if rt := runtimeOf(t, m.Name); rt != oldRuntime {
			t.Fatalf("%s runs %s before the upgrade, want %s", m.Name, rt, oldRuntime)
		}
		if b := bridgeOn(t, m.Name); b == bundledBridge() {
			t.Fatalf("%s's CNI plugins are the bundle's before the upgrade (%s): the tools move would be moot", m.Name, b)
		}
	}
	staticBefore = staticPod(t)
	startProbe(t)
	ctx, cancel := context.WithCancel(context.Background())
	holder, secs, now := "admin-2_4242", int32(600), metav1.NewMicroTime(time.Now())
	leases := h.Client.CoordinationV1().Leases("kube-system")
	if _, err := leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: upgradelock.Name, Namespace: "kube-system"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &now}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	renewing := make(chan struct{})
	go func() { // the other holder, alive: renews every second until the test is done with it
		defer close(renewing)
		for ctx.Err() == nil {
			if l, err := leases.Get(ctx, upgradelock.Name, metav1.GetOptions{}); err == nil {
				now := metav1.NewMicroTime(time.Now())
				l.Spec.RenewTime = &now
				_, _ = leases.Update(ctx, l, metav1.UpdateOptions{})
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	r := apply(t, "--restore-labels")
	cancel()
	<-renewing
	if r.Code != 1 || !strings.Contains(r.Stderr, "held by admin-2_4242") {
		t.Errorf("apply while another holds the lease: exit %d\n%s", r.Code, r.Stderr)
	}
	if err := leases.Delete(context.Background(), upgradelock.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if v := apiserverVersion(t); v != h.SB.OldVersion {
		t.Errorf("the API server runs %s after a refused apply", v)
	}
}

// The team's own images travel as a user's do: in the bundle (--image,
// from where its CI publishes them), imported into REGISTRY/library/ by
// the first test; the bundle holds the very image the shop's pods run
// (their imageID names the private registry and the bundle's digest).
func TestUserImagesTravelInTheBundle(t *testing.T) {
	r := h.Upgrade(t, "", "inspect", "-o", "json", h.HashSkipBundle)
	var m struct {
		Images []struct{ Ref, Digest string }
	}
	if err := json.Unmarshal([]byte(r.Stdout), &m); err != nil || r.Code != 0 {
		t.Fatalf("inspect: exit %d %v\n%s", r.Code, err, r.Stderr)
	}
	digest := map[string]string{} // NAME:TAG -> digest in the bundle
	for _, img := range m.Images {
		for _, u := range h.SB.Internet.UserImages {
			if img.Ref == u {
				digest[u[strings.LastIndex(u, "/")+1:]] = img.Digest
			}
		}
	}
	if len(h.SB.Internet.UserImages) == 0 || len(digest) != len(h.SB.Internet.UserImages) {
		t.Fatalf("the bundle holds %v of the team's images %v", digest, h.SB.Internet.UserImages)
	}
	pods, err := h.Client.CoreV1().Pods(sandbox.WorkloadNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, p := range pods.Items {
		for _, c := range p.Status.ContainerStatuses {
			want, ok := digest[c.Image[strings.LastIndex(c.Image, "/")+1:]]
			if !ok {
				continue
			}
			checked++
			if !strings.HasPrefix(c.ImageID, h.SB.Registry.Address+"/library/") || !strings.HasSuffix(c.ImageID, "@"+want) {
				t.Errorf("pod %s container %s runs %s, want the bundle's %s from %s/library/", p.Name, c.Name, c.ImageID, want, h.SB.Registry.Address)
			}
		}
	}
	if checked == 0 {
		t.Error("no shop container runs a team image")
	}
}

// Without --restore-labels the plan blocks on pinned-ssd: exit 4, nothing
// changes.
func TestApplyRefusesABlockedPlan(t *testing.T) {
	r := apply(t)
	if r.Code != 4 || !strings.Contains(r.Stderr, "readmission pod/shop/pinned-ssd") {
		t.Errorf("exit %d\n%s", r.Code, r.Stderr)
	}
	if v := apiserverVersion(t); v != h.SB.OldVersion {
		t.Errorf("the API server runs %s after a blocked apply", v)
	}
	// The plan says which containers no kubelift can keep: the static
	// pod's on worker-3, recreated under a new UID by a kubelet of
	// another minor; every other container is kept by the hash-skip file.
	reg, pw := h.RegistryFlags()
	r = h.Upgrade(t, pw, append(append([]string{"plan", "--to", h.SB.NewVersion, "--key", h.Key(), "-o", "json", "-q"}, reg...), h.SSHFlags()...)...)
	var p preflight.Plan
	if err := json.Unmarshal([]byte(r.Stdout), &p); err != nil {
		t.Fatalf("plan -o json: exit %d %v\n%s%s", r.Code, err, r.Stdout, r.Stderr)
	}
	if staticBefore == nil { // run alone, without the first test
		staticBefore = staticPod(t)
	}
	_, mirror, _ := strings.Cut(h.SB.StaticPod, "/")
	for _, n := range p.Nodes {
		want := 0
		if n.Name == "worker-3" {
			want = len(staticBefore.Spec.Containers)
		}
		if n.Recreated != want || n.Restarts != 0 {
			t.Errorf("plan: %s recreated %d and restarts %d, want %d and 0", n.Name, n.Recreated, n.Restarts, want)
		}
		if move := "containerd " + kube.Containerd17 + " -> " + kube.ContainerdVersion; n.RuntimeMove != move {
			t.Errorf("plan: %s's runtime move %q, want %q (the bundle carries the node stack)", n.Name, n.RuntimeMove, move)
		}
		// Where containerd 1.7 says it takes the CNI plugins from.
		if move := "CNI plugins in /opt/cni/bin, crictl at /usr/local/bin/crictl"; n.ToolsMove != move {
			t.Errorf("plan: %s's tools move %q, want %q", n.Name, n.ToolsMove, move)
		}
	}
	// CoreDNS, which the installer deployed and nothing moved since.
	if c := p.CoreDNS; c == nil || c.From != strings.TrimPrefix(oldCoreDNS, "v") || c.To != "1.11.3" || c.MigratesCorefile {
		t.Errorf("plan: CoreDNS move %+v, want %s to 1.11.3 with kubeadm's Corefile as it is", c, oldCoreDNS)
	}
	found := false
	for _, f := range p.Findings {
		found = found || (f.Check == "restarts" && f.Object == "node/worker-3" && strings.Contains(f.Message, "static pods kube-system/"+mirror))
		if f.Check == preflight.CheckCoreDNS {
			t.Errorf("plan: CoreDNS finding %+v", f)
		}
	}
	if !found {
		t.Errorf("plan: no finding about %s's recreation: %+v", h.SB.StaticPod, p.Findings)
	}
}

// A node presenting a host key known_hosts does not pin stops apply at
// the plan (exit 4), naming it; nothing changes.
func TestApplyRefusesAWrongHostKey(t *testing.T) {
	w1, _ := h.SB.Machine("worker-1")
	known, err := os.ReadFile(filepath.Join(h.SB.Dir, "ssh", "known_hosts"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, line := range strings.Split(strings.TrimSpace(string(known)), "\n") {
		if hosts, _, _ := strings.Cut(line, " "); strings.Contains(","+hosts+",", ","+w1.Address+",") {
			// Another node's key in worker-1's place.
			continue
		}
		lines = append(lines, line)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(known)), "\n") {
		if hosts, key, _ := strings.Cut(line, " "); strings.Contains(hosts, "worker-2") {
			lines = append(lines, "worker-1,"+w1.Address+" "+key)
		}
	}
	forged := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(forged, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := apply(t, "--restore-labels", "--known-hosts", forged)
	if r.Code != 4 || !strings.Contains(r.Stderr, "ssh node/worker-1") || !strings.Contains(r.Stderr, "host key mismatch") {
		t.Errorf("exit %d\n%s", r.Code, r.Stderr)
	}
	if v := apiserverVersion(t); v != h.SB.OldVersion {
		t.Errorf("the API server runs %s after a refused apply", v)
	}
}

// apply killed with SIGKILL while it upgrades a worker's kubelet leaves
// the state mid-way and its lease behind; once the lease expires the next
// apply takes it over (the rollback test below is that next run).
func TestApplyKilledMidNode(t *testing.T) {
	reg, pw := h.RegistryFlags()
	args := append(append([]string{"apply", "--to", h.SB.NewVersion, "--key", h.Key(), "--settle", "5s", "--restore-labels", "--lock-duration", "15s"}, reg...), h.SSHFlags()...)
	cmd, stderr, err := h.Start(pw, args...)
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		if t.Failed() { // stopped (if the kill below was not reached), and what it said
			_ = cmd.Process.Kill()
			<-exited
			t.Logf("apply said:\n%s", stderr.String())
		}
	})
	// Before worker-1: staging, the control plane, CoreDNS's drained roll
	// (40 s of it waiting) and cp-1's kubelet; bounded, not timed.
	harness.Eventually(t, 8*time.Minute, func() (bool, string) {
		select {
		case <-exited:
			t.Fatal("apply ended before it upgraded worker-1's kubelet")
		default:
		}
		st, _ := record.Read(context.Background(), h.Client)
		if st == nil {
			return false, "no record yet"
		}
		for _, n := range st.Nodes {
			if n.Name == "worker-1" && n.Status == record.NodeUpgrading && n.Step == "kubelet" {
				return true, ""
			}
		}
		return false, "apply not yet upgrading worker-1's kubelet: " + st.State
	})
	if t.Failed() {
		t.FailNow()
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	// CoreDNS's roll let its old pods go once their own count of queries,
	// read through the API server's pod proxy, stood still (quiet.go).
	said := stderr.String()
	if i := strings.Index(said, "old CoreDNS pods stop: no node sends them queries any more"); i < 0 {
		t.Errorf("apply did not let the old CoreDNS pods go on their query counts:\n%s", said)
	} else {
		line, _, _ := strings.Cut(said[i:], "\n")
		t.Log(line)
	}
	st := h.Status(t)
	if st.State == record.StateComplete {
		t.Fatalf("state %s after a kill mid-node", st.State)
	}
	harness.WaitFor(t, "the killed run's lease to expire", func() bool {
		l, err := h.Client.CoordinationV1().Leases("kube-system").Get(context.Background(), upgradelock.Name, metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) > 16*time.Second
	})
}

// A kubelet that never becomes Ready (worker-2's flags carry one v1.31
// removed; the plan's finding ignored) is rolled back to v1.30.14 and
// Ready; apply exits non-zero naming it, status says why, the worker after
// it is not touched. With the flag gone, apply again continues; worker-3's
// sshd going down mid-run stops it before worker-3 is touched; with sshd
// back, apply again finishes the upgrade. Through it all, no container
// restarts anywhere.
func TestApplyRollsBackThenResumes(t *testing.T) {
	startProbe(t)
	const env = "/var/lib/kubelet/kubelet-flags.env"
	old := h.SSH(t, "worker-2", "cat "+env)
	h.SSH(t, "worker-2", fmt.Sprintf("printf '%%s' %s | sed 's/^KUBELET_ARGS=\"/KUBELET_ARGS=\"--keep-terminated-pod-volumes=false /' > %s", nodeaccess.Quote(old), env))
	r := apply(t, "--restore-labels", "--ignore-preflight", "removed-flags", "--ready-timeout", "45s")
	if !strings.Contains(r.Stderr, "took over the lock") {
		t.Errorf("the run after the killed one did not take its lock over:\n%s", r.Stderr)
	}
	if r.Code != 1 || !strings.Contains(r.Stderr, "worker-2") || !strings.Contains(r.Stderr, "rolled back to "+h.SB.OldVersion) {
		t.Fatalf("apply with a kubelet that cannot start: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if v := apiserverVersion(t); v != h.SB.NewVersion {
		t.Errorf("API server %s, want %s (the control plane goes first)", v, h.SB.NewVersion)
	}
	for name, want := range map[string]string{"cp-1": h.SB.NewVersion, "worker-1": h.SB.NewVersion, "worker-2": h.SB.OldVersion, "worker-3": h.SB.OldVersion} {
		n := node(t, name)
		if n.Status.NodeInfo.KubeletVersion != want || !sandbox.NodeReady(n) {
			t.Errorf("%s: kubelet %s ready %v, want %s and Ready", name, n.Status.NodeInfo.KubeletVersion, sandbox.NodeReady(n), want)
		}
	}
	// The node rolled back has its containerd back too (moved before its
	// kubelet): 1.7's binary and its own config (1.x's schema, version 2).
	for name, want := range map[string]string{"cp-1": newRuntime, "worker-1": newRuntime, "worker-2": oldRuntime, "worker-3": oldRuntime} {
		harness.Eventually(t, time.Minute, func() (bool, string) {
			got := runtimeOf(t, name)
			return got == want, fmt.Sprintf("%s reports %s, want %s", name, got, want)
		})
	}
	if v := h.SSH(t, "worker-2", "containerd --version"); !strings.Contains(v, " "+kube.Containerd17+" ") && !strings.HasSuffix(strings.TrimSpace(v), " "+kube.Containerd17) {
		t.Errorf("worker-2's containerd after the rollback: %q", v)
	}
	if v := h.SSH(t, "worker-2", "sed -n 's/^version *= *//p' /etc/containerd/config.toml"); strings.TrimSpace(v) != "2" {
		t.Errorf("worker-2's containerd config after the rollback: version %q, want 1.x's 2", v)
	}
	// ... and its CNI plugins (moved before its containerd), where the
	// nodes that went on keep the bundle's.
	for name, moved := range map[string]bool{"cp-1": true, "worker-1": true, "worker-2": false} {
		if got := bridgeOn(t, name); (got == bundledBridge()) != moved {
			t.Errorf("%s's CNI bridge plugin after worker-2's rollback says %q; the bundle's says %q (want it: %v)", name, got, bundledBridge(), moved)
		}
	}
	st := h.Status(t)
	if st.State != record.StateFailed || !strings.Contains(st.LastError, "worker-2") {
		t.Errorf("state %s, last error %q", st.State, st.LastError)
	}
	for _, n := range st.Nodes {
		if n.Name == "worker-2" && (n.Status != record.NodeRolledBack || !strings.Contains(n.LastError, "not Ready")) {
			t.Errorf("worker-2 in status: %+v", n)
		}
	}

	// The flag fixed, apply again: it continues where it stopped. While it
	// works on worker-2, worker-3's sshd goes down: the run stops before
	// touching worker-3, naming it.
	h.SSH(t, "worker-2", fmt.Sprintf("printf '%%s' %s > %s", nodeaccess.Quote(old), env))
	reg, pw := h.RegistryFlags()
	cmd, stderr, err := h.Start(pw, append(append([]string{"apply", "--to", h.SB.NewVersion, "--key", h.Key(), "--settle", "5s", "--restore-labels"}, reg...), h.SSHFlags()...)...)
	if err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, "apply upgrading worker-2's kubelet", func() bool {
		st, _ := record.Read(context.Background(), h.Client)
		for _, n := range stateNodes(st) {
			if n.Name == "worker-2" && n.Status == record.NodeUpgrading {
				return true
			}
		}
		return false
	})
	w3, _ := h.SB.Machine("worker-3")
	if out, err := h.SB.Command(*w3, "systemctl", "stop", "ssh").CombinedOutput(); err != nil {
		t.Fatalf("stop sshd on worker-3: %v %s", err, out)
	}
	werr := cmd.Wait()
	if werr == nil || !strings.Contains(stderr.String(), "node worker-3") {
		t.Fatalf("apply with worker-3's sshd down: %v\n%s", werr, stderr.String())
	}
	if v := node(t, "worker-3").Status.NodeInfo.KubeletVersion; v != h.SB.OldVersion {
		t.Errorf("worker-3 runs %s: touched although unreachable", v)
	}
	if v := node(t, "worker-2").Status.NodeInfo.KubeletVersion; v != h.SB.NewVersion {
		t.Errorf("worker-2, in flight when worker-3 failed, runs %s: it should have finished", v)
	}
	if out, err := h.SB.Command(*w3, "systemctl", "start", "ssh").CombinedOutput(); err != nil {
		t.Fatalf("start sshd on worker-3: %v %s", err, out)
	}
	harness.WaitFor(t, "worker-3's sshd back", func() bool {
		c, err := h.SB.SSH(context.Background(), "worker-3")
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	// The resume, followed from the cluster by another admin's status
	// --watch, begun once the run is under way.
	resume, resumeErr, err := h.Start(pw, append(append([]string{"apply", "--to", h.SB.NewVersion, "--key", h.Key(), "--settle", "5s", "--restore-labels"}, reg...), h.SSHFlags()...)...)
	if err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, "the resumed apply under way", func() bool {
		st, _ := record.Read(context.Background(), h.Client)
		return st != nil && st.State != record.StateFailed
	})
	watch, watchOut, watchErr, err := h.StartOutput("", "status", "--watch", "--timeout", "15m")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = watch.Process.Kill() }) // a Fatalf before its Wait leaves it running
	if err := resume.Wait(); err != nil {
		t.Fatalf("resume: %v\n%s", err, resumeErr)
	}
	r = harness.Result{Stderr: resumeErr.String()}
	if err := watch.Wait(); err != nil {
		t.Errorf("status --watch of the resumed apply: %v\n%s%s", err, watchOut, watchErr)
	}
	watchedEveryStep(t, watchOut.String())
	for _, m := range h.SB.Nodes() {
		n := node(t, m.Name)
		if n.Status.NodeInfo.KubeletVersion != h.SB.NewVersion || !sandbox.NodeReady(n) || n.Annotations[inplace.AnnotationUpgradedTo] != h.SB.NewVersion {
			t.Errorf("%s: kubelet %s, ready %v, annotations %v", m.Name, n.Status.NodeInfo.KubeletVersion, sandbox.NodeReady(n), n.Annotations)
		}
	}
	if st := h.Status(t); st.State != record.StateComplete || st.Backup == "" {
		t.Errorf("state %s, etcd backup %q", st.State, st.Backup)
	}
	if !strings.Contains(r.Stderr, "static pods started anew") {
		t.Errorf("the apply that moved worker-3 did not say its static pod was recreated:\n%s", r.Stderr)
	}
	after, afterTasks := containers(t), tasks(t)
	for n, ids := range before {
		for id, what := range ids {
			if strings.HasPrefix(what, h.SB.StaticPod+"/") {
				continue // recreated, as the plan said: checked below
			}
			if strings.HasPrefix(what, "kube-system/coredns-") {
				continue // replaced by CoreDNS's own rollout to v1.11.3: checked below
			}
			if _, ok := after[n][id]; !ok {
				t.Errorf("%s: container %s (%s) restarted", n, what, id)
			}
			// The same process, through a containerd restarted (twice on
			// worker-2: moved, put back, moved again) under it.
			if pid, was := beforeTasks[n][id], afterTasks[n][id]; pid == 0 || pid != was {
				t.Errorf("%s: container %s (%s): task PID %d before, %d after", n, what, id, pid, was)
			}
		}
	}
	for _, m := range h.SB.Nodes() {
		if rt := runtimeOf(t, m.Name); rt != newRuntime {
			t.Errorf("%s runs %s after the upgrade, want %s", m.Name, rt, newRuntime)
		}
		if b := bridgeOn(t, m.Name); b != bundledBridge() {
			t.Errorf("%s's CNI bridge plugin after the upgrade says %q, want the bundle's %q", m.Name, b, bundledBridge())
		}
	}
	// The pods that ran before keep their addresses; pods created now get
	// theirs from the bundle's plugins.
	afterIPs := podIPs(t)
	for uid, was := range beforeIPs {
		if now, ok := afterIPs[uid]; ok && now != was {
			t.Errorf("pod %s after the upgrade: %s", was, now)
		}
	}
	newPodsRun(t)
	// The static pod: a new UID (the kubelet's, in the mirror
	// annotation), Running, its containers running on worker-3.
	sp := staticPod(t)
	if sp.Annotations[kubeletcompat.MirrorAnnotation] == staticBefore.Annotations[kubeletcompat.MirrorAnnotation] || sp.Status.Phase != corev1.PodRunning {
		t.Errorf("static pod after the upgrade: UID %s (before %s), %s; want a new UID, Running",
			sp.Annotations[kubeletcompat.MirrorAnnotation], staticBefore.Annotations[kubeletcompat.MirrorAnnotation], sp.Status.Phase)
	}
	runs := 0
	for _, what := range after["worker-3"] {
		if strings.HasPrefix(what, h.SB.StaticPod+"/") {
			runs++
		}
	}
	if runs != len(sp.Spec.Containers) {
		t.Errorf("worker-3 runs %d of the static pod's %d containers", runs, len(sp.Spec.Containers))
	}
	pods, err := h.Client.CoreV1().Pods(sandbox.WorkloadNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s is %s", p.Name, p.Status.Phase)
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount != 0 {
				t.Errorf("pod %s container %s restarted %d times", p.Name, c.Name, c.RestartCount)
			}
		}
		if p.Name == "batch-legacy" && !strings.Contains(fmt.Sprint(p.Spec.Tolerations), corev1.TaintNodeUnreachable) {
			t.Errorf("batch-legacy did not gain the tolerations: %v", p.Spec.Tolerations)
		}
	}
	// Every kube-proxy at the target, as it says itself: its
	// kubernetes_build_info metric.
	for _, m := range h.SB.Nodes() {
		info := h.SSH(t, m.Name, "curl -sf -m 5 http://127.0.0.1:10249/metrics | grep '^kubernetes_build_info{'")
		if !strings.Contains(info, `git_version="`+h.SB.NewVersion+`"`) {
			t.Errorf("%s: kube-proxy's kubernetes_build_info %q, want git_version %s", m.Name, strings.TrimSpace(info), h.SB.NewVersion)
		}
	}
	coreDNSMoved(t)
	// Availability, as a user judges it: from the first apply to the end
	// of the upgrade (a kill mid-node, a kubelet rolled back, an sshd
	// down, every kubelet and kube-proxy restarted, CoreDNS rolled), no
	// request failed, no held connection broke and every lookup of a
	// Service's name answered.
	res := probe.Stop()
	lookups := 0
	for _, tr := range res.Targets {
		if strings.HasPrefix(tr.Name, "dns ") {
			lookups += tr.Requests
		}
	}
	if lookups == 0 {
		t.Error("the prober made no DNS lookup")
	}
	res.Failures = dnsOutsideTheStep(t, res.Failures)
	h.NoDisruption(t, res)
	reportMatches(t, res, before, after)
}

// watchedEveryStep checks what status --watch printed: each node's steps
// in the record's order (every one from the upgrade's start, the runs
// before the resume included), then the upgrade complete.
func watchedEveryStep(t *testing.T, out string) {
	t.Helper()
	st, err := record.Read(context.Background(), h.Client)
	if err != nil || st == nil {
		t.Fatalf("the record: %v", err)
	}
	statuses := []string{record.NodePending, record.NodeUpgrading, record.NodeDone, record.NodeFailed, record.NodeRolledBack, record.NodeSkipped}
	printed := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		_, rest, _ := strings.Cut(line, "  ")
		node, what, ok := strings.Cut(rest, ": ")
		if !ok || strings.HasPrefix(rest, "upgrade ") || strings.HasPrefix(what, "event ") {
			continue
		}
		status, _, _ := strings.Cut(what, ": ")
		if slices.Contains(statuses, status) {
			continue
		}
		printed[node] = append(printed[node], what)
	}
	for i := range st.Nodes {
		n := &st.Nodes[i]
		var want []string
		for _, s := range st.Timeline(n) {
			want = append(want, s.Name)
		}
		if len(want) == 0 || !slices.Equal(printed[n.Name], want) {
			t.Errorf("status --watch printed %s's steps\n  %v\nthe record's timeline\n  %v", n.Name, printed[n.Name], want)
		}
	}
	if !strings.Contains(out, "upgrade "+h.SB.OldVersion+" -> "+h.SB.NewVersion+": "+record.StateComplete) {
		t.Errorf("status --watch did not end on the upgrade complete:\n%s", out)
	}
}

// reportMatches writes upgrade report with the prober's result and reads
// the page back: it loads nothing, has a bar per node and step at the
// record's times, and per node the restarts crictl counts (over SSH,
// before the first apply and now: the containers of before gone, but
// the static pod's, recreated by design, and CoreDNS's, replaced by its
// rollout before the kubelets).
func reportMatches(t *testing.T, res *prober.Result, before, after map[string]map[string]string) {
	t.Helper()
	dir := t.TempDir()
	avail, page := filepath.Join(dir, "availability.json"), filepath.Join(dir, "report.html")
	data, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(avail, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := h.Upgrade(t, "", "report", "--key", h.Key(), "--availability", avail, "--file", page); r.Code != 0 {
		t.Fatalf("report: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	html, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	got, err := reporttest.Parse(string(html))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Loads) > 0 {
		t.Errorf("the report loads %v", got.Loads)
	}
	st, err := record.Read(context.Background(), h.Client)
	if err != nil {
		t.Fatal(err)
	}
	var bars []string
	for i := range st.Nodes {
		n := &st.Nodes[i]
		for _, s := range st.Timeline(n) {
			bars = append(bars, fmt.Sprintf("%s %s %d+%d", n.Name, s.Name, s.Start.Sub(st.Started).Milliseconds(), s.End.Sub(s.Start).Milliseconds()))
		}
		restarted := 0
		for id, what := range before[n.Name] {
			if _, ok := after[n.Name][id]; !ok && !strings.HasPrefix(what, h.SB.StaticPod+"/") && !strings.HasPrefix(what, "kube-system/coredns-") {
				restarted++
			}
		}
		if got.Restarted[n.Name] != strconv.Itoa(restarted) {
			t.Errorf("%s: the report says %q containers restarted, crictl %d", n.Name, got.Restarted[n.Name], restarted)
		}
	}
	if !slices.Equal(got.Bars, bars) {
		t.Errorf("the report's bars\n  %s\nthe record's timeline\n  %s", strings.Join(got.Bars, "\n  "), strings.Join(bars, "\n  "))
	}
	if got.AvailabilityRows != len(res.Targets) {
		t.Errorf("the report's availability table has %d rows, the prober %d targets", got.AvailabilityRows, len(res.Targets))
	}
}

// dnsOutsideTheStep takes out of fails, and logs, the DNS lookups lost
// outside the CoreDNS step: a kubelet restarted in place reports a
// container with a readiness probe not ready until its first probe
// (prober_manager.go, UpdatePodStatus), kube-proxy then flushes the UDP
// conntrack entries of a CoreDNS pod on that node and a lookup in flight
// loses its answer (docs/development.md). What the step itself must
// hold to, no lookup lost, is held to: from the backup the step keeps
// first to its Deployment's last progress, 10 s on.
func dnsOutsideTheStep(t *testing.T, fails []prober.Failure) []prober.Failure {
	t.Helper()
	ctx := context.Background()
	b, err := h.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, "kubelift-coredns-backup", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := h.Client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	from, to := b.CreationTimestamp.Time, time.Time{}
	for _, c := range d.Status.Conditions {
		if c.Type == "Progressing" {
			to = c.LastUpdateTime.Time.Add(10 * time.Second)
		}
	}
	if !to.After(from) {
		t.Fatalf("CoreDNS's step: from %s to %s", from, to)
	}
	var kept []prober.Failure
	for _, f := range fails {
		if strings.HasPrefix(f.Target, "dns ") && (f.At.Before(from.Add(-time.Second)) || f.At.After(to)) {
			t.Logf("DNS lookup lost outside the CoreDNS step (%s to %s): %s at %s: %s", from.Format("15:04:05"), to.Format("15:04:05"), f.Target, f.At.Format("15:04:05.000"), f.Error)
			continue
		}
		kept = append(kept, f)
	}
	return kept
}

// coreDNSMoved checks CoreDNS runs the bundle's (v1.11.3, from the
// private registry, where import pushed it) on every replica, with what
// it replaced kept for a rollback.
func coreDNSMoved(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := sandbox.WaitCoreDNS(ctx, h.Client, time.Minute); err != nil {
		t.Error(err)
	}
	d, err := h.Client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	img := d.Spec.Template.Spec.Containers[0].Image
	if !strings.HasPrefix(img, h.SB.Registry.Address+"/") || !strings.Contains(img, "/coredns:v1.11.3@sha256:") {
		t.Errorf("CoreDNS after the upgrade runs %s, want the bundle's v1.11.3 from %s", img, h.SB.Registry.Address)
	}
	b, err := h.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, "kubelift-coredns-backup", metav1.GetOptions{})
	if err != nil || !strings.HasSuffix(b.Data["image"], ":"+oldCoreDNS) {
		t.Errorf("CoreDNS's backup: %v, %v", b, err)
	}
	h.CoreDNSAsDeployed(t)
}

// On an upgraded cluster apply changes nothing and says so; a rollback of
// the minor upgrade is refused, saying why, and changes nothing either.
func TestApplyAgainChangesNothing(t *testing.T) {
	r := apply(t, "--restore-labels")
	if r.Code != 0 || !strings.Contains(r.Stdout, "nothing to do") {
		t.Errorf("exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	r = h.Upgrade(t, "", append([]string{"rollback"}, h.SSHFlags()...)...)
	if r.Code != 1 || !strings.Contains(r.Stderr, "rollback refused") || !strings.Contains(r.Stderr, "kube-apiserver on cp-1 runs "+h.SB.NewVersion) {
		t.Errorf("rollback after a minor upgrade: exit %d\n%s", r.Code, r.Stderr)
	}
	if v := apiserverVersion(t); v != h.SB.NewVersion {
		t.Errorf("the API server runs %s after a refused rollback", v)
	}
}

// The dual-era rule on a real kubelet: after the upgrade, while the
// hash-skip file is on the node, an image set in place on a container the
// old kubelet started is acted on (that container, and only it, restarts
// with the new image), and a restart of that kubelet changes neither that
// nor the containers it kept.
func TestImageSetInPlaceIsRestartedWhileTheFileExists(t *testing.T) {
	ctx := context.Background()
	// A shop pod off worker-1 (whose containers the next test wants all
	// old).
	pod := h.HashSkipShopPod(t, func(p *corev1.Pod) bool { return p.Spec.NodeName != "worker-1" })
	name, node := pod.Name, pod.Spec.NodeName
	before := h.Shop(t)
	restarts := map[string]int32{} // container -> restarts expected after
	for _, cs := range pod.Status.ContainerStatuses {
		restarts[cs.Name] = cs.RestartCount
	}
	restarts["proxy"]++
	proxyID := h.SetProxyImage(t, pod)
	// Only that container changed; then the kubelet restarts, and still.
	check := func(when string) {
		now := h.Shop(t)
		for id, what := range before {
			if _, ok := now[id]; !ok && id != proxyID {
				t.Errorf("%s: container %s (%s) no longer runs", when, what, id)
			}
		}
		if _, ok := now[proxyID]; ok {
			t.Errorf("%s: %s's proxy still runs its old container %s", when, name, proxyID)
		}
	}
	check("after the image was set")
	h.SSH(t, node, "systemctl restart kubelet")
	harness.Eventually(t, 2*time.Minute, func() (bool, string) {
		n := h.Node(t, node)
		return sandbox.NodeReady(n), node + " not Ready after its kubelet restarted"
	})
	time.Sleep(20 * time.Second) // two of the kubelet's pod syncs (syncFrequency 10s) with the file read anew
	check("after " + node + "'s kubelet restarted")
	p, err := h.Client.CoreV1().Pods(sandbox.WorkloadNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.RestartCount != restarts[cs.Name] {
			t.Errorf("after the kubelet restarted, %s's %s restarted %d times, want %d", name, cs.Name, cs.RestartCount, restarts[cs.Name])
		}
	}
}

func cleanup(t *testing.T) map[string]compat.NodeCleanup {
	t.Helper()
	r := h.Upgrade(t, "", append([]string{"compat", "cleanup", "-o", "json"}, h.SSHFlags()...)...)
	var list []compat.NodeCleanup
	if err := json.Unmarshal([]byte(r.Stdout), &list); err != nil || r.Code != 0 {
		t.Fatalf("compat cleanup: exit %d %v\n%s%s", r.Code, err, r.Stdout, r.Stderr)
	}
	out := map[string]compat.NodeCleanup{}
	for _, n := range list {
		out[n.Node] = n
	}
	return out
}

// After the upgrade the hash-skip file stays where containers the old
// kubelet started still run; where none does (cp-1 runs no pod; worker-1
// once its pods are replaced), cleanup removes it.
func TestCompatCleanupRemovesTheFileOnceConverged(t *testing.T) {
	got := cleanup(t)
	if n := got["worker-1"]; !n.File || n.Removed || n.Containers == 0 || n.Old != n.Containers {
		t.Errorf("worker-1 right after the upgrade: %+v", n)
	}
	if n := got["cp-1"]; !n.Removed {
		t.Errorf("cp-1 (no containers): %+v", n)
	}
	ctx := context.Background()
	old := h.Running(t, "worker-1")
	pods, err := h.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	zero := int64(0)
	for _, p := range pods.Items {
		if err := h.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}
	harness.WaitFor(t, "worker-1 to run only containers its new kubelet started", func() bool {
		now := h.Running(t, "worker-1")
		for id := range now {
			if _, isOld := old[id]; isOld {
				return false
			}
		}
		return len(now) > 0 // the DaemonSet's pod is back
	})
	got = cleanup(t)
	if n := got["worker-1"]; !n.Removed || n.Old != 0 {
		t.Errorf("worker-1 after its pods were replaced: %+v", n)
	}
	if n := got["worker-2"]; n.Removed || !n.File || n.Old == 0 {
		t.Errorf("worker-2 (old containers still run): %+v", n)
	}
	if out := h.SSH(t, "worker-1", "test -e /var/lib/kubelet/kubelift-hash-skip.json && echo present || echo absent"); out != "absent\n" {
		t.Errorf("worker-1's hash-skip file: %s", out)
	}
}

// newPodsRun creates a pod on every worker after the upgrade (images
// from the private registry, through the migrated containerd config, a
// sandbox and an address from CNI, the new runc) and waits for each to
// run with an address. They live in a namespace of their own, which it
// deletes after, waiting for their containers to be gone: the tests after
// it compare the shop's containers and the nodes'.
func newPodsRun(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	const ns = "after-upgrade"
	if err := sandbox.EnsureNamespace(ctx, h.Client, ns); err != nil {
		t.Fatal(err)
	}
	pods := h.Client.CoreV1().Pods(ns)
	var names []string
	for _, m := range h.SB.Nodes() {
		if m.Role != "worker" {
			continue
		}
		spec := h.SB.PodSpec(nil)
		spec.NodeName = m.Name
		// Retried: the namespace's default ServiceAccount, which admission
		// wants, comes from the controller manager a moment after it.
		harness.Eventually(t, time.Minute, func() (bool, string) {
			_, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: m.Name}, Spec: spec}, metav1.CreateOptions{})
			return err == nil, fmt.Sprintf("create pod %s/%s: %v", ns, m.Name, err)
		})
		names = append(names, m.Name)
	}
	defer func() {
		if err := h.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			harness.WaitFor(t, "the containers of pod "+ns+"/"+n+" gone", func() bool {
				for _, what := range h.Running(t, n) {
					if strings.HasPrefix(what, ns+"/") {
						return false
					}
				}
				return true
			})
		}
	}()
	for _, n := range names {
		harness.Eventually(t, 2*time.Minute, func() (bool, string) {
			p, err := pods.Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			ready := false
			for _, c := range p.Status.Conditions {
				ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
			}
			return ready && p.Status.PodIP != "", fmt.Sprintf("pod %s on %s created after the upgrade: %s, ready %v, address %q", n, p.Spec.NodeName, p.Status.Phase, ready, p.Status.PodIP)
		})
	}
}

func stateNodes(st *record.Upgrade) []record.Node {
	if st == nil {
		return nil
	}
	return st.Nodes
}
