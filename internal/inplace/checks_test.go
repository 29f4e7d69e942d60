package inplace

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// world is a cluster of cp-1 and worker-1, worker-2 at v1.30.14, read as
// BuildPlan reads one, for the checks to run on; each test changes what
// its finding is about.
type world struct {
	opts PlanOptions
	view *clusterView
	cat  *catalog.Catalog
}

func node(name, role string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"node-role.kubernetes.io/" + role: "", "disk": "ssd"}}}
	n.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "v1.30.14", Architecture: "amd64"}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0." + name[len(name)-1:]}}
	return n
}

func pod(name, nodeName string, tolerate bool) corev1.Pod {
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

func newWorld(t testing.TB) *world {
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
	nodes := []corev1.Node{node("cp-1", "control-plane"), node("worker-1", "worker"), node("worker-2", "worker")}
	w := &world{cat: cat, view: &clusterView{nodes: nodes, facts: map[string]*nodefacts.Facts{}, ssh: map[string]error{}}}
	for _, n := range nodes {
		role := release.RoleWorker
		if n.Name == "cp-1" {
			role = release.RoleControlPlane
		}
		w.view.tgts = append(w.view.tgts, targetOf(n.Name, role))
		f := &nodefacts.Facts{Name: n.Name, Components: map[string]string{"kubelet": "v1.30.14"}, Flags: map[string][]string{}, FlagSources: map[string]string{},
			Values: map[string]string{}, Staged: map[string]string{}, FreeBytes: 10 << 30}
		if role == release.RoleControlPlane {
			for _, c := range release.ControlPlaneFiles {
				f.Components[c] = "v1.30.14"
			}
		}
		w.view.facts[n.Name] = f
	}
	w.opts = PlanOptions{Client: fake.NewClientset(), Target: target, Catalog: cat, StageDir: release.DefaultStageDir,
		Now: func() time.Time { return time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC) }}
	return w
}

func (w *world) plan(t *testing.T) *Plan {
	t.Helper()
	p, err := evaluate(context.Background(), w.opts, w.view)
	if err != nil && !errors.Is(err, ErrBlocked) {
		t.Fatal(err)
	}
	if (err != nil) != p.Blocked {
		t.Errorf("blocked %v, error %v", p.Blocked, err)
	}
	return p
}

// only returns the findings of one check.
func only(p *Plan, check Check) []Finding {
	var out []Finding
	for _, f := range p.Findings {
		if f.Check == check {
			out = append(out, f)
		}
	}
	return out
}

func want(t *testing.T, fs []Finding, sev Severity, object string, parts ...string) {
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

func TestPlanCleanClusterBlocksNothing(t *testing.T) {
	w := newWorld(t)
	p := w.plan(t)
	if p.Blocked {
		t.Fatalf("blocked: %+v", p.Findings)
	}
	// Unstaged files are said, not blocking, with how apply would stage
	// them where the node was asked.
	want(t, only(p, "staged"), Info, "node/worker-1", "kubelet", "not staged")
	w.view.paths = map[string][2]string{"worker-1": {stage.ViaRegistry, ""}, "worker-2": {stage.ViaSSH, "the registry cannot be reached from the node"}}
	p = w.plan(t)
	want(t, only(p, "staged"), Info, "node/worker-1", "not staged", "apply has the node pull them from the private registry")
	want(t, only(p, "staged"), Info, "node/worker-2", "not staged", "apply sends them over SSH (the registry cannot be reached from the node)")
	for _, n := range p.Nodes {
		if n.Name == "worker-2" && (n.StagePath != stage.ViaSSH || n.StagePathReason == "") {
			t.Errorf("worker-2's plan: %+v", n)
		}
	}
	var order []string
	for _, s := range p.Steps {
		order = append(order, s.Phase+":"+strings.Join(s.Nodes, ","))
	}
	if got := strings.Join(order, " "); got != "patch-tolerations: control-plane:cp-1 kubelets:cp-1 kubelets:worker-1 kubelets:worker-2" {
		t.Errorf("steps %s", got)
	}
}

func TestPathAndSkew(t *testing.T) {
	for _, tc := range []struct {
		name, apiserver, kubelet string
		sev                      Severity
		check, msg               string
	}{
		{"a minor skipped", "v1.29.15", "v1.29.15", Blocking, "path", "skips a minor"},
		{"not an upgrade source", "v1.30.0", "v1.30.0", Blocking, "path", "does not list it"},
		{"a downgrade across minors", "v1.32.0", "v1.31.4", Blocking, "path", "downgrade the catalog does not allow"},
		{"a kubelet newer than the target", "v1.30.14", "v1.32.0", Blocking, "skew", "newer than v1.31.4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			if tc.name == "not an upgrade source" {
				w.opts.Target.Catalog.UpgradeFrom = []string{"v1.30.1-v1.30.14"}
				if err := w.opts.Target.Catalog.Check("test"); err != nil {
					t.Fatal(err)
				}
			}
			for c := range w.view.facts["cp-1"].Components {
				if c != "kubelet" {
					w.view.facts["cp-1"].Components[c] = tc.apiserver
				}
			}
			w.view.nodes[1].Status.NodeInfo.KubeletVersion = tc.kubelet
			p := w.plan(t)
			obj := "node/cp-1"
			if tc.check == "skew" {
				obj = "node/worker-1"
			}
			want(t, only(p, Check(tc.check)), tc.sev, obj, tc.msg)
		})
	}
	// A patch downgrade the catalog allows is fine.
	w := newWorld(t)
	rel, _ := w.cat.Lookup("v1.31.4")
	w.opts.Target.Version, w.opts.Target.Catalog = catalog.Version{Major: 1, Minor: 31, Patch: 0}, rel
	for c := range w.view.facts["cp-1"].Components {
		w.view.facts["cp-1"].Components[c] = "v1.31.4"
	}
	if fs := only(w.plan(t), "path"); len(fs) != 0 {
		t.Errorf("allowed patch downgrade: %+v", fs)
	}
}

