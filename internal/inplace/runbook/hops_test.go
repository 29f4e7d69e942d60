package runbook

import (
	"context"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/driver/binary"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/preflight/preflighttest"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
)

// hopWorld is newWorld's cluster at v1.30.14 with a target of v1.33.13,
// through v1.31.14 and v1.32.13 when hops is set.
func hopWorld(t *testing.T, hops bool) *preflighttest.World {
	t.Helper()
	w := preflighttest.New(t)
	to := lookup(t, w.Catalog, "v1.33.13")
	tgt := w.Opts.Target
	tgt.Version, tgt.Catalog = to.Parsed(), to
	tgt.Manifest.KubernetesVersion, tgt.Manifest.Release = to.Version, *to
	if hops {
		for _, v := range []string{"v1.31.14", "v1.32.13"} {
			rel := lookup(t, w.Catalog, v)
			tgt.Hops = append(tgt.Hops, &release.Release{Version: rel.Parsed(), Catalog: rel, Manifest: &bundle.Manifest{KubernetesVersion: v, Release: *rel}})
		}
	}
	return w
}

func lookup(t *testing.T, c *catalog.Catalog, v string) *catalog.Release {
	t.Helper()
	r, err := c.Lookup(v)
	if err != nil {
		t.Fatal(err)
	}
	rr := *r
	return &rr
}

func TestPathThroughHops(t *testing.T) {
	// Without hops, v1.30 to v1.33 skips two minors.
	w := hopWorld(t, false)
	fs := preflighttest.Only(w.Plan(t), "path")
	preflighttest.Want(t, fs, preflight.Blocking, "node/cp-1", "kube-apiserver runs v1.30.14: v1.33.13 skips a minor version")
	// With them, the next release on the way is v1.31.14, which takes
	// v1.30, and kubelets three minors back are within the skew.
	w = hopWorld(t, true)
	p := w.Plan(t)
	if fs := append(preflighttest.Only(p, "path"), preflighttest.Only(p, "skew")...); len(fs) != 0 {
		t.Errorf("findings %+v, want none", fs)
	}
	// The control plane's steps go through each hop, every control-plane
	// node at one before the next.
	var cp []string
	for _, s := range p.Steps {
		if s.Phase == preflight.PhaseControlPlane {
			cp = append(cp, s.Version+":"+strings.Join(s.Nodes, ","))
		}
	}
	if got := strings.Join(cp, " "); got != "v1.31.14:cp-1 v1.32.13:cp-1 v1.33.13:cp-1" {
		t.Errorf("control-plane steps %s", got)
	}
	// A control plane resumed after the first hop goes on from there.
	for _, c := range release.ControlPlaneFiles {
		w.View.Facts["cp-1"].Components[c] = "v1.31.14"
	}
	if fs := preflighttest.Only(w.Plan(t), "path"); len(fs) != 0 {
		t.Errorf("at the first hop: findings %+v, want none", fs)
	}
	// A kubeadm control plane moves one minor per apply.
	w.View.Kubeadm = &kubeadm.Config{}
	fs = preflighttest.Only(w.Plan(t), "path")
	preflighttest.Want(t, fs, preflight.Blocking, "node/cp-1", "kube-apiserver runs v1.31.14: the way to v1.33.13 passes through v1.31.14, v1.32.13, and kubelift moves a kubeadm control plane one minor at a time")
	w.View.Kubeadm = nil
	// One that jumped past a hop is refused.
	w.View.Facts["cp-1"].Components["kube-apiserver"] = "v1.29.15"
	fs = preflighttest.Only(w.Plan(t), "path")
	preflighttest.Want(t, fs, preflight.Blocking, "node/cp-1", "kube-apiserver runs v1.29.15: v1.31.14 skips a minor version", "the bundle passes through v1.31.14, v1.32.13")
}

