package preflight_test

import (
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
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
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/preflight/preflighttest"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
)

func TestPlanCleanClusterBlocksNothing(t *testing.T) {
	w := preflighttest.New(t)
	p := w.Plan(t)
	if p.Blocked {
		t.Fatalf("blocked: %+v", p.Findings)
	}
	// Unstaged files are said, not blocking, with how apply would stage
	// them where the node was asked.
	preflighttest.Want(t, preflighttest.Only(p, "staged"), preflight.Info, "node/worker-1", "kubelet", "not staged")
	w.View.Paths = map[string][2]string{"worker-1": {stage.ViaRegistry, ""}, "worker-2": {stage.ViaSSH, "the registry cannot be reached from the node"}}
	p = w.Plan(t)
	preflighttest.Want(t, preflighttest.Only(p, "staged"), preflight.Info, "node/worker-1", "not staged", "apply has the node pull them from the private registry")
	preflighttest.Want(t, preflighttest.Only(p, "staged"), preflight.Info, "node/worker-2", "not staged", "apply sends them over SSH (the registry cannot be reached from the node)")
	for _, n := range p.Nodes {
		if n.Name == "worker-2" && (n.StagePath != stage.ViaSSH || n.StagePathReason == "") {
			t.Errorf("worker-2's plan: %+v", n)
		}
	}
	// A node that can get its files neither way (agent mode, or --via
	// registry, and it cannot pull) blocks the plan, saying why.
	w.View.Paths["worker-2"] = [2]string{stage.ViaNone, "node worker-2: cannot pull from the registry (the registry cannot be reached from the node)"}
	if blocked := w.Plan(t); !blocked.Blocked {
		t.Errorf("a node that cannot get its files does not block the plan: %+v", preflighttest.Only(blocked, "staged"))
	} else {
		preflighttest.Want(t, preflighttest.Only(blocked, "staged"), preflight.Blocking, "node/worker-2", "not staged", "apply cannot get them there: node worker-2: cannot pull from the registry")
	}
	w.View.Paths = nil
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
		sev                      preflight.Severity
		check, msg               string
	}{
		{"a minor skipped", "v1.29.15", "v1.29.15", preflight.Blocking, "path", "skips a minor"},
		{"not an upgrade source", "v1.30.0", "v1.30.0", preflight.Blocking, "path", "does not list it"},
		{"a downgrade across minors", "v1.32.0", "v1.31.4", preflight.Blocking, "path", "downgrade the catalog does not allow"},
		{"a kubelet newer than the target", "v1.30.14", "v1.32.0", preflight.Blocking, "skew", "newer than v1.31.4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := preflighttest.New(t)
			if tc.name == "not an upgrade source" {
				w.Opts.Target.Catalog.UpgradeFrom = []string{"v1.30.1-v1.30.14"}
				if err := w.Opts.Target.Catalog.Check("test"); err != nil {
					t.Fatal(err)
				}
			}
			for c := range w.View.Facts["cp-1"].Components {
				if c != "kubelet" {
					w.View.Facts["cp-1"].Components[c] = tc.apiserver
				}
			}
			w.View.Nodes[1].Status.NodeInfo.KubeletVersion = tc.kubelet
			p := w.Plan(t)
			obj := "node/cp-1"
			if tc.check == "skew" {
				obj = "node/worker-1"
			}
			preflighttest.Want(t, preflighttest.Only(p, preflight.Check(tc.check)), tc.sev, obj, tc.msg)
		})
	}
	// A patch downgrade the catalog allows is fine.
	w := preflighttest.New(t)
	rel, _ := w.Catalog.Lookup("v1.31.4")
	w.Opts.Target.Version, w.Opts.Target.Catalog = catalog.Version{Major: 1, Minor: 31, Patch: 0}, rel
	for c := range w.View.Facts["cp-1"].Components {
		w.View.Facts["cp-1"].Components[c] = "v1.31.4"
	}
	if fs := preflighttest.Only(w.Plan(t), "path"); len(fs) != 0 {
		t.Errorf("allowed patch downgrade: %+v", fs)
	}
}