func TestUnreachableNodeBlocks(t *testing.T) {
	w := newWorld(t)
	delete(w.view.facts, "worker-2")
	w.view.ssh["worker-2"] = errors.New("node worker-2 (10.0.0.2:22): dial: connection refused")
	want(t, only(w.plan(t), "ssh"), Blocking, "node/worker-2", "connection refused")
}

func TestHealth(t *testing.T) {
	w := newWorld(t)
	w.view.nodes[2].Status.Conditions[0].Status = corev1.ConditionFalse
	// The scheduler holds a stale lease; the controller manager has none
	// and is not running.
	old := metav1.NewMicroTime(w.opts.Now().Add(-time.Hour))
	d := int32(15)
	w.opts.Client = fake.NewClientset(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-scheduler", Namespace: "kube-system"},
		Spec: coordinationv1.LeaseSpec{RenewTime: &old, LeaseDurationSeconds: &d}})
	delete(w.view.facts["cp-1"].Components, "kube-controller-manager")
	p := w.plan(t)
	h := only(p, "health")
	want(t, h, Blocking, "node/worker-2", "not Ready")
	want(t, h, Blocking, "lease/kube-system/kube-scheduler", "no live lease")
	want(t, h, Blocking, "node/cp-1", "kube-controller-manager is not running")
}

func TestStagedAndDisk(t *testing.T) {
	w := newWorld(t)
	for _, f := range w.opts.Target.Manifest.Files {
		w.view.facts["worker-1"].Staged[f.Name] = f.SHA256
	}
	w.view.facts["worker-2"].FreeBytes = 1 << 20
	p := w.plan(t)
	for _, n := range p.Nodes {
		if (n.Name == "worker-1") != n.Staged {
			t.Errorf("%s staged %v", n.Name, n.Staged)
		}
	}
	want(t, only(p, "disk"), Blocking, "node/worker-2", "1 MiB free")
	if fs := only(p, "disk"); len(fs) != 1 {
		t.Errorf("disk findings %+v", fs)
	}
}

