package inplace

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
)

// hopWorld is newWorld's cluster at v1.30.14 with a target of v1.33.13,
// through v1.31.14 and v1.32.13 when hops is set.
func hopWorld(t *testing.T, hops bool) *world {
	t.Helper()
	w := newWorld(t)
	to := lookup(t, w.cat, "v1.33.13")
	tgt := w.opts.Target
	tgt.Version, tgt.Release = to.Parsed(), to
	tgt.Manifest.KubernetesVersion, tgt.Manifest.Release = to.Version, *to
	if hops {
		for _, v := range []string{"v1.31.14", "v1.32.13"} {
			rel := lookup(t, w.cat, v)
			tgt.Hops = append(tgt.Hops, &Target{Version: rel.Parsed(), Release: rel, Manifest: &bundle.Manifest{KubernetesVersion: v, Release: *rel}})
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
	fs := only(w.plan(t), "path")
	want(t, fs, Blocking, "node/cp-1", "kube-apiserver runs v1.30.14: v1.33.13 skips a minor version")
	// With them, the next release on the way is v1.31.14, which takes
	// v1.30, and kubelets three minors back are within the skew; but apply
	// cannot move a control plane through hops yet, so the plan says so.
	w = hopWorld(t, true)
	p := w.plan(t)
	if fs := only(p, "skew"); len(fs) != 0 {
		t.Errorf("findings %+v, want none", fs)
	}
	fs = only(p, "path")
	want(t, fs, Blocking, "node/cp-1", "kube-apiserver runs v1.30.14: the way to v1.33.13 passes through v1.31.14, v1.32.13, and this kubelift cannot move a control plane through hops yet")
	if len(fs) != 1 {
		t.Errorf("findings %+v, want one (one per version a component runs)", fs)
	}
	// A control plane resumed after the first hop goes on from there;
	// one that jumped past it is refused.
	for _, c := range controlPlaneFiles {
		w.view.facts["cp-1"].Components[c] = "v1.31.14"
	}
	fs = only(w.plan(t), "path")
	want(t, fs, Blocking, "node/cp-1", "kube-apiserver runs v1.31.14: the way to v1.33.13 passes through")
	if len(fs) != 1 {
		t.Errorf("at the first hop: findings %+v, want one", fs)
	}
	w.view.facts["cp-1"].Components["kube-apiserver"] = "v1.29.15"
	fs = only(w.plan(t), "path")
	want(t, fs, Blocking, "node/cp-1", "kube-apiserver runs v1.29.15: v1.31.14 skips a minor version", "the bundle passes through v1.31.14, v1.32.13")
}

func TestRemovedOnTheWay(t *testing.T) {
	w := hopWorld(t, true)
	// --keep-terminated-pod-volumes went in v1.31: the first hop.
	w.view.facts["worker-1"].AddFlags("kubelet", "/etc/systemd/system/kubelet.service", []string{"--keep-terminated-pod-volumes=false"})
	fs := only(w.plan(t), "removed-flags")
	want(t, fs, Blocking, "node/worker-1", "kubelet is started with --keep-terminated-pod-volumes", "which v1.31.14 removed")

	// flowcontrol v1beta3 went in v1.32: the second hop.
	c := fake.NewClientset()
	c.Resources = []*metav1.APIResourceList{{GroupVersion: "flowcontrol.apiserver.k8s.io/v1beta3", APIResources: []metav1.APIResource{
		{Name: "flowschemas", Kind: "FlowSchema", Verbs: []string{"list"}}}}}
	w.opts.Client = c
	gvr := schema.GroupVersionResource{Group: "flowcontrol.apiserver.k8s.io", Version: "v1beta3", Resource: "flowschemas"}
	fsObj := &unstructured.Unstructured{}
	fsObj.SetAPIVersion(gvr.GroupVersion().String())
	fsObj.SetKind("FlowSchema")
	fsObj.SetName("mine")
	fsObj.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "helm", APIVersion: "flowcontrol.apiserver.k8s.io/v1beta3"}})
	w.opts.Dynamic = dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "FlowSchemaList"}, fsObj)
	want(t, only(w.plan(t), "removed-apis"), Blocking, "flowschemas.flowcontrol.apiserver.k8s.io/mine", "which v1.32 no longer serves")
}