func TestUnreachableNodeBlocks(t *testing.T) {
	w := preflighttest.New(t)
	delete(w.View.Facts, "worker-2")
	w.View.SSH["worker-2"] = errors.New("node worker-2 (10.0.0.2:22): dial: connection refused")
	preflighttest.Want(t, preflighttest.Only(w.Plan(t), "ssh"), preflight.Blocking, "node/worker-2", "connection refused")
}

func TestHealth(t *testing.T) {
	w := preflighttest.New(t)
	w.View.Nodes[2].Status.Conditions[0].Status = corev1.ConditionFalse
	// The scheduler holds a stale lease; the controller manager has none
	// and is not running.
	old := metav1.NewMicroTime(w.Opts.Now().Add(-time.Hour))
	d := int32(15)
	w.Opts.Client = fake.NewClientset(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-scheduler", Namespace: "kube-system"},
		Spec: coordinationv1.LeaseSpec{RenewTime: &old, LeaseDurationSeconds: &d}})
	delete(w.View.Facts["cp-1"].Components, "kube-controller-manager")
	p := w.Plan(t)
	h := preflighttest.Only(p, "health")
	preflighttest.Want(t, h, preflight.Blocking, "node/worker-2", "not Ready")
	preflighttest.Want(t, h, preflight.Blocking, "lease/kube-system/kube-scheduler", "no live lease")
	preflighttest.Want(t, h, preflight.Blocking, "node/cp-1", "kube-controller-manager is not running")
}

func TestStagedAndDisk(t *testing.T) {
	w := preflighttest.New(t)
	for _, f := range w.Opts.Target.Manifest.Files {
		w.View.Facts["worker-1"].Staged[f.Name] = f.SHA256
	}
	w.View.Facts["worker-2"].FreeBytes = 1 << 20
	p := w.Plan(t)
	for _, n := range p.Nodes {
		if (n.Name == "worker-1") != n.Staged {
			t.Errorf("%s staged %v", n.Name, n.Staged)
		}
	}
	preflighttest.Want(t, preflighttest.Only(p, "disk"), preflight.Blocking, "node/worker-2", "1 MiB free")
	if fs := preflighttest.Only(p, "disk"); len(fs) != 1 {
		t.Errorf("disk findings %+v", fs)
	}
}

func TestRemovedFlags(t *testing.T) {
	w := preflighttest.New(t)
	w.Opts.Target.Catalog.RemovedFlags = map[string][]string{"kube-controller-manager": {"--pod-eviction-timeout"}}
	w.View.Facts["worker-1"].AddFlags("kubelet", "/var/lib/kubelet/kubeadm-flags.env", []string{"--keep-terminated-pod-volumes=false", "--v=2"})
	w.View.Facts["cp-1"].AddFlags("kube-controller-manager", "/etc/systemd/system/kube-controller-manager.service", []string{"--pod-eviction-timeout=5m"})
	p := w.Plan(t)
	fs := preflighttest.Only(p, "removed-flags")
	preflighttest.Want(t, fs, preflight.Blocking, "node/worker-1", "kubelet is started with --keep-terminated-pod-volumes", "/var/lib/kubelet/kubeadm-flags.env")
	preflighttest.Want(t, fs, preflight.Blocking, "node/cp-1", "kube-controller-manager is started with --pod-eviction-timeout")
	if len(fs) != 2 {
		t.Errorf("%d findings, want 2: %+v", len(fs), fs)
	}
}