func TestRemovedFlags(t *testing.T) {
	w := newWorld(t)
	w.opts.Target.Catalog.RemovedFlags = map[string][]string{"kube-controller-manager": {"--pod-eviction-timeout"}}
	w.view.facts["worker-1"].AddFlags("kubelet", "/var/lib/kubelet/kubeadm-flags.env", []string{"--keep-terminated-pod-volumes=false", "--v=2"})
	w.view.facts["cp-1"].AddFlags("kube-controller-manager", "/etc/systemd/system/kube-controller-manager.service", []string{"--pod-eviction-timeout=5m"})
	p := w.plan(t)
	fs := only(p, "removed-flags")
	want(t, fs, Blocking, "node/worker-1", "kubelet is started with --keep-terminated-pod-volumes", "/var/lib/kubelet/kubeadm-flags.env")
	want(t, fs, Blocking, "node/cp-1", "kube-controller-manager is started with --pod-eviction-timeout")
	if len(fs) != 2 {
		t.Errorf("%d findings, want 2: %+v", len(fs), fs)
	}
}

func TestRemovedAPIs(t *testing.T) {
	w := newWorld(t)
	w.opts.Target.Catalog.RemovedAPIs = []string{"flowcontrol.apiserver.k8s.io/v1beta3", "networking.k8s.io/v1beta1/servicecidrs"}
	if err := w.opts.Target.Catalog.Check("test"); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientset()
	c.Resources = []*metav1.APIResourceList{{GroupVersion: "flowcontrol.apiserver.k8s.io/v1beta3", APIResources: []metav1.APIResource{
		{Name: "flowschemas", Kind: "FlowSchema", Verbs: []string{"list", "get"}}, {Name: "flowschemas/status", Verbs: []string{"get"}},
		{Name: "prioritylevelconfigurations", Kind: "PriorityLevelConfiguration", Verbs: []string{"list"}}}},
		{GroupVersion: "networking.k8s.io/v1beta1", APIResources: []metav1.APIResource{
			{Name: "servicecidrs", Kind: "ServiceCIDR", Verbs: []string{"list"}}, {Name: "ipaddresses", Kind: "IPAddress", Verbs: []string{"list"}}}}}
	w.opts.Client = c
	gvr := schema.GroupVersionResource{Group: "flowcontrol.apiserver.k8s.io", Version: "v1beta3", Resource: "flowschemas"}
	object := func(apiVersion, kind, ns, name string, managed ...metav1.ManagedFieldsEntry) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(apiVersion)
		u.SetKind(kind)
		u.SetNamespace(ns)
		u.SetName(name)
		u.SetManagedFields(managed)
		return u
	}
	// "exempt" is the API server's own, written through v1; "mine" was
	// written through v1beta3 by a client; "applied" by kubectl apply of a
	// v1beta3 manifest.
	exempt := object(gvr.GroupVersion().String(), "FlowSchema", "", "exempt", metav1.ManagedFieldsEntry{Manager: "api-priority-and-fairness-config-producer-v1", APIVersion: "flowcontrol.apiserver.k8s.io/v1"})
	mine := object(gvr.GroupVersion().String(), "FlowSchema", "", "mine", metav1.ManagedFieldsEntry{Manager: "helm", APIVersion: "flowcontrol.apiserver.k8s.io/v1beta3"})
	applied := object(gvr.GroupVersion().String(), "FlowSchema", "", "applied")
	applied.SetAnnotations(map[string]string{corev1.LastAppliedConfigAnnotation: `{"apiVersion":"flowcontrol.apiserver.k8s.io/v1beta3","kind":"FlowSchema"}`})
	cidrs := schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1beta1", Resource: "servicecidrs"}
	ips := schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1beta1", Resource: "ipaddresses"}
	cidr := object("networking.k8s.io/v1beta1", "ServiceCIDR", "", "kubernetes", metav1.ManagedFieldsEntry{Manager: "kube-apiserver", APIVersion: "networking.k8s.io/v1"})
	ip := object("networking.k8s.io/v1beta1", "IPAddress", "", "10.0.0.1", metav1.ManagedFieldsEntry{Manager: "old-tool", APIVersion: "networking.k8s.io/v1beta1"})
	w.opts.Dynamic = dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		gvr: "FlowSchemaList", {Group: gvr.Group, Version: gvr.Version, Resource: "prioritylevelconfigurations"}: "PriorityLevelConfigurationList",
		cidrs: "ServiceCIDRList", ips: "IPAddressList"}, exempt, mine, applied, cidr, ip)
	got := only(w.plan(t), "removed-apis")
	want(t, got, Blocking, "flowschemas.flowcontrol.apiserver.k8s.io/mine", "written through flowcontrol.apiserver.k8s.io/v1beta3 (by helm), which v1.31 no longer serves")
	want(t, got, Blocking, "flowschemas.flowcontrol.apiserver.k8s.io/applied", "(by kubectl apply)")
	want(t, got, Warning, "api/networking.k8s.io/v1beta1/servicecidrs", "1 servicecidrs are served under networking.k8s.io/v1beta1, which v1.31 no longer serves; none was written through it")
	if len(got) != 3 {
		t.Errorf("findings %+v (want none for exempt, written through v1, none for prioritylevelconfigurations, which has no objects, and none for ipaddresses, which the catalog keeps)", got)
	}
}

