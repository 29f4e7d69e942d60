package preflight

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// removedFlags: no component is started with a flag the target, or a
// hop on the way, removed.
func (pc *planCheck) removedFlags() {
	for _, t := range pc.target.Chain() {
		rel := t.Catalog
		removed := map[string][]string{"kubelet": rel.RemovedKubeletFlags}
		for c, fl := range rel.RemovedFlags {
			removed[c] = fl
		}
		for _, s := range pc.plan.Nodes {
			f := pc.view.Facts[s.Name]
			if f == nil {
				continue
			}
			for _, comp := range slices.Sorted(maps.Keys(removed)) {
				for _, fl := range removed[comp] {
					if slices.Contains(f.Flags[comp], fl) {
						pc.add(Blocking, CheckRemovedFlags, "node/"+s.Name, fmt.Sprintf("%s is started with %s (in %s), which %s removed: it would not start", comp, fl, f.FlagSources[comp+" "+fl], rel.Version),
							"remove "+fl+" from "+f.FlagSources[comp+" "+fl])
					}
				}
			}
		}
	}
}

// hopList names the hops of t, "v1.31.14, v1.32.13".
func hopList(t *release.Release) string {
	var vs []string
	for _, h := range t.Hops {
		vs = append(vs, h.Version.String())
	}
	return strings.Join(vs, ", ")
}

// cgroupV1: kubelets from 1.35 refuse to start on a cgroup v1 host unless
// failCgroupV1 is false in their configuration. A kubeadm cluster's comes
// from the kubelet-config ConfigMap (kubeadm upgrade node rewrites the
// node's file from it), a binary cluster's from the node's file or flag.
func (pc *planCheck) cgroupV1() {
	if pc.target.Version.Minor < 35 {
		return
	}
	for _, s := range pc.plan.Nodes {
		f := pc.view.Facts[s.Name]
		if f == nil || f.Cgroup != 1 {
			continue
		}
		msg := fmt.Sprintf("the node runs cgroup v1: kubelet %s will refuse to start on it unless failCgroupV1 is false", pc.target.Version)
		flagFalse := f.FailCgroupV1 != nil && !*f.FailCgroupV1 && f.FailCgroupV1Source == "kubelet --fail-cgroupv1"
		if kc := pc.view.Kubeadm; kc != nil {
			// kubeadm upgrade node rewrites the node's file from the
			// ConfigMap; a flag (kubeadm-flags.env, KUBELET_EXTRA_ARGS)
			// stays.
			if (kc.KubeletFailCgroupV1 == nil || *kc.KubeletFailCgroupV1) && !flagFalse {
				pc.add(Blocking, CheckCgroup, "node/"+s.Name, msg+", and configmap kube-system/kubelet-config does not set it false (kubeadm upgrade node writes the node's configuration from it)",
					"set failCgroupV1: false in configmap kube-system/kubelet-config, or move the node to cgroup v2")
			}
			continue
		}
		if f.FailCgroupV1 != nil && !*f.FailCgroupV1 {
			continue
		}
		where := "the kubelet's configuration file"
		if c := f.Values["kubelet --config"]; c != "" && nodefacts.CheckPath(s.Name, "kubelet --config", c) == nil {
			where = c
		}
		switch {
		case f.FailCgroupV1 == nil:
			msg += ", and " + where + " does not set it"
		default:
			msg += ", and " + f.FailCgroupV1Source + " sets it true"
		}
		pc.add(Blocking, CheckCgroup, "node/"+s.Name, msg, "set failCgroupV1: false in "+where+" (and remove --fail-cgroupv1 if given), or move the node to cgroup v2")
	}
}

// removedAPIs: objects written through an API the target (or a minor on
// the way) stops serving block the plan; the API itself, still served now,
// is a warning, since clients reading through it will fail too.
func (pc *planCheck) removedAPIs(ctx context.Context) {
	for _, t := range pc.target.Chain() {
		for _, api := range t.Catalog.Removed() {
			pc.removedAPI(ctx, t.Version.MinorString(), api)
		}
	}
}

// maxRemovedAPIObjects bounds the objects one removed resource lists.
const maxRemovedAPIObjects = 50000

func (pc *planCheck) removedAPI(ctx context.Context, version string, api catalog.RemovedAPI) {
	gvs := api.GroupVersion()
	rl, err := pc.opts.Client.Discovery().ServerResourcesForGroupVersion(gvs)
	if err != nil {
		return // not served: nothing uses it
	}
	for _, r := range rl.APIResources {
		if strings.Contains(r.Name, "/") || !hasVerb(r.Verbs, "list") || (api.Resource != "" && r.Name != api.Resource) {
			continue
		}
		obj := "api/" + gvs + "/" + r.Name
		if pc.opts.Dynamic == nil {
			pc.add(Warning, CheckRemovedAPIs, obj, fmt.Sprintf("%s is served now and not from %s", obj[len("api/"):], version), "check that no client uses it")
			continue
		}
		res := pc.opts.Dynamic.Resource(schema.GroupVersionResource{Group: api.Group, Version: api.Version, Resource: r.Name})
		opts := cluster.ListOptions()
		n, writers := 0, 0
		for n < maxRemovedAPIObjects {
			l, err := res.List(ctx, opts)
			if err != nil {
				pc.add(Warning, CheckRemovedAPIs, obj, fmt.Sprintf("%s is served now and not from %s; its objects cannot be listed: %v", obj[len("api/"):], version, err), "check that no object or client uses it")
				break
			}
			for i := range l.Items {
				n++
				u := &l.Items[i]
				manager, ok := writtenThrough(u, gvs)
				if !ok {
					continue
				}
				writers++
				name := r.Name + "." + api.Group + "/" + u.GetName()
				if u.GetNamespace() != "" {
					name = r.Name + "." + api.Group + "/" + u.GetNamespace() + "/" + u.GetName()
				}
				pc.add(Blocking, CheckRemovedAPIs, name, fmt.Sprintf("was written through %s (by %s), which %s no longer serves: whatever writes it so will fail from then on", gvs, manager, version),
					"re-apply it, and change the manifests and clients that write it, through a served version of "+api.Group)
			}
			if opts.Continue = l.GetContinue(); opts.Continue == "" {
				break
			}
		}
		if n > 0 && writers == 0 {
			pc.add(Warning, CheckRemovedAPIs, obj, fmt.Sprintf("%d %s are served under %s, which %s no longer serves; none was written through it, but clients reading through it will fail", n, r.Name, gvs, version),
				"check that no client uses "+gvs)
		}
	}
}

// writtenThrough reports whether an object was last written through
// group-version gv, and by which field manager: its managedFields name the
// API version each manager used, and a kubectl apply's annotation the
// manifest's apiVersion.
func writtenThrough(u *unstructured.Unstructured, gv string) (string, bool) {
	for _, mf := range u.GetManagedFields() {
		if mf.APIVersion == gv {
			return mf.Manager, true
		}
	}
	if last := u.GetAnnotations()[corev1.LastAppliedConfigAnnotation]; last != "" {
		var m struct {
			APIVersion string `json:"apiVersion"`
		}
		if json.Unmarshal([]byte(last), &m) == nil && m.APIVersion == gv {
			return "kubectl apply", true
		}
	}
	return "", false
}

func hasVerb(verbs []string, v string) bool {
	for _, x := range verbs {
		if x == v {
			return true
		}
	}
	return false
}