func TestRemovedOnTheWay(t *testing.T) {
	w := hopWorld(t, true)
	// --keep-terminated-pod-volumes went in v1.31: the first hop.
	w.View.Facts["worker-1"].AddFlags("kubelet", "/etc/systemd/system/kubelet.service", []string{"--keep-terminated-pod-volumes=false"})
	fs := preflighttest.Only(w.Plan(t), "removed-flags")
	preflighttest.Want(t, fs, preflight.Blocking, "node/worker-1", "kubelet is started with --keep-terminated-pod-volumes", "which v1.31.14 removed")

	// flowcontrol v1beta3 went in v1.32: the second hop.
	c := fake.NewClientset()
	c.Resources = []*metav1.APIResourceList{{GroupVersion: "flowcontrol.apiserver.k8s.io/v1beta3", APIResources: []metav1.APIResource{
		{Name: "flowschemas", Kind: "FlowSchema", Verbs: []string{"list"}}}}}
	w.Opts.Client = c
	gvr := schema.GroupVersionResource{Group: "flowcontrol.apiserver.k8s.io", Version: "v1beta3", Resource: "flowschemas"}
	fsObj := &unstructured.Unstructured{}
	fsObj.SetAPIVersion(gvr.GroupVersion().String())
	fsObj.SetKind("FlowSchema")
	fsObj.SetName("mine")
	fsObj.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "helm", APIVersion: "flowcontrol.apiserver.k8s.io/v1beta3"}})
	w.Opts.Dynamic = dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "FlowSchemaList"}, fsObj)
	preflighttest.Want(t, preflighttest.Only(w.Plan(t), "removed-apis"), preflight.Blocking, "flowschemas.flowcontrol.apiserver.k8s.io/mine", "which v1.32 no longer serves")
}

// The binary driver moves a control-plane node through a hop and on to
// the target: each part backed up under the version it ran, the hop's
// staged program swapped in, waited for at that version; a re-run skips
// what is there already, and a part past a hop is not moved back to it.
func TestBinaryDriverThroughHops(t *testing.T) {
	w := hopWorld(t, false)
	hop := lookup(t, w.Catalog, "v1.31.14")
	sum := func(name, v string) string { return fmt.Sprintf("%064x", len(name)+len(v)) }
	hopT := &release.Release{Version: hop.Parsed(), Catalog: hop, Manifest: &bundle.Manifest{KubernetesVersion: hop.Version}}
	target := &release.Release{Version: catalog.Version{Major: 1, Minor: 32, Patch: 13}, Manifest: &bundle.Manifest{KubernetesVersion: "v1.32.13"}, Hops: []*release.Release{hopT}}
	for _, c := range release.ControlPlaneFiles {
		hopT.Manifest.Files = append(hopT.Manifest.Files, bundle.File{Name: c, Arch: "amd64", SHA256: sum(c, "v1.31.14")})
		target.Manifest.Files = append(target.Manifest.Files, bundle.File{Name: c, Arch: "amd64", SHA256: sum(c, "v1.32.13")})
	}
	running, installed := map[string]string{}, map[string]string{}
	for _, c := range release.ControlPlaneFiles {
		running[c], installed[c] = "v1.30.14", "v1.30.14"
	}
	var mu sync.Mutex
	var log []string
	node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
		nodescript.Running.Name: func(args []string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			if running[args[0]] == "" {
				return "", nil
			}
			return "Kubernetes " + running[args[0]] + "\npid 4242\n", nil
		},
		nodescript.Installed.Name: func(args []string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			return "Kubernetes " + installed[path.Base(args[0])], nil
		},
		nodescript.Backup.Name: func(args []string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			log = append(log, "backup "+args[1]+" "+args[3]+" to "+args[0])
			return "", nil
		},
		nodescript.Swap.Name: func(args []string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			v := path.Base(path.Dir(args[0]))
			if args[1] != sum(args[3], v) {
				return "", fmt.Errorf("sha256 %s is not %s's of %s", args[1], args[3], v)
			}
			running[args[3]], installed[args[3]] = v, v
			log = append(log, "swap "+args[3]+" "+args[0])
			return "", nil
		},
	}}
	nodes := []preflight.NodeState{{Name: "cp-1", Role: release.RoleControlPlane, Arch: "amd64", Kubelet: "v1.30.14", Components: map[string]string{}}}
	for _, c := range release.ControlPlaneFiles {
		nodes[0].Components[c] = "v1.30.14"
	}
	r := &upgradeRun{client: fake.NewClientset(), target: target, log: slog.New(slog.DiscardHandler), res: &ApplyResult{},
		opts: ApplyOptions{ReadyTimeout: time.Minute, BackupDir: "/var/lib/kubelift/backup",
			Plan: preflight.PlanOptions{Connector: fakeConnector{node}, StageDir: "/var/lib/kubelift/staged", Now: time.Now}},
		plan:  &preflight.Plan{From: []string{"v1.30.14"}, Nodes: nodes},
		view:  &preflight.View{Facts: map[string]*nodefacts.Facts{"cp-1": {Components: map[string]string{"kubelet": "v1.30.14"}}}},
		state: &record.Upgrade{}, tgts: map[string]nodeaccess.Address{"cp-1": {Name: "cp-1", Role: release.RoleControlPlane}}, driver: binary.Driver{}}
	ctx := context.Background()
	if err := r.controlPlaneStep(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{}
	for _, step := range [][2]string{{"v1.30.14", "v1.31.14"}, {"v1.31.14", "v1.32.13"}} {
		for _, c := range release.ControlPlaneFiles {
			want = append(want, "backup "+c+" "+step[0]+" to /var/lib/kubelift/backup/"+step[0], "swap "+c+" /var/lib/kubelift/staged/"+step[1]+"/"+c)
		}
	}
	if strings.Join(log, "\n") != strings.Join(want, "\n") {
		t.Errorf("ran:\n%s\nwant:\n%s", strings.Join(log, "\n"), strings.Join(want, "\n"))
	}
	if r.state.State != record.StateUpgradedControlPlane || r.state.Nodes[0].Step != "control plane at v1.32.13" {
		t.Errorf("state %s, node %+v", r.state.State, r.state.Nodes)
	}
	// Again: at the target, nothing moves; past the hop, nothing goes back.
	log = nil
	if err := r.controlPlaneStep(ctx); err != nil || len(log) != 0 {
		t.Errorf("re-run: %v, ran %q", err, log)
	}
	// A part past the hop that stopped running (its program at the
	// target) is neither moved back to the hop nor guessed at: the run
	// stops naming it.
	running["kube-scheduler"] = ""
	log = nil
	err := r.controlPlaneStep(ctx)
	if err == nil || !strings.Contains(err.Error(), "node cp-1: kube-scheduler's program is v1.32.13 already but it does not run") || len(log) != 0 {
		t.Errorf("stopped scheduler: %v, ran %q", err, log)
	}
	// One whose program is the hop's but does not run (swapped, then the
	// run was killed before it was healthy) is not moved on either.
	running["kube-scheduler"], installed["kube-scheduler"] = "", "v1.31.14"
	log = nil
	err = r.controlPlaneStep(ctx)
	if err == nil || !strings.Contains(err.Error(), "kube-scheduler's program is v1.31.14 already but it does not run") || len(log) != 0 {
		t.Errorf("scheduler stopped at the hop: %v, ran %q", err, log)
	}
}