func TestCgroupV1(t *testing.T) {
	w := newWorld(t)
	f, no := false, true
	for _, n := range []string{"cp-1", "worker-1", "worker-2"} {
		w.view.facts[n].Cgroup = 1
	}
	w.view.facts["cp-1"].FailCgroupV1 = &f
	w.view.facts["worker-1"].Values["kubelet --config"] = "/var/lib/kubelet/config.yaml"
	w.view.facts["worker-2"].FailCgroupV1, w.view.facts["worker-2"].FailCgroupV1Source = &no, "kubelet --fail-cgroupv1"
	if fs := only(w.plan(t), "cgroup"); len(fs) != 0 {
		t.Errorf("target v1.31.4: findings %+v (kubelets before 1.35 start on cgroup v1)", fs)
	}
	w.opts.Target.Version, _ = catalog.ParseVersion("v1.35.4")
	fs := only(w.plan(t), "cgroup")
	want(t, fs, Blocking, "node/worker-1", "the node runs cgroup v1: kubelet v1.35.4 will refuse to start on it unless failCgroupV1 is false, and /var/lib/kubelet/config.yaml does not set it")
	want(t, fs, Blocking, "node/worker-2", "and kubelet --fail-cgroupv1 sets it true")
	if len(fs) != 2 {
		t.Errorf("findings %+v (cp-1 sets failCgroupV1: false)", fs)
	}
	// A kubeadm cluster: the ConfigMap decides, whatever the node's file
	// says (kubeadm rewrites it); a flag false on the node stays.
	w.view.kubeadm = &kubeadm.Config{}
	w.view.facts["worker-1"].FailCgroupV1, w.view.facts["worker-1"].FailCgroupV1Source = &f, "kubelet --fail-cgroupv1"
	fs = only(w.plan(t), "cgroup")
	want(t, fs, Blocking, "node/cp-1", "configmap kube-system/kubelet-config does not set it false")
	want(t, fs, Blocking, "node/worker-2", "configmap kube-system/kubelet-config does not set it false")
	if len(fs) != 2 {
		t.Errorf("findings %+v (worker-1's flag says false)", fs)
	}
	w.view.kubeadm.KubeletFailCgroupV1 = &f
	if fs = only(w.plan(t), "cgroup"); len(fs) != 0 {
		t.Errorf("findings %+v, want none: the ConfigMap sets failCgroupV1: false", fs)
	}
	w.view.kubeadm = nil
	for _, n := range []string{"worker-1", "worker-2"} {
		w.view.facts[n].Cgroup = 2
	}
	if fs = only(w.plan(t), "cgroup"); len(fs) != 0 {
		t.Errorf("findings %+v, want none on cgroup v2", fs)
	}
}

func TestReadmission(t *testing.T) {
	w := newWorld(t)
	ok := pod("ok", "worker-1", true)
	ok.Spec.NodeSelector = map[string]string{"disk": "ssd"}
	lost := pod("pinned", "worker-1", true)
	lost.Spec.NodeSelector = map[string]string{"disk": "ssd", "zone": "a"}
	aff := pod("affine", "worker-2", true)
	aff.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu", Operator: corev1.NodeSelectorOpExists}}}}}}}
	w.view.pods = []corev1.Pod{ok, lost, aff}
	fs := only(w.plan(t), "readmission")
	want(t, fs, Blocking, "pod/shop/pinned", "NodeAffinity", "lacks the label zone=a")
	want(t, fs, Blocking, "pod/shop/affine", "NodeAffinity", "required node affinity no longer matches node worker-2")
	if len(fs) != 2 {
		t.Errorf("findings %+v", fs)
	}
	// --restore-labels resolves the finding whose labels it puts back, by
	// its code, and not the other.
	r := &applyRun{opts: ApplyOptions{RestoreLabels: true}, tgts: map[string]nodeaccess.Target{}}
	for _, f := range fs {
		r.tgts[f.Node] = targetOf(f.Node, release.RoleWorker)
		if got, want := r.resolves(f), f.Object == "pod/shop/pinned"; got != want || (f.Code == CodeLabelsMissing) != want {
			t.Errorf("%s: code %q, resolved by --restore-labels %v", f.Object, f.Code, got)
		}
	}
}

