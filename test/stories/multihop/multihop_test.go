// Package multihop tests an upgrade across several minors in one apply,
// end to end on a sandbox of its own (1 control plane, 2 workers at
// v1.30.14, containerd): the bundle carries the control plane of v1.31.14
// (bundle create --from); an object written through an API v1.32 removes
// is refused at plan; apply killed between the hop and the target resumes
// at the target; the control plane passes through the hop while every
// kubelet goes once, straight to v1.32.13 (across the kubelet's hash
// change of v1.31), with the hash-skip file, and no shop container
// restarts; then an image set in place is acted on.
//
// Two minors, not three: a third would build a fourth Kubernetes release
// for this story alone (about 5 minutes of both cores on a cold machine);
// what a second hop adds (the removals of every minor on the way, the
// order of hops) is tested in internal/inplace/runbook's hops_test.go and
// internal/catalog's.
package multihop

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/upgradelock"
	"github.com/kubelift/kubelift/test/env/harness"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

// The versions of the story: the hops are the catalog's newest patches of
// the minors in between.
const (
	from   = "v1.30.14"
	target = "v1.32.13"
)

var hops = []string{"v1.31.14"}

var h *harness.Harness

func TestMain(m *testing.M) {
	harness.Main(m, "kmh", "10.90.0", 1, 2, func(x *harness.Harness) { h = x }, harness.From(from), harness.Target(target))
}

func apiserverVersion(t *testing.T) string {
	t.Helper()
	v, err := h.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	return v.GitVersion
}

// args are apply's or plan's flags against the sandbox (apply's put back
// the label pinned-ssd's node lost).
func args(verb string, extra ...string) ([]string, string) {
	reg, pw := h.RegistryFlags()
	a := append(append([]string{verb, "--to", target, "--key", h.Key()}, reg...), h.SSHFlags()...)
	if verb == "apply" {
		a = append(a, "--restore-labels")
	}
	return append(a, extra...), pw
}

// The bundle carries each hop's control plane, signed with the rest, and
// says so.
func TestBundleCarriesTheHops(t *testing.T) {
	r := h.Upgrade(t, "", "inspect", "-o", "json", h.HashSkipBundle)
	var m struct {
		Hops []struct {
			Version string
			Files   []struct{ Name, Path string }
		}
	}
	if err := json.Unmarshal([]byte(r.Stdout), &m); err != nil || r.Code != 0 {
		t.Fatalf("inspect: exit %d %v\n%s%s", r.Code, err, r.Stdout, r.Stderr)
	}
	var got []string
	for _, hop := range m.Hops {
		names := map[string]bool{}
		for _, f := range hop.Files {
			names[f.Name] = true
		}
		for _, want := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			if !names[want] {
				t.Errorf("hop %s carries no %s: %v", hop.Version, want, hop.Files)
			}
		}
		got = append(got, hop.Version)
	}
	if fmt.Sprint(got) != fmt.Sprint(hops) {
		t.Errorf("bundle hops %v, want %v\n%s", got, hops, r.Stdout)
	}
}

// flowSchemas is the API v1.32 stops serving (flowcontrol v1beta3).
var flowSchemas = schema.GroupVersionResource{Group: "flowcontrol.apiserver.k8s.io", Version: "v1beta3", Resource: "flowschemas"}

