// Package controller tests the in-cluster controller (upgrade controller,
// docs/controller.md) on a sandbox of its own (1 control plane, 3
// workers, containerd): the controller installed from the imported
// bundle's agent image; an Upgrade failing on a node whose kubelet cannot
// start, named in its status, the node rolled back; then, with every
// node's sshd stopped, an Upgrade written by apply --in-cluster
// --detach (the admin process gone at once) and run to the end by the
// controller, whose leading pod is deleted in a kubelet step, whose next
// leader runs on a node it upgrades, and which holds while the Upgrade is
// paused (set while that node upgrades: the next node waits); a second
// Upgrade, written while the first runs, waits for it.
package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/controller"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/upgradeapi"
	"github.com/kubelift/kubelift/test/env/harness"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

var h *harness.Harness

func TestMain(m *testing.M) {
	harness.Main(m, "kct", "10.93.0", 1, 3, func(x *harness.Harness) { h = x }, harness.Agent())
}

// bound is how long the test waits for the run to reach a point.
const bound = 15 * time.Minute

// host is the node the controller's pods are held to, so that the
// leader that takes over runs on a node it upgrades.
const host = "worker-2"

// installed says whether TestFailedNodeNamed installed the controller.
var installed bool

// install installs the controller from the imported bundle's agent
// image, its pods held to host.
func install(t *testing.T) {
	t.Helper()
	if installed {
		return
	}
	ctx := context.Background()
	// import installs it; 'controller install' again changes nothing
	// but says what it made. The sandbox's registry takes passwords
	// only: nodes pull with it.
	imp := h.Import(t, h.HashSkipBundle, "--install-controller", "--node-credentials", "password")
	reg, pw := h.RegistryFlags()
	install := h.Upgrade(t, pw, append([]string{"controller", "install", "--to", h.SB.NewVersion, "--key", h.Key(), "--node-credentials", "password"}, reg...)...)
	if install.Code != 0 {
		t.Fatalf("controller install: exit %d\n%s%s", install.Code, install.Stdout, install.Stderr)
	}
	for _, out := range []string{imp.Stdout, install.Stdout} {
		if !strings.Contains(out, "Deployment "+agent.Namespace+"/"+controller.Name) || !strings.Contains(out, "the controller runs from ") {
			t.Errorf("import --install-controller and controller install say:\n%s", out)
		}
	}
	deployments := h.Client.AppsV1().Deployments(agent.Namespace)
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"nodeSelector":{"kubernetes.io/hostname":%q}}}}}`, host)
	if _, err := deployments.Patch(ctx, controller.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 3*time.Minute, func() (bool, string) {
		pods := controllerPods(t)
		running := 0
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName == host && p.DeletionTimestamp == nil {
				running++
			}
		}
		return running == 2, fmt.Sprintf("%d of the controller's pods run on %s: %s", running, host, describe(pods))
	})
	installed = true
}

// A node whose kubelet cannot start at the target (worker-1's flags carry
// one v1.31 removed; the finding ignored) fails the Upgrade: its status
// names the node, the step and the reason, and the node is back at the
// old version, Ready.
func TestFailedNodeNamed(t *testing.T) {
	ctx := context.Background()
	install(t)
	const env = "/var/lib/kubelet/kubelet-flags.env"
	old := h.SSH(t, "worker-1", "cat "+env)
	h.SSH(t, "worker-1", fmt.Sprintf("printf '%%s' %s | sed 's/^KUBELET_ARGS=\"/KUBELET_ARGS=\"--keep-terminated-pod-volumes=false /' > %s", nodeaccess.Quote(old), env))
	defer h.SSH(t, "worker-1", fmt.Sprintf("printf '%%s' %s > %s", nodeaccess.Quote(old), env))
	r := h.Upgrade(t, "", "apply", "--in-cluster", "--name", "fails", "--to", h.SB.NewVersion, "--settle", "5s", "--restore-labels",
		"--ignore-preflight", "removed-flags", "--ready-timeout", "15s")
	failedAt := time.Now()
	if r.Code != 1 || !strings.Contains(r.Stderr, "node worker-1, step kubelet") {
		t.Fatalf("apply --in-cluster with a kubelet that cannot start: exit %d, want 1 naming worker-1's kubelet step\n%s%s\n%s", r.Code, r.Stdout, r.Stderr, logs(t))
	}
	u, err := upgradeapi.Client{Dynamic: dynamicClient(t)}.Get(ctx, "fails")
	if err != nil || u == nil {
		t.Fatal(err)
	}
	if f := u.Status.LastError; u.Status.Phase != upgradeapi.Failed || f == nil || f.Node != "worker-1" || f.Step != "kubelet" || !strings.Contains(f.Reason, "not Ready") {
		t.Errorf("the failed Upgrade's status: %s, %+v", u.Status.Phase, u.Status.LastError)
	}
	// Back at the old version, heartbeating and Ready. (The kubelet
	// that could not start posted nothing: the Node's Ready condition
	// alone may be the old kubelet's, stale, so a renewed Lease is asked
	// for too, as the rollback itself does; docs/runbook.md.)
	harness.Eventually(t, 2*time.Minute, func() (bool, string) {
		n := h.Node(t, "worker-1")
		v := n.Status.NodeInfo.KubeletVersion
		l, err := h.Client.CoordinationV1().Leases("kube-node-lease").Get(ctx, "worker-1", metav1.GetOptions{})
		renewed := err == nil && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(failedAt)
		return v == h.SB.OldVersion && renewed && sandbox.NodeReady(n),
			fmt.Sprintf("worker-1 after its rollback: kubelet %s, Lease renewed since %v, Ready %v; want %s, renewed and Ready", v, renewed, sandbox.NodeReady(n), h.SB.OldVersion)
	})
	for _, want := range []string{"worker-1: upgrading, kubelet", "worker-1: rolled-back"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("apply --in-cluster's transcript has no %q:\n%s", want, r.Stdout)
		}
	}
}

func TestInClusterUpgrade(t *testing.T) {
	ctx := context.Background()
	install(t)
	h.StopSSH(t)
	leader := waitLeader(t, "")
	var moving []string // the nodes the upgrade moves
	for _, m := range h.SB.Nodes() {
		if h.Node(t, m.Name).Status.NodeInfo.KubeletVersion != h.SB.NewVersion {
			moving = append(moving, m.Name)
		}
	}

	before := h.APIContainers(t)
	probe := h.Probe(t)
	started := time.Now()
	detach := h.Upgrade(t, "", "apply", "--in-cluster", "--detach", "--to", h.SB.NewVersion, "--settle", "5s", "--restore-labels")
	if detach.Code != 0 || !strings.Contains(detach.Stdout, "upgrade "+h.SB.NewVersion) {
		t.Fatalf("apply --in-cluster --detach: exit %d\n%s%s", detach.Code, detach.Stdout, detach.Stderr)
	}
	upgrades := upgradeapi.Client{Dynamic: dynamicClient(t)}
	harness.Eventually(t, 3*time.Minute, func() (bool, string) {
		u, err := upgrades.Get(ctx, h.SB.NewVersion)
		if err != nil || u == nil {
			return false, fmt.Sprint(err)
		}
		return u.Status.Phase == upgradeapi.Running, "upgrade " + h.SB.NewVersion + ": " + u.Status.Phase
	})
	// A second Upgrade while it runs.
	second := h.Upgrade(t, "", "apply", "--in-cluster", "--detach", "--to", h.SB.NewVersion, "--name", "again", "--restore-labels")
	if second.Code != 0 {
		t.Fatalf("the second apply --in-cluster --detach: exit %d\n%s%s", second.Code, second.Stdout, second.Stderr)
	}

	deleted, paused, sawWaiting, sawPaused := "", false, false, false
	for until := time.Now().Add(bound); ; {
		if time.Now().After(until) {
			t.Fatalf("the upgrade did not complete within %s (leader %s deleted %v, paused %v)\n%s", bound, leader, deleted != "", paused, logs(t))
		}
		time.Sleep(200 * time.Millisecond)
		u, err := upgrades.Get(ctx, h.SB.NewVersion)
		if err != nil || u == nil {
			continue // the API server restarts with the control plane
		}
		if a, err := upgrades.Get(ctx, "again"); err == nil && a != nil && a.Status.Phase == upgradeapi.Waiting {
			if a.Status.WaitingFor != h.SB.NewVersion {
				t.Errorf("upgrade again waits for %q, want %s", a.Status.WaitingFor, h.SB.NewVersion)
			}
			sawWaiting = true
		}
		if u.Status.Phase == upgradeapi.Failed {
			t.Fatalf("the upgrade failed: %+v\n%s", u.Status.LastError, logs(t))
		}
		if u.Status.Phase == upgradeapi.Complete {
			break
		}
		st := nodeStatus(u)
		switch {
		case deleted == "" && st["worker-1"].Status == record.NodeUpgrading && st["worker-1"].Step == "kubelet":
			// The leader's pod deleted in worker-1's kubelet step: the
			// other replica (on host too) takes the run over.
			if err := h.Client.CoreV1().Pods(agent.Namespace).Delete(ctx, leader, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			deleted = leader
			t.Logf("%s: the leading controller %s deleted in worker-1's kubelet step", time.Since(started).Round(time.Second), leader)
		case deleted != "" && !paused && st[host].Status == record.NodeUpgrading:
			// Paused while host upgrades: host finishes, worker-3 waits.
			setPaused(t, upgrades, true)
			paused = true
		case paused && !sawPaused && u.Status.Phase == upgradeapi.Paused:
			sawPaused = true
			if !strings.Contains(u.Status.Message, "worker-3") {
				t.Errorf("paused upgrade's message %q does not name the node it holds before", u.Status.Message)
			}
			// It holds: worker-3 stays pending for as long as it is
			// paused (three of the controller's polls).
			for range 3 {
				time.Sleep(2 * time.Second)
				if n := h.Node(t, "worker-3"); n.Status.NodeInfo.KubeletVersion != h.SB.OldVersion || n.Spec.Unschedulable {
					t.Fatalf("worker-3 moved while the upgrade was paused: kubelet %s", n.Status.NodeInfo.KubeletVersion)
				}
			}
			setPaused(t, upgrades, false)
		}
	}
	pr := probe.Stop()
	took := time.Since(started)
	if deleted == "" || !sawPaused || !sawWaiting {
		t.Fatalf("the test saw no leader deleted (%q), no pause (%v) or no waiting upgrade (%v)\n%s", deleted, sawPaused, sawWaiting, logs(t))
	}
	next := waitLeader(t, deleted)
	t.Logf("upgraded in %s; the leader after %s is %s", took.Round(time.Second), deleted, next)

	h.NodesAt(t, h.SB.NewVersion, "the controller's upgrade")
	h.SameAPIContainers(t, before, "the controller's upgrade")
	h.NoDisruption(t, pr)
	// The leader that took over ran on host, which it upgraded: it
	// kept running through its own node's kubelet restart.
	p, err := h.Client.CoreV1().Pods(agent.Namespace).Get(ctx, next, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != host || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the leader %s on %s restarted %d times", next, p.Spec.NodeName, p.Status.ContainerStatuses[0].RestartCount)
	}
	// No step ran twice: each node's kubelet started once since the
	// upgrade was written (its swap), the resumed worker-1's too; the
	// nodes already at the target not at all.
	starts := kubeletStarts(t, started)
	for _, m := range h.SB.Nodes() {
		if want := map[bool]int{true: 1}[slices.Contains(moving, m.Name)]; starts[m.Name] != want {
			t.Errorf("%s: the kubelet started %d times during the upgrade, want %d", m.Name, starts[m.Name], want)
		}
	}
	if !slices.Contains(moving, "worker-1") || !slices.Contains(moving, host) {
		t.Errorf("the upgrade moved %v: the test needs worker-1 and %s among them", moving, host)
	}
	// The second Upgrade runs once the first is done, and has nothing
	// to do.
	harness.Eventually(t, 5*time.Minute, func() (bool, string) {
		a, err := upgrades.Get(ctx, "again")
		if err != nil || a == nil {
			return false, fmt.Sprint(err)
		}
		return a.Status.Phase == upgradeapi.Complete, "upgrade again: " + a.Status.Phase + " " + a.Status.Message
	})
	// kubectl get upgrades: the printer columns say it.
	table := h.Upgrade(t, "", "status")
	for _, want := range []string{h.SB.NewVersion + "  ", upgradeapi.Complete, "4/4"} {
		if !strings.Contains(table.Stdout, want) {
			t.Errorf("upgrade status does not say %q:\n%s", want, table.Stdout)
		}
	}
	checkPrinterColumns(t)
}

func controllerPods(t *testing.T) []corev1.Pod {
	t.Helper()
	l, err := h.Client.CoreV1().Pods(agent.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + controller.Name})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func describe(pods []corev1.Pod) string {
	var out []string
	for _, p := range pods {
		out = append(out, fmt.Sprintf("%s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase))
	}
	return strings.Join(out, ", ")
}

// waitLeader waits for a controller pod other than not to lead, and
// returns its name.
func waitLeader(t *testing.T, not string) string {
	t.Helper()
	var leader string
	harness.Eventually(t, 3*time.Minute, func() (bool, string) {
		l, err := h.Client.CoordinationV1().Leases(agent.Namespace).Get(context.Background(), controller.LeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return false, fmt.Sprintf("no leader: %v", err)
		}
		leader = *l.Spec.HolderIdentity
		return leader != "" && leader != not, "the leader is " + leader
	})
	return leader
}

func dynamicClient(t *testing.T) dynamic.Interface {
	t.Helper()
	cfg, err := h.SB.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	d, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func nodeStatus(u *upgradeapi.Upgrade) map[string]upgradeapi.NodeStatus {
	out := map[string]upgradeapi.NodeStatus{}
	for _, n := range u.Status.Nodes {
		out[n.Name] = n
	}
	return out
}

func setPaused(t *testing.T, c upgradeapi.Client, paused bool) {
	t.Helper()
	ctx := context.Background()
	patch := fmt.Sprintf(`{"spec":{"paused":%v}}`, paused)
	if _, err := c.Dynamic.Resource(upgradeapi.Resource).Patch(ctx, h.SB.NewVersion, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("upgrade %s: paused %v", h.SB.NewVersion, paused)
}

// kubeletStarts counts, per node, the kubelet's "Starting kubelet."
// Events since since: one per kubelet process.
func kubeletStarts(t *testing.T, since time.Time) map[string]int {
	t.Helper()
	evs, err := h.Client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{FieldSelector: "reason=Starting"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range evs.Items {
		if e.Source.Component == "kubelet" && e.InvolvedObject.Kind == "Node" && !e.FirstTimestamp.Time.Before(since.Truncate(time.Second)) {
			out[e.InvolvedObject.Name]++
		}
	}
	return out
}

// checkPrinterColumns reads the Upgrades as kubectl get does (the API
// server's Table) and checks the columns and the upgrade's row.
func checkPrinterColumns(t *testing.T) {
	t.Helper()
	var table metav1.Table
	err := h.Client.CoreV1().RESTClient().Get().AbsPath("/apis", upgradeapi.Group, upgradeapi.Version, "upgrades").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(context.Background()).Into(&table)
	if err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range table.ColumnDefinitions {
		cols = append(cols, c.Name)
	}
	for _, want := range []string{"Name", "Version", "Phase", "Progress"} {
		if !slices.Contains(cols, want) {
			t.Errorf("kubectl get upgrades: no column %s in %v", want, cols)
		}
	}
	for _, r := range table.Rows {
		if fmt.Sprint(r.Cells[0]) == h.SB.NewVersion {
			row := fmt.Sprint(r.Cells)
			if !strings.Contains(row, upgradeapi.Complete) || !strings.Contains(row, "4/4") {
				t.Errorf("kubectl get upgrades: %s's row %s, want Complete and 4/4", h.SB.NewVersion, row)
			}
			return
		}
	}
	t.Errorf("kubectl get upgrades: no row of %s", h.SB.NewVersion)
}

// logs is the controller pods' logs, for a failure's message.
func logs(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, p := range controllerPods(t) {
		out, err := h.Client.CoreV1().Pods(agent.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).Do(context.Background()).Raw()
		fmt.Fprintf(&b, "--- %s (%v):\n%s\n", p.Name, err, out)
	}
	return b.String()
}