func TestEviction(t *testing.T) {
	w := newWorld(t)
	ds := pod("agent", "worker-1", false)
	ds.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "agent"}}
	half := pod("half", "worker-1", false)
	half.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}
	w.view.pods = []corev1.Pod{pod("legacy", "worker-1", false), pod("tolerant", "worker-2", true), ds, half, pod("pending", "", false)}
	w.view.facts["cp-1"].Values["kube-apiserver --disable-admission-plugins"] = "NamespaceLifecycle,DefaultTolerationSeconds"
	fs := only(w.plan(t), "eviction")
	want(t, fs, Warning, "pod/shop/legacy", "node.kubernetes.io/not-ready, node.kubernetes.io/unreachable", "worker-1")
	want(t, fs, Warning, "pod/shop/half", "node.kubernetes.io/unreachable")
	want(t, fs, Warning, "apiserver/cp-1", "DefaultTolerationSeconds admission plugin is disabled")
	if len(fs) != 3 {
		t.Errorf("findings %+v (a DaemonSet pod, a tolerant pod and an unscheduled one are fine)", fs)
	}
}

// restartWorld runs two pods on worker-1 whose runtime records the hashes
// kubelet v1.30.14 wrote.
func restartWorld(t *testing.T) *world {
	w := newWorld(t)
	old, err := kubeletcompat.NewHasher(w.cat, "v1.30.14")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		p := pod(name, "worker-1", true)
		w.view.pods = append(w.view.pods, p)
		h, _ := old.Hash(&p.Spec.Containers[0])
		w.view.facts["worker-1"].Containers = append(w.view.facts["worker-1"].Containers, kubeletcompat.RuntimeContainer{ID: "c-" + name,
			PodUID: string(p.UID), Namespace: p.Namespace, Pod: p.Name, Name: "app", Running: true, StartedAt: w.opts.Now().Add(-time.Hour),
			Hash: kubeletcompat.Label(h)})
	}
	return w
}

func TestRestartsUpstreamKubelet(t *testing.T) {
	w := restartWorld(t)
	p := w.plan(t)
	want(t, only(p, "restarts"), Blocking, "node/worker-1", "2 of 2 running containers would restart", "json-without-resources to name-image")
	if n := p.Nodes[1]; n.Containers != 2 || n.Restarts != 2 || n.Protected != 0 {
		t.Errorf("worker-1: %+v", n)
	}
	w.opts.AllowRestarts = true
	if p := w.plan(t); p.Blocked || only(p, "restarts")[0].Severity != Warning {
		t.Errorf("--allow-restarts: %+v", only(p, "restarts"))
	}
}

func TestRestartsHashSkipKubelet(t *testing.T) {
	w := restartWorld(t)
	for i := range w.opts.Target.Manifest.Files {
		if w.opts.Target.Manifest.Files[i].Name == "kubelet" {
			w.opts.Target.Manifest.Files[i].HashSkip = true
		}
	}
	p := w.plan(t)
	if p.Blocked || !p.HashSkipKubelet {
		t.Fatalf("blocked %v, hash-skip %v: %+v", p.Blocked, p.HashSkipKubelet, p.Findings)
	}
	want(t, only(p, "restarts"), Info, "node/worker-1", "2 of 2 running containers kept running by the hash-skip file")
	// No runtime view: said, not guessed.
	w.view.facts["worker-2"].ContainersErr = "crictl: command not found"
	want(t, only(w.plan(t), "restarts"), Warning, "node/worker-2", "crictl: command not found")
}

