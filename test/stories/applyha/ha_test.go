// Package applyha tests upgrade apply on a highly available control plane
// of binaries (3 control planes, 2 workers, leader election on, an etcd
// member on each control plane), a patch upgrade from v1.31.4 to
// v1.31.14 whose bundle carries etcd a minor ahead: the members move one
// at a time, the leader last, while the API answers every request, and
// the snapshot taken first is kept off its node; every API server runs the
// target before any kubelet restarts; manual mode moves the chosen workers
// only; then rollback puts every node back (etcd, a minor ahead, stays,
// and it says so), and each control-plane part is the same process a
// minute after it returned; the rollback is recorded, a second one changes
// nothing, apply runs again from a fresh record, and the snapshot it kept
// off its node restores the cluster (docs/etcd.md).
// (test/stories/apply moves a minor; rollback needs a patch downgrade:
// the catalog lists v1.31.4 among v1.31.14's downgrades.)
package applyha

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/test/env/harness"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

var h *harness.Harness

func TestMain(m *testing.M) {
	harness.Main(m, "klh", "10.85.0", 3, 2, func(x *harness.Harness) {
		h = x
	}, harness.From("v1.31.4"), harness.Target("v1.31.14"), harness.CoreDNS(oldCoreDNS), harness.Etcd(oldEtcd, newEtcd),
		harness.APIServerFeatureGates("APIServerTracing=false")) // the API servers retry etcd's "leader changed" (apiProbe)
}

// oldCoreDNS is the CoreDNS the sandbox runs, as an installer of an
// earlier release left it; the release's (v1.31.14's) is newCoreDNS.
const (
	oldCoreDNS = "v1.11.1"
	newCoreDNS = "v1.11.3"
)

// oldEtcd is the etcd the sandbox's three members run; the bundles carry
// newEtcd (bundle create --etcd), a minor ahead, as etcd 3.6 pairs with
// later Kubernetes releases.
const (
	oldEtcd = "v3.5.35"
	newEtcd = "v3.6.16"
)

// rolled says a container is one an upgrade replaces by design: CoreDNS's,
// rolled by its Deployment to the release's version and back.
func rolled(what string) bool { return strings.HasPrefix(what, "kube-system/coredns-") }

// coreDNSRuns waits until CoreDNS's rollout is done and checks every
// replica runs tag, and the Corefile is the one the sandbox deployed,
// with no copy left beside it.
func coreDNSRuns(t *testing.T, tag string) {
	t.Helper()
	ctx := context.Background()
	if err := sandbox.WaitCoreDNS(ctx, h.Client, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	d, err := h.Client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if img := d.Spec.Template.Spec.Containers[0].Image; !strings.Contains(img, "coredns:"+tag) {
		t.Errorf("CoreDNS runs %s, want %s", img, tag)
	}
	cm, err := h.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cm.Data) != 1 || !strings.Contains(cm.Data["Corefile"], "kubernetes cluster.local") {
		t.Errorf("CoreDNS's ConfigMap: %v", cm.Data)
	}
	h.CoreDNSAsDeployed(t)
}

// started reads when comp's running process started, in clock ticks since
// boot (/proc/PID/stat field 22): every node shares this machine's kernel,
// so the times compare across nodes.
func started(t *testing.T, node, comp string) int64 {
	t.Helper()
	out := h.SSH(t, node, fmt.Sprintf(`pid=$(systemctl show %s -p MainPID | sed -n 's/^MainPID=//p'); cut -d ')' -f 2 /proc/$pid/stat | awk '{print $20}'`, comp))
	n, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatalf("%s on %s: start time %q: %v", comp, node, out, err)
	}
	return n
}