func TestRemovedAPIs(t *testing.T) {
	w := preflighttest.New(t)
	w.Opts.Target.Catalog.RemovedAPIs = []string{"flowcontrol.apiserver.k8s.io/v1beta3", "networking.k8s.io/v1beta1/servicecidrs"}
	if err := w.Opts.Target.Catalog.Check("test"); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientset()
	c.Resources = []*metav1.APIResourceList{{GroupVersion: "flowcontrol.apiserver.k8s.io/v1beta3", APIResources: []metav1.APIResource{
		{Name: "flowschemas", Kind: "FlowSchema", Verbs: []string{"list", "get"}}, {Name: "flowschemas/status", Verbs: []string{"get"}},
		{Name: "prioritylevelconfigurations", Kind: "PriorityLevelConfiguration", Verbs: []string{"list"}}}},
		{GroupVersion: "networking.k8s.io/v1beta1", APIResources: []metav1.APIResource{
			{Name: "servicecidrs", Kind: "ServiceCIDR", Verbs: []string{"list"}}, {Name: "ipaddresses", Kind: "IPAddress", Verbs: []string{"list"}}}}}
	w.Opts.Client = c
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
	w.Opts.Dynamic = dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		gvr: "FlowSchemaList", {Group: gvr.Group, Version: gvr.Version, Resource: "prioritylevelconfigurations"}: "PriorityLevelConfigurationList",
		cidrs: "ServiceCIDRList", ips: "IPAddressList"}, exempt, mine, applied, cidr, ip)
	got := preflighttest.Only(w.Plan(t), "removed-apis")
	preflighttest.Want(t, got, preflight.Blocking, "flowschemas.flowcontrol.apiserver.k8s.io/mine", "written through flowcontrol.apiserver.k8s.io/v1beta3 (by helm), which v1.31 no longer serves")
	preflighttest.Want(t, got, preflight.Blocking, "flowschemas.flowcontrol.apiserver.k8s.io/applied", "(by kubectl apply)")
	preflighttest.Want(t, got, preflight.Warning, "api/networking.k8s.io/v1beta1/servicecidrs", "1 servicecidrs are served under networking.k8s.io/v1beta1, which v1.31 no longer serves; none was written through it")
	if len(got) != 3 {
		t.Errorf("findings %+v (want none for exempt, written through v1, none for prioritylevelconfigurations, which has no objects, and none for ipaddresses, which the catalog keeps)", got)
	}
}

func TestCgroupV1(t *testing.T) {
	w := preflighttest.New(t)
	f, no := false, true
	for _, n := range []string{"cp-1", "worker-1", "worker-2"} {
		w.View.Facts[n].Cgroup = 1
	}
	w.View.Facts["cp-1"].FailCgroupV1 = &f
	w.View.Facts["worker-1"].Values["kubelet --config"] = "/var/lib/kubelet/config.yaml"
	w.View.Facts["worker-2"].FailCgroupV1, w.View.Facts["worker-2"].FailCgroupV1Source = &no, "kubelet --fail-cgroupv1"
	if fs := preflighttest.Only(w.Plan(t), "cgroup"); len(fs) != 0 {
		t.Errorf("target v1.31.4: findings %+v (kubelets before 1.35 start on cgroup v1)", fs)
	}
	w.Opts.Target.Version, _ = catalog.ParseVersion("v1.35.4")
	fs := preflighttest.Only(w.Plan(t), "cgroup")
	preflighttest.Want(t, fs, preflight.Blocking, "node/worker-1", "the node runs cgroup v1: kubelet v1.35.4 will refuse to start on it unless failCgroupV1 is false, and /var/lib/kubelet/config.yaml does not set it")
	preflighttest.Want(t, fs, preflight.Blocking, "node/worker-2", "and kubelet --fail-cgroupv1 sets it true")
	if len(fs) != 2 {
		t.Errorf("findings %+v (cp-1 sets failCgroupV1: false)", fs)
	}
	// A kubeadm cluster: the ConfigMap decides, whatever the node's file
	// says (kubeadm rewrites it); a flag false on the node stays.
	w.View.Kubeadm = &kubeadm.Config{}
	w.View.Facts["worker-1"].FailCgroupV1, w.View.Facts["worker-1"].FailCgroupV1Source = &f, "kubelet --fail-cgroupv1"
	fs = preflighttest.Only(w.Plan(t), "cgroup")
	preflighttest.Want(t, fs, preflight.Blocking, "node/cp-1", "configmap kube-system/kubelet-config does not set it false")
	preflighttest.Want(t, fs, preflight.Blocking, "node/worker-2", "configmap kube-system/kubelet-config does not set it false")
	if len(fs) != 2 {
		t.Errorf("findings %+v (worker-1's flag says false)", fs)
	}
	w.View.Kubeadm.KubeletFailCgroupV1 = &f
	if fs = preflighttest.Only(w.Plan(t), "cgroup"); len(fs) != 0 {
		t.Errorf("findings %+v, want none: the ConfigMap sets failCgroupV1: false", fs)
	}
	w.View.Kubeadm = nil
	for _, n := range []string{"worker-1", "worker-2"} {
		w.View.Facts[n].Cgroup = 2
	}
	if fs = preflighttest.Only(w.Plan(t), "cgroup"); len(fs) != 0 {
		t.Errorf("findings %+v, want none on cgroup v2", fs)
	}
}