// A node upgraded before with the hash-skip kubelet (its kubelet already
// in the target's era) whose old containers still run, kept by the file
// that upgrade left: the plan reads the file's era and predicts them kept
// by a hash-skip kubelet (apply writes no new file, the old one stays),
// restarted by upstream's; a file naming no era it knows is refused.
func TestRestartsChainedUpgradeKeptByTheEarlierFile(t *testing.T) {
	w := restartWorld(t)
	for i := range w.view.nodes {
		w.view.nodes[i].Status.NodeInfo.KubeletVersion = "v1.31.3"
	}
	for _, f := range w.view.facts {
		f.Components["kubelet"] = "v1.31.3"
	}
	for i := range w.opts.Target.Manifest.Files {
		if w.opts.Target.Manifest.Files[i].Name == "kubelet" {
			w.opts.Target.Manifest.Files[i].HashSkip = true
		}
	}
	want(t, only(w.plan(t), "restarts"), Blocking, "node/worker-1", "2 of 2 running containers would restart", "their spec hashes differ under v1.31.4")
	w.view.facts["worker-1"].HashSkipEra = "json-without-resources"
	p := w.plan(t)
	if p.Blocked {
		t.Fatalf("blocked: %+v", p.Findings)
	}
	want(t, only(p, "restarts"), Info, "node/worker-1", "2 of 2 running containers kept running by the hash-skip file")
	for i := range w.opts.Target.Manifest.Files {
		w.opts.Target.Manifest.Files[i].HashSkip = false
	}
	want(t, only(w.plan(t), "restarts"), Blocking, "node/worker-1", "2 of 2 running containers would restart", "started in hash era json-without-resources, before an earlier upgrade")
	// A file kubelift cannot read: said, and not counted on.
	w.view.facts["worker-1"].HashSkipEra, w.view.facts["worker-1"].HashSkipUnread = "", `oldHashEra "x"`
	want(t, only(w.plan(t), "restarts"), Warning, "node/worker-1", `hash-skip file an earlier upgrade left says oldHashEra "x"`)
}

// Images are checked in the private registry by digest.
func TestImagesInRegistry(t *testing.T) {
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	img, _ := random.Image(256, 1)
	ref, _ := name.ParseReference(u.Host + "/library/pause:3.10")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	w := newWorld(t)
	w.opts.Target.Record.Images = []cluster.ImageRecord{
		{Ref: "registry.k8s.io/pause:3.10", Target: u.Host + "/library/pause:3.10", Digest: d.String()},
		{Ref: "registry.k8s.io/etcd:3.5.15-0", Target: u.Host + "/library/etcd:3.5.15-0", Digest: "sha256:" + strings.Repeat("e", 64)},
	}
	fs := only(w.plan(t), "images")
	want(t, fs, Blocking, "image/"+u.Host+"/library/etcd:3.5.15-0", "is not in the private registry")
	if len(fs) != 1 {
		t.Errorf("findings %+v", fs)
	}
}

