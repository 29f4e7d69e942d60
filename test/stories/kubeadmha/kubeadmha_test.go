// Package kubeadmha upgrades a highly available kubeadm-built sandbox
// (three control planes with stacked etcd, joined with `kubeadm join
// --control-plane`, and a worker) from v1.31.4 to v1.31.14 with the built
// upgrade program, and rolls it back: `kubeadm upgrade apply` on cp-1 and
// `kubeadm upgrade node` on cp-2 and cp-3, every API server at the target
// before any kubelet restarts; then rollback puts each control plane back
// from the manifests kubeadm kept (the catalog lists v1.31.4 among
// v1.31.14's downgrades), kubeadm-config and kube-proxy's image too, with
// no shop container restarted and nothing failed for the prober, through
// both.
package kubeadmha

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/test/env/harness"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

// from is a patch below the sandbox's new version, v1.31.14.
const from = "v1.31.4"

// to is the sandbox's new version: the catalog's newest v1.31, also the
// hop of test/stories/multihop, so no release is built for this story alone.
const to = "v1.31.14"

var h *harness.Harness

func TestMain(m *testing.M) {
	harness.Main(m, "kha", "10.89.0", 3, 1, func(x *harness.Harness) { h = x }, harness.Kubeadm(), harness.From(from), harness.Target(to))
}

// staticPods maps NODE/COMPONENT to each static control-plane pod's
// image, "ready" or "not ready", and when its container started.
type staticPod struct {
	image   string
	ready   bool
	started time.Time
}

func staticPods(ctx context.Context) (map[string]staticPod, error) {
	pods, err := h.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "tier=control-plane"})
	if err != nil {
		return nil, err
	}
	out := map[string]staticPod{}
	for _, p := range pods.Items {
		sp := staticPod{image: p.Spec.Containers[0].Image}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				sp.ready = true
			}
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running != nil {
				sp.started = cs.State.Running.StartedAt.Time
			}
		}
		out[p.Spec.NodeName+"/"+p.Labels["component"]] = sp
	}
	return out, nil
}

// everywhere: on every control-plane node each static pod runs version's
// image from the cluster's imageRepository and is Ready, etcd among them;
// every Node reports its kubelet at version and Ready; kubeadm-config and
// the kube-proxy DaemonSet say version, and its pods all run it.
func everywhere(version string) func() (bool, string) {
	return func() (bool, string) {
		ctx := context.Background()
		got, err := staticPods(ctx)
		if err != nil {
			return false, err.Error()
		}
		repo := h.SB.ImageRepository()
		for _, m := range h.SB.Nodes() {
			if m.Role == "control-plane" {
				for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"} {
					want := repo + "/" + c + ":" + version
					if c == "etcd" {
						want = repo + "/etcd:" + sandbox.EtcdTag
					}
					if p := got[m.Name+"/"+c]; p.image != want || !p.ready {
						return false, fmt.Sprintf("%s/%s runs %q (ready %v), want %s", m.Name, c, p.image, p.ready, want)
					}
				}
			}
			n, err := h.Client.CoreV1().Nodes().Get(ctx, m.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if n.Status.NodeInfo.KubeletVersion != version || !sandbox.NodeReady(n) {
				return false, fmt.Sprintf("node %s: kubelet %s, ready %v", m.Name, n.Status.NodeInfo.KubeletVersion, sandbox.NodeReady(n))
			}
		}
		c, err := kubeadm.Read(ctx, h.Client)
		if err != nil || c == nil || c.KubernetesVersion.String() != version {
			return false, fmt.Sprintf("kubeadm-config: %v, %+v", err, c)
		}
		ds, err := h.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if img := ds.Spec.Template.Spec.Containers[0].Image; img != repo+"/kube-proxy:"+version {
			return false, "kube-proxy DaemonSet image " + img
		}
		s := ds.Status
		if s.ObservedGeneration < ds.Generation || s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberAvailable != s.DesiredNumberScheduled {
			return false, fmt.Sprintf("kube-proxy rolling out: %d of %d updated, %d available", s.UpdatedNumberScheduled, s.DesiredNumberScheduled, s.NumberAvailable)
		}
		return true, ""
	}
}

// steadyControlPlane checks, as soon as a command said it was done, that
// every control-plane node's static pods run version's image and are
// Ready, and that their containers (as the node's runtime lists them) are
// the same a minute later: an API server's restart makes a leading
// controller manager or scheduler exit a few seconds on.
func steadyControlPlane(t *testing.T, version string) {
	t.Helper()
	got, err := staticPods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	repo := h.SB.ImageRepository()
	containers := map[string]map[string]string{}
	for _, m := range h.SB.Nodes() {
		if m.Role != "control-plane" {
			continue
		}
		for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			if p, want := got[m.Name+"/"+c], repo+"/"+c+":"+version; p.image != want || !p.ready {
				t.Errorf("%s: %s runs %q (ready %v) when the command returned, want %s", m.Name, c, p.image, p.ready, want)
			}
		}
		containers[m.Name] = controlPlaneContainers(t, m.Name)
		if len(containers[m.Name]) != 3 {
			t.Errorf("%s: %d control-plane containers run when the command returned, want 3: %v", m.Name, len(containers[m.Name]), containers[m.Name])
		}
	}
	time.Sleep(time.Minute)
	for node, before := range containers {
		now := controlPlaneContainers(t, node)
		for what, id := range before {
			if now[what] != id {
				t.Errorf("%s: %s was container %.12s when the command returned, a minute later %.12s", node, what, id, now[what])
			}
		}
	}
}