// Without hops, a part newer than the target is swapped when the catalog
// allows the patch downgrade (plan checks that): the driver does not take
// "newer" for "done".
func TestBinaryDriverPatchDowngrade(t *testing.T) {
	w := preflighttest.New(t)
	to := lookup(t, w.Catalog, "v1.31.4")
	to.Version = "v1.31.3" // a target older than what runs
	target := &release.Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 3}, Catalog: to, Manifest: &bundle.Manifest{KubernetesVersion: "v1.31.3"}}
	for _, c := range release.ControlPlaneFiles {
		target.Manifest.Files = append(target.Manifest.Files, bundle.File{Name: c, Arch: "amd64", SHA256: strings.Repeat("a", 64)})
	}
	var swapped []string
	node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
		nodescript.Running.Name: func(args []string) (string, error) {
			for _, s := range swapped {
				if s == args[0] {
					return "Kubernetes v1.31.3\npid 4242\n", nil
				}
			}
			return "Kubernetes v1.31.4\npid 4242\n", nil
		},
		nodescript.Backup.Name: func([]string) (string, error) { return "", nil },
		nodescript.Swap.Name: func(args []string) (string, error) {
			swapped = append(swapped, args[3])
			return "", nil
		},
	}}
	nodes := []preflight.NodeState{{Name: "cp-1", Role: release.RoleControlPlane, Arch: "amd64", Kubelet: "v1.31.4", Components: map[string]string{}}}
	for _, c := range release.ControlPlaneFiles {
		nodes[0].Components[c] = "v1.31.4"
	}
	r := &upgradeRun{client: fake.NewClientset(), target: target, log: slog.New(slog.DiscardHandler), res: &ApplyResult{},
		opts:  ApplyOptions{ReadyTimeout: time.Minute, Plan: preflight.PlanOptions{Connector: fakeConnector{node}, Now: time.Now}},
		plan:  &preflight.Plan{From: []string{"v1.31.4"}, Nodes: nodes},
		view:  &preflight.View{Facts: map[string]*nodefacts.Facts{"cp-1": {Components: map[string]string{"kubelet": "v1.31.4"}}}},
		state: &record.Upgrade{}, tgts: map[string]nodeaccess.Address{"cp-1": {Name: "cp-1", Role: release.RoleControlPlane}}, driver: binary.Driver{}}
	if err := r.controlPlaneStep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if strings.Join(swapped, ",") != strings.Join(release.ControlPlaneFiles, ",") {
		t.Errorf("swapped %v, want every part", swapped)
	}
}

// fakeConnector dials the one fake node.
type fakeConnector struct{ n *fakenode.Node }

func (c fakeConnector) Dial(context.Context, nodeaccess.Address) (nodeaccess.Node, error) {
	return c.n, nil
}