// The window plan shows (its waves) and the one apply keeps (its width
// after so many successes) are one description.
func TestWindow(t *testing.T) {
	w := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}
	for _, tc := range []struct {
		max           int
		canary        bool
		waves, widths string
	}{
		{1, false, "1 1 1 1 1 1 1 1 1 1", "1 1 1 1 1 1 1 1 1 1"},
		{4, false, "4 4 2", "4 4 4 4 4 4 4 4 4 4"},
		{4, true, "1 2 4 3", "1 2 4 4 4 4 4 4 4 4"},
		{100, true, "1 2 4 3", "1 2 4 4 8 8 8 8 16 16"},
		{0, false, "1 1 1 1 1 1 1 1 1 1", "1 1 1 1 1 1 1 1 1 1"},
	} {
		win := Window{Limit: tc.max, Canary: tc.canary}
		var waves, widths []string
		for _, b := range win.Waves(w) {
			waves = append(waves, strconv.Itoa(len(b)))
		}
		for done := range w {
			widths = append(widths, strconv.Itoa(win.Width(done)))
		}
		if got := strings.Join(waves, " "); got != tc.waves {
			t.Errorf("max %d canary %v: waves %s, want %s", tc.max, tc.canary, got, tc.waves)
		}
		if got := strings.Join(widths, " "); got != tc.widths {
			t.Errorf("max %d canary %v: widths after 0, 1, ... done %s, want %s", tc.max, tc.canary, got, tc.widths)
		}
	}
	for s, want := range map[string]int{"1": 1, "5": 5, "10%": 10, "1%": 1, "50%": 50} {
		if got, err := ParseMaxUnavailable(s, 100); err != nil || got != want {
			t.Errorf("%s: %d %v", s, got, err)
		}
	}
	for _, bad := range []string{"0", "-1", "x", "0%", "101%"} {
		if _, err := ParseMaxUnavailable(bad, 100); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func targetOf(name, role string) nodeaccess.Target {
	return nodeaccess.Target{Name: name, Role: role, Address: "10.0.0.1"}
}

// A /readyz that fails a few times and then answers ok is healthy: health
// is judged over the window; one that never does is blocking, saying for
// how long it failed and what it last said.
func TestHealthOverAWindow(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int32
		blocking bool
	}{
		{"fails 3 times, then ok", 3, false},
		{"never ok", 1 << 30, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/readyz" {
					http.NotFound(w, r)
					return
				}
				if calls.Add(1) <= tc.failures {
					w.WriteHeader(http.StatusInternalServerError)
					fmt.Fprint(w, "[-]etcd failed: reason withheld\nreadyz check failed")
					return
				}
				fmt.Fprint(w, "ok")
			}))
			defer srv.Close()
			w := newWorld(t)
			ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
			w.opts.REST = &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
			w.opts.HealthWindow, w.opts.healthBackoff = 3*time.Second, 10*time.Millisecond
			w.view.tgts[0].Address = "127.0.0.1"
			p := w.plan(t)
			h := only(p, "health")
			if !tc.blocking {
				if len(h) != 0 {
					t.Errorf("findings %+v", h)
				}
				return
			}
			want(t, h, Blocking, "apiserver/cp-1", "/readyz", "[-]etcd failed", "failing for", "probes")
		})
	}
}

// A static pod (matched through its mirror pod) is predicted recreated
// by a kubelet of another minor, apart from restarts; a container of no
// pod the API knows is named, not silently left out.
func TestRestartsStaticPods(t *testing.T) {
	w := restartWorld(t)
	for i := range w.opts.Target.Manifest.Files {
		if w.opts.Target.Manifest.Files[i].Name == "kubelet" {
			w.opts.Target.Manifest.Files[i].HashSkip = true
		}
	}
	mirror := pod("edge-worker-1", "worker-1", true)
	mirror.UID = "api-uid"
	mirror.Annotations = map[string]string{kubeletcompat.MirrorAnnotation: "static-uid"}
	w.view.pods = append(w.view.pods, mirror)
	f := w.view.facts["worker-1"]
	f.Containers = append(f.Containers,
		kubeletcompat.RuntimeContainer{ID: "c-edge", PodUID: "static-uid", Namespace: mirror.Namespace, Pod: mirror.Name, Name: "app", Running: true, StartedAt: w.opts.Now().Add(-time.Hour)},
		kubeletcompat.RuntimeContainer{ID: "c-lost", PodUID: "no-such-uid", Namespace: "shop", Pod: "gone", Name: "app", Running: true, StartedAt: w.opts.Now().Add(-time.Hour)})
	p := w.plan(t)
	if n := p.Nodes[1]; n.Containers != 3 || n.Recreated != 1 || n.Restarts != 0 || n.Protected != 2 {
		t.Errorf("worker-1: %+v", n)
	}
	if p.Blocked {
		t.Errorf("blocked by a static pod: %+v", p.Findings)
	}
	want(t, only(p, "restarts"), Warning, "node/worker-1", "static pods "+mirror.Namespace+"/edge-worker-1 (1 containers) will be recreated", "v1.30.14 to v1.31.4")
	want(t, only(p, "restarts"), Warning, "node/worker-1", "1 running containers belong to no pod the API server knows (shop/gone/app)")
	// Within a minor the static pod is kept like any other.
	w.view.facts["worker-1"].Components["kubelet"] = "v1.31.1"
	for i := range w.view.nodes {
		if w.view.nodes[i].Name == "worker-1" {
			w.view.nodes[i].Status.NodeInfo.KubeletVersion = "v1.31.1"
		}
	}
	if n := w.plan(t).Nodes[1]; n.Recreated != 0 || n.Containers != 3 || n.Kubelet != "v1.31.1" {
		t.Errorf("worker-1 within a minor: %+v", n)
	}
}
