// Package preflighttest builds the world the plan's checks are tested
// on: a cluster of cp-1 and worker-1, worker-2 at v1.30.14, read as
// BuildPlan reads one, with a target of v1.31.4 (its files made up);
// each test changes what its finding is about.
package preflighttest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// World is a cluster of cp-1 and worker-1, worker-2 at v1.30.14, read as
// BuildPlan reads one, for the checks to run on; each test changes what
// its finding is about.
type World struct {
	Opts    preflight.PlanOptions
	View    *preflight.View
	Catalog *catalog.Catalog
}

// Node is a Ready node of role at v1.30.14, amd64, on containerd 2.1.4,
// labelled disk=ssd.
func Node(name, role string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"node-role.kubernetes.io/" + role: "", "disk": "ssd"}}}
	n.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "v1.30.14", Architecture: "amd64", ContainerRuntimeVersion: "containerd://2.1.4"}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0." + name[len(name)-1:]}}
	return n
}

// Pod is a pod of namespace shop on nodeName, with the not-ready and
// unreachable tolerations when tolerate.
func Pod(name, nodeName string, tolerate bool) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "app", Image: "shop/app:1"}}}}
	if tolerate {
		sec := int64(300)
		for _, k := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
			p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: k, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &sec})
		}
	}
	return p
}

// New is the world, its target v1.31.4.
func New(t testing.TB) *World {
	t.Helper()
	cat, err := catalog.Default()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := cat.Lookup("v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	r := *rel
	m := &bundle.Manifest{KubernetesVersion: "v1.31.4", Arches: []string{"amd64"}, Release: r}
	for _, n := range release.FilesFor(release.RoleControlPlane) {
		m.Files = append(m.Files, bundle.File{Name: n, Arch: "amd64", Path: "bin/linux/amd64/" + n, SHA256: strings.Repeat("a", 63) + n[:1], Size: 1 << 20})
	}
	target := &release.Release{Version: rel.Parsed(), Manifest: m, Catalog: &r, Record: &cluster.Available{KubernetesVersion: "v1.31.4", BundleDigest: "sha256:abc"}}
	nodes := []corev1.Node{Node("cp-1", "control-plane"), Node("worker-1", "worker"), Node("worker-2", "worker")}
	w := &World{Catalog: cat, View: &preflight.View{Nodes: nodes, Facts: map[string]*nodefacts.Facts{}, SSH: map[string]error{}}}
	for _, n := range nodes {
		role := release.RoleWorker
		if n.Name == "cp-1" {
			role = release.RoleControlPlane
		}
		w.View.Addresses = append(w.View.Addresses, Address(n.Name, role))
		f := &nodefacts.Facts{Name: n.Name, Components: map[string]string{"kubelet": "v1.30.14"}, Flags: map[string][]string{}, FlagSources: map[string]string{},
			Values: map[string]string{}, Staged: map[string]string{}, FreeBytes: 10 << 30}
		if role == release.RoleControlPlane {
			for _, c := range release.ControlPlaneFiles {
				f.Components[c] = "v1.30.14"
			}
		}
		w.View.Facts[n.Name] = f
	}
	w.Opts = preflight.PlanOptions{Client: fake.NewClientset(), Target: target, Catalog: cat, StageDir: release.DefaultStageDir,
		Now: func() time.Time { return time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC) }}
	return w
}

// Retarget makes the catalog's version the world's target, and returns
// the target's own copy of its catalog entry (a test may change it).
func (w *World) Retarget(t testing.TB, version string) *catalog.Release {
	t.Helper()
	rel, err := w.Catalog.Lookup(version)
	if err != nil {
		t.Fatal(err)
	}
	r := *rel
	w.Opts.Target.Version, w.Opts.Target.Catalog = r.Parsed(), &r
	return &r
}

// Plan evaluates the checks over the world.
func (w *World) Plan(t *testing.T) *preflight.Plan {
	t.Helper()
	p, err := preflight.Evaluate(context.Background(), w.Opts, w.View)
	if err != nil && !errors.Is(err, preflight.ErrBlocked) {
		t.Fatal(err)
	}
	if (err != nil) != p.Blocked {
		t.Errorf("blocked %v, error %v", p.Blocked, err)
	}
	return p
}

// Only returns the findings of one check.
func Only(p *preflight.Plan, check preflight.Check) []preflight.Finding {
	var out []preflight.Finding
	for _, f := range p.Findings {
		if f.Check == check {
			out = append(out, f)
		}
	}
	return out
}

// Want fails t unless fs has a finding of sev about object whose message
// has every one of parts.
func Want(t *testing.T, fs []preflight.Finding, sev preflight.Severity, object string, parts ...string) {
	t.Helper()
	for _, f := range fs {
		if f.Severity != sev || f.Object != object {
			continue
		}
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(f.Message, p)
		}
		if ok {
			return
		}
	}
	t.Errorf("no %s finding about %s with %q in %+v", sev, object, parts, fs)
}

// Address is where the world reaches node name of role.
func Address(name, role string) nodeaccess.Address {
	return nodeaccess.Address{Name: name, Role: role, Address: "10.0.0.1"}
}