func TestReadmission(t *testing.T) {
	w := preflighttest.New(t)
	ok := preflighttest.Pod("ok", "worker-1", true)
	ok.Spec.NodeSelector = map[string]string{"disk": "ssd"}
	lost := preflighttest.Pod("pinned", "worker-1", true)
	lost.Spec.NodeSelector = map[string]string{"disk": "ssd", "zone": "a"}
	aff := preflighttest.Pod("affine", "worker-2", true)
	aff.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu", Operator: corev1.NodeSelectorOpExists}}}}}}}
	w.View.Pods = []corev1.Pod{ok, lost, aff}
	fs := preflighttest.Only(w.Plan(t), "readmission")
	preflighttest.Want(t, fs, preflight.Blocking, "pod/shop/pinned", "NodeAffinity", "lacks the label zone=a")
	preflighttest.Want(t, fs, preflight.Blocking, "pod/shop/affine", "NodeAffinity", "required node affinity no longer matches node worker-2")
	if len(fs) != 2 {
		t.Errorf("findings %+v", fs)
	}
	// Only the finding whose labels --restore-labels can put back says so.
	for _, f := range fs {
		if got, want := f.Code == preflight.CodeLabelsMissing, f.Object == "pod/shop/pinned"; got != want {
			t.Errorf("%s: code %q", f.Object, f.Code)
		}
	}
}

func TestEviction(t *testing.T) {
	w := preflighttest.New(t)
	ds := preflighttest.Pod("agent", "worker-1", false)
	ds.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "agent"}}
	half := preflighttest.Pod("half", "worker-1", false)
	half.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}
	w.View.Pods = []corev1.Pod{preflighttest.Pod("legacy", "worker-1", false), preflighttest.Pod("tolerant", "worker-2", true), ds, half, preflighttest.Pod("pending", "", false)}
	w.View.Facts["cp-1"].Values["kube-apiserver --disable-admission-plugins"] = "NamespaceLifecycle,DefaultTolerationSeconds"
	fs := preflighttest.Only(w.Plan(t), "eviction")
	preflighttest.Want(t, fs, preflight.Warning, "pod/shop/legacy", "node.kubernetes.io/not-ready, node.kubernetes.io/unreachable", "worker-1")
	preflighttest.Want(t, fs, preflight.Warning, "pod/shop/half", "node.kubernetes.io/unreachable")
	preflighttest.Want(t, fs, preflight.Warning, "apiserver/cp-1", "DefaultTolerationSeconds admission plugin is disabled")
	if len(fs) != 3 {
		t.Errorf("findings %+v (a DaemonSet pod, a tolerant pod and an unscheduled one are fine)", fs)
	}
}

// restartWorld runs two pods on worker-1 whose runtime records the hashes
// kubelet v1.30.14 wrote.
func restartWorld(t *testing.T) *preflighttest.World {
	w := preflighttest.New(t)
	old, err := kubeletcompat.NewHasher(w.Catalog, "v1.30.14")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		p := preflighttest.Pod(name, "worker-1", true)
		w.View.Pods = append(w.View.Pods, p)
		h, _ := old.Hash(&p.Spec.Containers[0])
		w.View.Facts["worker-1"].Containers = append(w.View.Facts["worker-1"].Containers, kubeletcompat.RuntimeContainer{ID: "c-" + name,
			PodUID: string(p.UID), Namespace: p.Namespace, Pod: p.Name, Name: "app", Running: true, StartedAt: w.Opts.Now().Add(-time.Hour),
			Hash: kubeletcompat.Label(h)})
	}
	return w
}