// An object written through an API the target's minor removes is refused
// at plan, naming the object and that minor; written again through a
// served version, it is not.
func TestRemovedAPIIsRefusedAtPlan(t *testing.T) {
	h.Import(t, h.HashSkipBundle)
	ctx := context.Background()
	rc, err := h.SB.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	fs := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "flowcontrol.apiserver.k8s.io/v1beta3", "kind": "FlowSchema",
		"metadata": map[string]any{"name": "shop-batch"},
		"spec": map[string]any{
			"priorityLevelConfiguration": map[string]any{"name": "workload-low"},
			"matchingPrecedence":         int64(5000),
			"rules": []any{map[string]any{
				"subjects":      []any{map[string]any{"kind": "ServiceAccount", "serviceAccount": map[string]any{"namespace": "shop", "name": "default"}}},
				"resourceRules": []any{map[string]any{"verbs": []any{"*"}, "apiGroups": []any{"*"}, "resources": []any{"*"}, "namespaces": []any{"*"}}},
			}},
		},
	}}
	if _, err := dyn.Resource(flowSchemas).Create(ctx, fs, metav1.CreateOptions{FieldManager: "shop-deployer"}); err != nil {
		t.Fatalf("create a FlowSchema through %s: %v", flowSchemas.GroupVersion(), err)
	}
	a, pw := args("plan", "-o", "json", "-q")
	// plan's findings on the FlowSchema (and its exit: 4, blocked).
	planFindings := func() (int, []string) {
		r := h.Upgrade(t, pw, a...)
		var p struct {
			Findings []struct{ Severity, Check, Object, Message string }
		}
		if err := json.Unmarshal([]byte(r.Stdout), &p); err != nil {
			t.Fatalf("plan: exit %d %v\n%s%s", r.Code, err, r.Stdout, r.Stderr)
		}
		var out []string
		for _, f := range p.Findings {
			if f.Check == "removed-apis" && strings.Contains(f.Object, "/shop-batch") {
				out = append(out, fmt.Sprintf("%s %s: %s", f.Severity, f.Object, f.Message))
			}
		}
		return r.Code, out
	}
	code, found := planFindings()
	if code != 4 || len(found) != 1 || !strings.HasPrefix(found[0], "blocking flowschemas.flowcontrol.apiserver.k8s.io/shop-batch:") ||
		!strings.Contains(found[0], "v1.32") || !strings.Contains(found[0], "shop-deployer") {
		t.Errorf("plan with a FlowSchema written through v1beta3: exit %d, findings on it %q; want exit 4 and one blocking, naming v1.32 and the writer", code, found)
	}
	if v := apiserverVersion(t); v != from {
		t.Errorf("the API server runs %s after plan", v)
	}
	// Written again through v1 (what the finding says to do), by the
	// same manager: the plan passes.
	if err := dyn.Resource(flowSchemas).Delete(ctx, "shop-batch", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	v1 := flowSchemas
	v1.Version = "v1"
	fs.SetAPIVersion("flowcontrol.apiserver.k8s.io/v1")
	if _, err := dyn.Resource(v1).Create(ctx, fs, metav1.CreateOptions{FieldManager: "shop-deployer"}); err != nil {
		t.Fatalf("create the FlowSchema through v1: %v", err)
	}
	if _, found := planFindings(); len(found) != 0 {
		t.Errorf("plan after the FlowSchema was written through v1: %q", found)
	}
}