func TestNoKubeletRestartsBeforeEveryAPIServerRunsTheTarget(t *testing.T) {
	if r := h.Upgrade(t, "", append([]string{"rollback"}, h.SSHFlags()...)...); r.Code != 1 || !strings.Contains(r.Stderr, "no upgrade is recorded") {
		t.Fatalf("rollback before any upgrade: exit %d\n%s", r.Code, r.Stderr)
	}
	h.Import(t, h.HashSkipBundle)
	before := map[string]map[string]string{}
	for _, m := range h.SB.Nodes() {
		before[m.Name] = h.Running(t, m.Name)
	}
	reg, pw := h.RegistryFlags()
	args := append(append([]string{"apply", "--to", h.SB.NewVersion, "--key", h.Key(), "--settle", "5s", "--restore-labels", "--max-unavailable", "2"}, reg...), h.SSHFlags()...)
	// A failing pre-hook stops the run before the first kubelet moves,
	// after etcd and the control plane have: the API answers throughout
	// etcd's move (apiProbe), and the snapshot taken before it is kept
	// off its node too, and in the private registry.
	leader, snapshots := leaderNode(t, etcdStatus(t)), t.TempDir()
	probe := startAPIProbe(t)
	r := h.Upgrade(t, pw, append(args, "--pre-hook", "exit 3", "--etcd-snapshot-dir", snapshots, "--etcd-snapshot-repo", snapshotRepo())...)
	probe.Stop(t)
	if r.Code != 1 || !strings.Contains(r.Stderr, "pre-hook") {
		t.Fatalf("apply with a failing pre-hook: exit %d\n%s", r.Code, r.Stderr)
	}
	etcdMoved(t, r.Stderr, leader, snapshots)
	for _, m := range h.SB.Nodes() {
		if v := h.Node(t, m.Name).Status.NodeInfo.KubeletVersion; v != h.SB.OldVersion {
			t.Errorf("%s runs kubelet %s after a failing pre-hook", m.Name, v)
		}
	}
	// Manual mode: the control plane and worker-1 only, with hooks around
	// each kubelet.
	hooked := filepath.Join(t.TempDir(), "hooks")
	hookArgs := []string{"--pre-hook", `echo pre $KUBELIFT_NODE $KUBELIFT_FROM $KUBELIFT_TO >> ` + hooked, "--post-hook", `echo post $KUBELIFT_NODE >> ` + hooked}
	if r := h.Upgrade(t, pw, append(append(args, "--nodes", "worker-1"), hookArgs...)...); r.Code != 0 {
		t.Fatalf("apply --nodes worker-1: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	lines, _ := os.ReadFile(hooked)
	var want []string
	for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1"} {
		want = append(want, "pre "+n+" "+h.SB.OldVersion+" "+h.SB.NewVersion, "post "+n)
	}
	if got := strings.TrimSpace(string(lines)); got != strings.Join(want, "\n") {
		t.Errorf("hooks ran:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	for name, want := range map[string]string{"cp-1": h.SB.NewVersion, "cp-3": h.SB.NewVersion, "worker-1": h.SB.NewVersion, "worker-2": h.SB.OldVersion} {
		if got := h.Node(t, name).Status.NodeInfo.KubeletVersion; got != want {
			t.Errorf("after apply --nodes worker-1: %s runs %s, want %s", name, got, want)
		}
	}
	r = h.Upgrade(t, "", "status", "-o", "json")
	var st record.Upgrade
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatal(err)
	}
	if st.State != record.StateUpgradingKubelets {
		t.Errorf("state %s with worker-2 left, want %s", st.State, record.StateUpgradingKubelets)
	}
	for _, n := range st.Nodes {
		if n.Name == "worker-2" && n.Status != record.NodePending {
			t.Errorf("worker-2 in status: %+v", n)
		}
	}
	// Then the rest.
	if r := h.Upgrade(t, pw, args...); r.Code != 0 {
		t.Fatalf("apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	var lastAPIServer, firstKubelet int64 = 0, 1 << 62
	for _, m := range h.SB.Nodes() {
		if m.Role == "control-plane" {
			if v, err := h.RunningVersion(m.Name, "kube-apiserver"); err != nil || v != h.SB.NewVersion {
				t.Errorf("%s: kube-apiserver runs %q (%v)", m.Name, v, err)
			}
			lastAPIServer = max(lastAPIServer, started(t, m.Name, "kube-apiserver"))
		}
		firstKubelet = min(firstKubelet, started(t, m.Name, "kubelet"))
		n := h.Node(t, m.Name)
		if n.Status.NodeInfo.KubeletVersion != h.SB.NewVersion || !sandbox.NodeReady(n) {
			t.Errorf("%s: kubelet %s ready %v", m.Name, n.Status.NodeInfo.KubeletVersion, sandbox.NodeReady(n))
		}
		now := h.Running(t, m.Name)
		for id, what := range before[m.Name] {
			if _, ok := now[id]; !ok && !rolled(what) {
				t.Errorf("%s: container %s restarted", m.Name, what)
			}
		}
	}
	if firstKubelet <= lastAPIServer {
		t.Errorf("a kubelet started (tick %d) before the last API server did (tick %d)", firstKubelet, lastAPIServer)
	}
	coreDNSRuns(t, newCoreDNS)

	// Back: every API server's restart makes the controller managers and
	// schedulers re-elect; rollback returns only on a settled control plane.
	// etcd, which moved a minor, stays, and the rollback says so.
	r = h.Upgrade(t, "", append([]string{"rollback"}, h.SSHFlags()...)...)
	if r.Code != 0 {
		t.Fatalf("rollback: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if !strings.Contains(r.Stderr, "etcd stays at v3.6") || !strings.Contains(r.Stderr, "etcd's downgrade or the snapshot (docs/etcd.md)") {
		t.Errorf("rollback did not say etcd stays, and the ways back:\n%s", r.Stderr)
	}
	for _, s := range etcdStatus(t) {
		if s.Version.String() != newEtcd {
			t.Errorf("after rollback member %s runs etcd %s, want %s (it stays)", s.Endpoint, s.Version, newEtcd)
		}
	}
	h.SteadyControlPlane(t, h.SB.OldVersion)
	for _, m := range h.SB.Nodes() {
		n := h.Node(t, m.Name)
		if n.Status.NodeInfo.KubeletVersion != h.SB.OldVersion || !sandbox.NodeReady(n) {
			t.Errorf("after rollback %s: kubelet %s ready %v", m.Name, n.Status.NodeInfo.KubeletVersion, sandbox.NodeReady(n))
		}
		now := h.Running(t, m.Name)
		for id, what := range before[m.Name] {
			if _, ok := now[id]; !ok && !rolled(what) {
				t.Errorf("after rollback %s: container %s restarted", m.Name, what)
			}
		}
	}
	if st := h.Status(t); st.State != record.StateRolledBack {
		t.Errorf("status after rollback: %s", st.State)
	}
	// CoreDNS back where the installer left it: the image and Corefile.
	coreDNSRuns(t, oldCoreDNS)
}