func TestRestartsUpstreamKubelet(t *testing.T) {
	w := restartWorld(t)
	p := w.Plan(t)
	preflighttest.Want(t, preflighttest.Only(p, "restarts"), preflight.Blocking, "node/worker-1", "2 of 2 running containers would restart", "json-without-resources to name-image")
	if n := p.Nodes[1]; n.Containers != 2 || n.Restarts != 2 || n.Protected != 0 {
		t.Errorf("worker-1: %+v", n)
	}
	w.Opts.AllowRestarts = true
	if p := w.Plan(t); p.Blocked || preflighttest.Only(p, "restarts")[0].Severity != preflight.Warning {
		t.Errorf("--allow-restarts: %+v", preflighttest.Only(p, "restarts"))
	}
}

func TestRestartsHashSkipKubelet(t *testing.T) {
	w := restartWorld(t)
	for i := range w.Opts.Target.Manifest.Files {
		if w.Opts.Target.Manifest.Files[i].Name == "kubelet" {
			w.Opts.Target.Manifest.Files[i].HashSkip = true
		}
	}
	p := w.Plan(t)
	if p.Blocked || !p.HashSkipKubelet {
		t.Fatalf("blocked %v, hash-skip %v: %+v", p.Blocked, p.HashSkipKubelet, p.Findings)
	}
	preflighttest.Want(t, preflighttest.Only(p, "restarts"), preflight.Info, "node/worker-1", "2 of 2 running containers kept running by the hash-skip file")
	// No runtime view: said, not guessed.
	w.View.Facts["worker-2"].ContainersErr = "crictl: command not found"
	preflighttest.Want(t, preflighttest.Only(w.Plan(t), "restarts"), preflight.Warning, "node/worker-2", "crictl: command not found")
}

// A node upgraded before with the hash-skip kubelet (its kubelet already
// in the target's era) whose old containers still run, kept by the file
// that upgrade left: the plan reads the file's era and predicts them kept
// by a hash-skip kubelet (apply writes no new file, the old one stays),
// restarted by upstream's; a file naming no era it knows is refused.
func TestRestartsChainedUpgradeKeptByTheEarlierFile(t *testing.T) {
	w := restartWorld(t)
	for i := range w.View.Nodes {
		w.View.Nodes[i].Status.NodeInfo.KubeletVersion = "v1.31.3"
	}
	for _, f := range w.View.Facts {
		f.Components["kubelet"] = "v1.31.3"
	}
	for i := range w.Opts.Target.Manifest.Files {
		if w.Opts.Target.Manifest.Files[i].Name == "kubelet" {
			w.Opts.Target.Manifest.Files[i].HashSkip = true
		}
	}
	preflighttest.Want(t, preflighttest.Only(w.Plan(t), "restarts"), preflight.Blocking, "node/worker-1", "2 of 2 running containers would restart", "their spec hashes differ under v1.31.4")
	w.View.Facts["worker-1"].HashSkipEra = "json-without-resources"
	p := w.Plan(t)
	if p.Blocked {
		t.Fatalf("blocked: %+v", p.Findings)
	}
	preflighttest.Want(t, preflighttest.Only(p, "restarts"), preflight.Info, "node/worker-1", "2 of 2 running containers kept running by the hash-skip file")
	for i := range w.Opts.Target.Manifest.Files {
		w.Opts.Target.Manifest.Files[i].HashSkip = false
	}
	preflighttest.Want(t, preflighttest.Only(w.Plan(t), "restarts"), preflight.Blocking, "node/worker-1", "2 of 2 running containers would restart", "started in hash era json-without-resources, before an earlier upgrade")
	// A file kubelift cannot read: said, and not counted on.
	w.View.Facts["worker-1"].HashSkipEra, w.View.Facts["worker-1"].HashSkipUnread = "", `oldHashEra "x"`
	preflighttest.Want(t, preflighttest.Only(w.Plan(t), "restarts"), preflight.Warning, "node/worker-1", `hash-skip file an earlier upgrade left says oldHashEra "x"`)
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
	w := preflighttest.New(t)
	w.Opts.Target.Record.Images = []cluster.ImageRecord{
		{Ref: "registry.k8s.io/pause:3.10", Target: u.Host + "/library/pause:3.10", Digest: d.String()},
		{Ref: "registry.k8s.io/etcd:3.5.15-0", Target: u.Host + "/library/etcd:3.5.15-0", Digest: "sha256:" + strings.Repeat("e", 64)},
	}
	fs := preflighttest.Only(w.Plan(t), "images")
	preflighttest.Want(t, fs, preflight.Blocking, "image/"+u.Host+"/library/etcd:3.5.15-0", "is not in the private registry")
	if len(fs) != 1 {
		t.Errorf("findings %+v", fs)
	}
}

