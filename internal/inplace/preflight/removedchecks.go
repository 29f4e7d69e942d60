package preflight

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/removedapis"
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

func (pc *planCheck) removedAPI(ctx context.Context, version string, api catalog.RemovedAPI) {
	gvs := api.GroupVersion()
	for _, r := range removedapis.Find(ctx, pc.opts.Client.Discovery(), pc.opts.Dynamic, api) {
		served := fmt.Sprintf("%s is served now and not from %s", r.Object[len("api/"):], version)
		switch {
		case r.ListErr != nil:
			pc.add(Warning, CheckRemovedAPIs, r.Object, fmt.Sprintf("%s; its objects cannot be listed: %v", served, r.ListErr), "check that no object or client uses it")
		case !r.Listed:
			pc.add(Warning, CheckRemovedAPIs, r.Object, served, "check that no client uses it")
		case r.Count > 0 && len(r.Written) == 0:
			pc.add(Warning, CheckRemovedAPIs, r.Object, fmt.Sprintf("%d %s are served under %s, which %s no longer serves; none was written through it, but clients reading through it will fail", r.Count, r.Name, gvs, version),
				"check that no client uses "+gvs)
		}
		for _, w := range r.Written {
			pc.add(Blocking, CheckRemovedAPIs, w.Name, fmt.Sprintf("was written through %s (by %s), which %s no longer serves: whatever writes it so will fail from then on", gvs, w.Manager, version),
				"re-apply it, and change the manifests and clients that write it, through a served version of "+api.Group)
		}
	}
}