// One apply, killed between the hop and the target and run again: the
// control plane goes through v1.31.14 to v1.32.13 (the log and status say
// each), every kubelet straight to the target; no shop container restarts
// and the prober sees nothing fail.
func TestOneApplyThroughTheHops(t *testing.T) {
	ctx := context.Background()
	before := h.Shop(t)
	probe := h.Probe(t)
	a, pw := args("apply", "--settle", "5s", "--lock-duration", "15s")
	cmd, lines, err := h.StartLines(pw, a...)
	if err != nil {
		t.Fatal(err)
	}
	// Between the hop and the target: killed as it starts the target,
	// every part of cp-1 at the hop (its log says so line by line).
	var log []string
	second := fmt.Sprintf(`msg="control plane" to=%s hop=false`, target)
	timeout := time.After(15 * time.Minute)
	for killed := false; !killed; {
		select {
		case l, ok := <-lines:
			if !ok {
				_ = cmd.Wait()
				t.Fatalf("apply ended before the control plane's move to the target:\n%s", strings.Join(log, "\n"))
			}
			log = append(log, l)
			if strings.Contains(l, second) {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				killed = true
			}
		case <-timeout:
			_ = cmd.Process.Kill()
			t.Fatalf("no move to the target within 15 minutes:\n%s", strings.Join(log, "\n"))
		}
	}
	for l := range lines {
		log = append(log, l)
	}
	_ = cmd.Wait()
	joined := strings.Join(log, "\n")
	for _, comp := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if !strings.Contains(joined, fmt.Sprintf("msg=upgraded node=cp-1 component=%s version=%s", comp, hops[0])) {
			t.Errorf("the killed apply's log does not say cp-1's %s moved to the hop %s:\n%s", comp, hops[0], joined)
		}
	}
	// status says the hops and what the API server runs.
	st := h.Upgrade(t, "", "status")
	for _, want := range []string{"passes through " + strings.Join(hops, ", "), "API server: " + apiserverVersion(t)} {
		if !strings.Contains(st.Stdout, want) {
			t.Errorf("status after the kill does not say %q:\n%s%s", want, st.Stdout, st.Stderr)
		}
	}
	if v := apiserverVersion(t); v != hops[0] && v != target {
		t.Errorf("after the kill between the hop and the target the API server runs %s", v)
	}
	for _, m := range h.SB.Nodes() {
		if m.Role == "worker" {
			if v := h.Node(t, m.Name).Status.NodeInfo.KubeletVersion; v != from {
				t.Errorf("%s's kubelet at %s while the control plane was between the hop and the target", m.Name, v)
			}
		}
	}
	harness.WaitFor(t, "the killed run's lease to expire", func() bool {
		l, err := h.Client.CoordinationV1().Leases("kube-system").Get(ctx, upgradelock.Name, metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) > 16*time.Second
	})
	r := h.UpgradeWithin(t, 20*time.Minute, pw, a...)
	if r.Code != 0 {
		t.Fatalf("resumed apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	for _, comp := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		// once, by one run or the other; the API server may have been
		// swapped in the moment between the killed run's line and the
		// kill: the resumed run found it there (its version is checked
		// below)
		line := fmt.Sprintf("msg=upgraded node=cp-1 component=%s version=%s", comp, target)
		n := strings.Count(joined, line) + strings.Count(r.Stderr, line)
		if n != 1 && (n != 0 || comp != "kube-apiserver") {
			t.Errorf("cp-1's %s moved to %s %d times by the two applies:\n%s\n%s", comp, target, n, joined, r.Stderr)
		}
		if strings.Contains(r.Stderr, fmt.Sprintf("component=%s version=%s", comp, hops[0])) {
			t.Errorf("the resumed apply moved %s to the first hop again:\n%s", comp, r.Stderr)
		}
	}
	if v := apiserverVersion(t); v != target {
		t.Errorf("API server %s, want %s", v, target)
	}
	for _, m := range h.SB.Nodes() {
		n := h.Node(t, m.Name)
		if n.Status.NodeInfo.KubeletVersion != target || !sandbox.NodeReady(n) {
			t.Errorf("%s: kubelet %s, ready %v", m.Name, n.Status.NodeInfo.KubeletVersion, sandbox.NodeReady(n))
		}
		for _, comp := range []string{"kube-controller-manager", "kube-scheduler"} {
			if m.Role != "control-plane" {
				continue
			}
			if out := h.SSH(t, m.Name, "/usr/local/bin/"+comp+" --version"); !strings.Contains(out, target) {
				t.Errorf("%s: %s --version says %q", m.Name, comp, strings.TrimSpace(out))
			}
		}
	}
	if st := h.Status(t); st.State != record.StateComplete || st.Backup == "" {
		t.Errorf("state %s, etcd backup %q", st.State, st.Backup)
	}
	after := h.Shop(t)
	for id, what := range before {
		if _, ok := after[id]; !ok {
			t.Errorf("container %s (%s) restarted", id, what)
		}
	}
	pods, err := h.Client.CoreV1().Pods(sandbox.WorkloadNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount != 0 || p.Status.Phase != corev1.PodRunning {
				t.Errorf("pod %s (%s) container %s restarted %d times", p.Name, p.Status.Phase, c.Name, c.RestartCount)
			}
		}
	}
	h.NoDisruption(t, probe.Stop())
}

func stateNodesOf(st *record.Upgrade) []record.Node {
	if st == nil {
		return nil
	}
	return st.Nodes
}

// After the multi-hop upgrade, while the hash-skip file is on the node, an
// image set in place on a container the v1.30 kubelet started is acted on
// by the v1.32 kubelet (that container restarts with it), and no other
// container restarts.
func TestImageSetInPlaceAfterTheHops(t *testing.T) {
	pod := h.HashSkipShopPod(t, func(p *corev1.Pod) bool { return len(p.Spec.Containers) == 2 })
	name := pod.Name
	before := h.Shop(t)
	proxyID := h.SetProxyImage(t, pod)
	now := h.Shop(t)
	for id, what := range before {
		if _, ok := now[id]; !ok && id != proxyID {
			t.Errorf("container %s (%s) no longer runs", what, id)
		}
	}
	if _, ok := now[proxyID]; ok {
		t.Errorf("%s's proxy still runs its old container %s", name, proxyID)
	}
}