// On a kubeadm cluster whose ClusterConfiguration pins etcd's tag
// (etcd.local.imageTag, kept across kubeadm upgrades), plan looks in the
// registry for the image kubeadm will pull, not the bundle's, and a
// missing one names the field that pins it.
func TestKubeadmImagesFollowAPinnedTag(t *testing.T) {
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	repo := u.Host + "/library"
	push := func(repoTag string) {
		t.Helper()
		img, _ := random.Image(256, 1)
		ref, err := name.ParseReference(repo + "/" + repoTag)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			t.Fatal(err)
		}
	}
	w := preflighttest.New(t)
	rel, err := w.Catalog.Lookup("v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range rel.Images { // every image of the release, under kubeadm's names
		up, err := name.NewTag(ref)
		if err != nil {
			t.Fatal(err)
		}
		push(up.RepositoryStr()[strings.LastIndex(up.RepositoryStr(), "/")+1:] + ":" + up.TagStr())
	}
	v, _ := catalog.ParseVersion("v1.30.14")
	w.View.Kubeadm = &kubeadm.Config{KubernetesVersion: v, ImageRepository: repo, LocalEtcd: true, EtcdImageTag: "3.5.9-0",
		EtcdDataDir: kubeadm.DefaultEtcdDataDir, CertificatesDir: kubeadm.DefaultCertDir}
	fs := preflighttest.Only(w.Plan(t), preflight.CheckKubeadm)
	preflighttest.Want(t, fs, preflight.Blocking, "image/"+repo+"/etcd:3.5.9-0", "kubeadm upgrade pulls", "pinned by etcd.local.imageTag", "not in the registry")
	for _, f := range fs {
		if f.Severity != preflight.Info && f.Object != "image/"+repo+"/etcd:3.5.9-0" {
			t.Errorf("finding on another image: %+v", f)
		}
	}
	// The pinned tag in the registry: nothing to say of etcd (the bundle's
	// etcd, another image, is not compared with it).
	push("etcd:3.5.9-0")
	for _, f := range preflighttest.Only(w.Plan(t), preflight.CheckKubeadm) {
		if f.Severity != preflight.Info {
			t.Errorf("with the pinned image in the registry: %+v", f)
		}
	}
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
			w := preflighttest.New(t)
			ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
			w.Opts.REST = &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
			w.Opts.HealthWindow, w.Opts.HealthBackoff = 3*time.Second, 10*time.Millisecond
			w.View.Addresses[0].Address = "127.0.0.1"
			p := w.Plan(t)
			h := preflighttest.Only(p, "health")
			if !tc.blocking {
				if len(h) != 0 {
					t.Errorf("findings %+v", h)
				}
				return
			}
			preflighttest.Want(t, h, preflight.Blocking, "apiserver/cp-1", "/readyz", "[-]etcd failed", "failing for", "probes")
		})
	}
}