// controlPlaneContainers maps each running API server, controller manager
// and scheduler container on node to its ID, read from the node's runtime.
func controlPlaneContainers(t *testing.T, node string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for id, what := range h.Running(t, node) {
		for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			if strings.HasPrefix(what, "kube-system/") && strings.HasSuffix(what, "/"+c) {
				out[c] = id
			}
		}
	}
	return out
}

// kubeletStarts is when each node's kubelet said it started (its
// "Starting" Event), after since.
func kubeletStarts(t *testing.T, since time.Time) map[string]time.Time {
	t.Helper()
	evs, err := h.Client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,reason=Starting"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]time.Time{}
	for _, e := range evs.Items {
		at := e.LastTimestamp.Time
		if e.Source.Component != "kubelet" || at.Before(since.Truncate(time.Second)) {
			continue
		}
		if prev, ok := out[e.InvolvedObject.Name]; !ok || at.Before(prev) {
			out[e.InvolvedObject.Name] = at
		}
	}
	return out
}

func TestHAPatchUpgradeThenRollback(t *testing.T) {
	harness.Eventually(t, 2*time.Minute, everywhere(from))
	h.Import(t, h.HashSkipBundle)
	before := h.Shop(t)
	if len(before) == 0 {
		t.Fatal("no shop containers running")
	}
	probe := h.Probe(t)

	began := time.Now()
	reg, pw := h.RegistryFlags()
	apply := append(append([]string{"apply", "--to", h.SB.NewVersion, "--key", h.Key(), "--settle", "5s", "--restore-labels"}, reg...), h.SSHFlags()...)
	r := h.UpgradeWithin(t, 20*time.Minute, pw, apply...)
	if r.Code != 0 {
		t.Fatalf("apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	for _, want := range []string{"node=cp-1 run=upgrade-apply-" + h.SB.NewVersion, "node=cp-2 run=upgrade-node-" + h.SB.NewVersion, "node=cp-3 run=upgrade-node-" + h.SB.NewVersion} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("apply did not run kubeadm as %q:\n%s", want, r.Stderr)
		}
	}
	harness.Eventually(t, 2*time.Minute, everywhere(h.SB.NewVersion))

	// Every API server ran the target before any kubelet restarted.
	pods, err := staticPods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var lastAPIServer time.Time
	for _, m := range h.SB.Nodes() {
		if p := pods[m.Name+"/kube-apiserver"]; m.Role == "control-plane" && p.started.After(lastAPIServer) {
			lastAPIServer = p.started
		}
	}
	starts := kubeletStarts(t, began)
	for _, m := range h.SB.Nodes() {
		at, ok := starts[m.Name]
		if !ok {
			t.Errorf("node %s: no kubelet Starting event since the apply began", m.Name)
		} else if at.Before(lastAPIServer) {
			t.Errorf("node %s: kubelet restarted at %s, before the last API server came up at the target (%s)", m.Name, at, lastAPIServer)
		}
	}

	// Back: the control planes from kubeadm's manifests, the kubelets
	// from the nodes' backups.
	r = h.UpgradeWithin(t, 15*time.Minute, "", append([]string{"rollback"}, h.SSHFlags()...)...)
	if r.Code != 0 {
		t.Fatalf("rollback: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	steadyControlPlane(t, from)
	harness.Eventually(t, 2*time.Minute, everywhere(from))
	st := h.Status(t)
	if st.State != record.StateRolledBack || st.From != from || st.To != h.SB.NewVersion || st.ControlPlane != release.KindKubeadm {
		t.Errorf("status after rollback: state %s, %s -> %s, control plane %q", st.State, st.From, st.To, st.ControlPlane)
	}
	for _, n := range st.Nodes {
		if n.Status != record.NodeRolledBack {
			t.Errorf("status after rollback: %s is %s (%s)", n.Name, n.Status, n.LastError)
		}
	}
	// What was replaced is kept on each control plane, beside kubeadm's
	// own backups.
	for _, m := range h.SB.Nodes() {
		if m.Role != "control-plane" {
			continue
		}
		out := h.SSH(t, m.Name, "ls "+kubeadm.TmpDir+"/kubelift-rollback-manifests-*/")
		for _, c := range []string{"kube-apiserver.yaml", "kube-controller-manager.yaml", "kube-scheduler.yaml"} {
			if !strings.Contains(out, c) {
				t.Errorf("%s: the %s replaced by rollback was not kept (%s)", m.Name, c, out)
			}
		}
	}
	// A second rollback has nothing left to put back.
	if r := h.Upgrade(t, "", append([]string{"rollback"}, h.SSHFlags()...)...); r.Code != 0 || strings.Contains(r.Stderr, "rolling back") {
		t.Fatalf("second rollback: exit %d (or it restored something)\n%s%s", r.Code, r.Stdout, r.Stderr)
	}

	res := probe.Stop()
	// What the node lifecycle controller saw, to read beside the prober.
	if evs, err := h.Client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "reason=NodeNotReady"}); err == nil {
		for _, e := range evs.Items {
			t.Logf("event %s %s: %s (%s)", e.LastTimestamp.Format(time.TimeOnly), e.InvolvedObject.Name, e.Message, e.Source.Component)
		}
	}
	after := h.Shop(t)
	for id, what := range before {
		if _, ok := after[id]; !ok {
			t.Errorf("shop container restarted: %s (%s)", what, id)
		}
	}
	h.NoDisruption(t, res)
}