// A static pod (matched through its mirror pod) is predicted recreated
// by a kubelet of another minor, apart from restarts; a container of no
// pod the API knows is named, not silently left out.
func TestRestartsStaticPods(t *testing.T) {
	w := restartWorld(t)
	for i := range w.Opts.Target.Manifest.Files {
		if w.Opts.Target.Manifest.Files[i].Name == "kubelet" {
			w.Opts.Target.Manifest.Files[i].HashSkip = true
		}
	}
	mirror := preflighttest.Pod("edge-worker-1", "worker-1", true)
	mirror.UID = "api-uid"
	mirror.Annotations = map[string]string{kubeletcompat.MirrorAnnotation: "static-uid"}
	w.View.Pods = append(w.View.Pods, mirror)
	f := w.View.Facts["worker-1"]
	f.Containers = append(f.Containers,
		kubeletcompat.RuntimeContainer{ID: "c-edge", PodUID: "static-uid", Namespace: mirror.Namespace, Pod: mirror.Name, Name: "app", Running: true, StartedAt: w.Opts.Now().Add(-time.Hour)},
		kubeletcompat.RuntimeContainer{ID: "c-lost", PodUID: "no-such-uid", Namespace: "shop", Pod: "gone", Name: "app", Running: true, StartedAt: w.Opts.Now().Add(-time.Hour)})
	p := w.Plan(t)
	if n := p.Nodes[1]; n.Containers != 3 || n.Recreated != 1 || n.Restarts != 0 || n.Protected != 2 {
		t.Errorf("worker-1: %+v", n)
	}
	if p.Blocked {
		t.Errorf("blocked by a static pod: %+v", p.Findings)
	}
	preflighttest.Want(t, preflighttest.Only(p, "restarts"), preflight.Warning, "node/worker-1", "static pods "+mirror.Namespace+"/edge-worker-1 (1 containers) will be recreated", "v1.30.14 to v1.31.4")
	preflighttest.Want(t, preflighttest.Only(p, "restarts"), preflight.Warning, "node/worker-1", "1 running containers belong to no pod the API server knows (shop/gone/app)")
	// Within a minor the static pod is kept like any other.
	w.View.Facts["worker-1"].Components["kubelet"] = "v1.31.1"
	for i := range w.View.Nodes {
		if w.View.Nodes[i].Name == "worker-1" {
			w.View.Nodes[i].Status.NodeInfo.KubeletVersion = "v1.31.1"
		}
	}
	if n := w.Plan(t).Nodes[1]; n.Recreated != 0 || n.Containers != 3 || n.Kubelet != "v1.31.1" {
		t.Errorf("worker-1 within a minor: %+v", n)
	}
}

// A bundle that moves a node's containerd counts its parts among the
// node's files: a node with the release's files staged but not
// containerd's is not staged, and the finding names containerd; a node
// that runs the bundle's containerd needs none.
func TestStagedRuntimeParts(t *testing.T) {
	w := preflighttest.New(t)
	for _, f := range w.Opts.Target.Manifest.Files {
		w.View.Facts["worker-1"].Staged[f.Name] = f.SHA256
		w.View.Facts["worker-2"].Staged[f.Name] = f.SHA256
	}
	w.Opts.Target.Manifest.Files = append(w.Opts.Target.Manifest.Files,
		bundle.File{Name: release.FileContainerd, Version: "v2.3.7", Arch: "amd64", Path: "stack/linux/amd64/containerd", SHA256: strings.Repeat("c", 64), Size: 1 << 20})
	for i := range w.View.Nodes {
		switch w.View.Nodes[i].Name {
		case "worker-1":
			w.View.Nodes[i].Status.NodeInfo.ContainerRuntimeVersion = "containerd://1.7.35"
		case "worker-2":
			w.View.Nodes[i].Status.NodeInfo.ContainerRuntimeVersion = "containerd://2.3.7"
		}
	}
	p := w.Plan(t)
	for _, n := range p.Nodes {
		if want := n.Name == "worker-2"; n.Staged != want && n.Name != "cp-1" {
			t.Errorf("%s staged %v, want %v", n.Name, n.Staged, want)
		}
	}
	preflighttest.Want(t, preflighttest.Only(p, preflight.CheckStaged), preflight.Info, "node/worker-1", "containerd not staged")
}
