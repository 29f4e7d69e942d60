package preflight

import (
	"fmt"
	"strings"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// runtime: every node's container runtime is a version the target's
// kubelet supports (the catalog's containerRuntimes, from the runtime's
// own compatibility table), and serves the CRI API it speaks. What the
// runtime says of itself over CRI (the node's facts) is held to the
// target where it was read; the Node's status where not. The kubelet
// moves straight to the target, so the hops do not count.
func (pc *planCheck) runtime() {
	rel := pc.target.Catalog
	for i := range pc.plan.Nodes {
		s := &pc.plan.Nodes[i]
		rt, ok := pc.runtimes[s.Name]
		if f := pc.view.Facts[s.Name]; f != nil && f.CRI != nil {
			if ok && f.CRI.Runtime != rt {
				pc.add(Warning, CheckRuntime, "node/"+s.Name,
					fmt.Sprintf("the node's status says it runs %s, the runtime itself says %s (changed since its kubelet last reported it): the runtime's own answer is checked", rt, f.CRI.Runtime),
					"")
			}
			rt, ok = f.CRI.Runtime, true
			// Kubelets from v1.26 speak CRI v1 only (v1alpha2 was removed).
			if f.CRI.APIVersion != "v1" {
				pc.add(Blocking, CheckRuntime, "node/"+s.Name,
					fmt.Sprintf("the node's runtime (%s) serves CRI %s; kubelet %s speaks CRI v1 only", rt, f.CRI.APIVersion, pc.target.Version),
					"move the node to a runtime that serves CRI v1 (containerd 1.6 or later) before this upgrade")
			}
		}
		if !ok {
			continue // no runtime reported
		}
		move, err := pc.target.RuntimeMoveFor(rt, release.ArchOr(s.Arch))
		if err != nil {
			pc.add(Blocking, CheckRuntime, "node/"+s.Name, err.Error(), "make the bundle again with a catalog whose node stack parses")
		}
		if move != nil {
			s.RuntimeMove = fmt.Sprintf("%s %s -> %s", rt.Name, move.From, move.To)
		}
		if len(rel.ContainerRuntimes) == 0 {
			continue // a bundle made before the catalog said
		}
		supported, listed := rel.RuntimeSupport(rt.Name, rt.Version)
		if move != nil {
			if ok, _ := rel.RuntimeSupport(rt.Name, move.To); ok {
				why := ""
				if !supported {
					why = fmt.Sprintf(", which kubelet %s does not support", pc.target.Version)
				}
				pc.add(Info, CheckRuntime, "node/"+s.Name,
					fmt.Sprintf("the node runs %s%s: apply moves it to %s %s (the bundle's) before its kubelet, every container kept", rt, why, rt.Name, move.To), "")
				continue
			}
		}
		switch {
		case !listed:
			pc.add(Warning, CheckRuntime, "node/"+s.Name,
				fmt.Sprintf("the node runs %s; the catalog lists no versions of %s for kubelet %s, so its support is not checked", rt, rt.Name, pc.target.Version),
				"check "+rt.Name+"'s own compatibility table for Kubernetes "+pc.target.Version.MinorString())
		case !supported:
			pc.add(Blocking, CheckRuntime, "node/"+s.Name,
				fmt.Sprintf("the node runs %s, which kubelet %s does not support (it supports %s %s)", rt, pc.target.Version, rt.Name, strings.Join(rel.RuntimeVersions(rt.Name), ", ")),
				fmt.Sprintf("move the node to a supported %s before this upgrade, or bundle one the target supports (bundle create --node-stack carries the containerd the catalog pairs with %s)", rt.Name, pc.target.Version))
		}
	}
}

// tools: where the bundle carries the node stack, apply moves each node's
// CNI plugins and crictl to the bundle's, into the directory the node's
// runtime takes the plugins from (crictl info, read with the facts). A
// node whose runtime was asked and did not say is blocked: the bundle's
// plugins would go where nothing runs them. A node at the target already
// is not walked again, so not said.
func (pc *planCheck) tools() {
	for i := range pc.plan.Nodes {
		s := &pc.plan.Nodes[i]
		// A node at the target already is not walked again.
		if pc.target.ToolsMoveFor(release.ArchOr(s.Arch)) == nil || s.Kubelet == pc.target.Version.String() {
			continue
		}
		var p release.ToolsPaths
		if f := pc.view.Facts[s.Name]; f != nil {
			c := f.Containerd
			if c.CNIBinDir == "" && c.CNIErr != "" {
				fix := "make the runtime's CRI config name its CNI plugins' directory (containerd: the cri plugin's cni bin_dirs), or make the bundle without --node-stack"
				if c.CNIErr == "crictl info failed" {
					fix = "make crictl on the node reach the runtime (crictl info), then plan again"
				}
				pc.add(Blocking, CheckRuntime, "node/"+s.Name,
					fmt.Sprintf("the bundle carries the node stack, but where the node's runtime takes the CNI plugins from was not read (%s)", c.CNIErr), fix)
				continue
			}
			p = release.ToolsPaths{CNIBinDir: c.CNIBinDir, Crictl: c.Crictl}
		}
		cni, crictl := p.Resolved()
		s.ToolsMove = fmt.Sprintf("CNI plugins in %s, crictl at %s", cni, crictl)
	}
}

// cgroupDriver: the cgroup driver the kubelet runs pods under stays the
// same across the upgrade. A kubelet from v1.31 takes the driver from the
// runtime (CRI RuntimeConfig, KubeletCgroupDriverFromCRI: beta and on by
// default in v1.31, locked on from v1.34) and its own configuration's
// only from a runtime that does not answer; one before v1.31 takes its
// configuration's. Where the two differ, the new kubelet would look for
// the pods' cgroups where the old one did not put them.
func (pc *planCheck) cgroupDriver() {
	for i := range pc.plan.Nodes {
		s := &pc.plan.Nodes[i]
		f := pc.view.Facts[s.Name]
		if f == nil || s.Kubelet == "" {
			continue
		}
		cur, err := catalog.ParseVersion(s.Kubelet)
		if err != nil {
			continue // refused under values
		}
		now, nowFrom := effectiveCgroupDriver(f, cur)
		s.CgroupDriver = now
		next, nextFrom := effectiveCgroupDriver(f, pc.target.Version)
		if now == next {
			continue
		}
		pc.add(Blocking, CheckCgroup, "node/"+s.Name,
			fmt.Sprintf("kubelet %s runs the node's pods under the %s cgroup driver (%s); kubelet %s would take %s (%s), and look for the pods' cgroups where they are not", cur, now, nowFrom, pc.target.Version, next, nextFrom),
			"make the kubelet's cgroup driver and the runtime's agree before this upgrade (the kubelet's cgroupDriver; containerd's SystemdCgroup in its runc options), as the node was set up")
	}
}

// effectiveCgroupDriver is the cgroup driver kubelet v takes on the
// node, and where from.
func effectiveCgroupDriver(f *nodefacts.Facts, v catalog.Version) (string, string) {
	fromCRI := v.Compare(catalog.Version{Major: 1, Minor: 31}) >= 0
	if on, set := f.FeatureGate("kubelet", "KubeletCgroupDriverFromCRI"); v.Compare(catalog.Version{Major: 1, Minor: 34}) < 0 && set && !on {
		fromCRI = false // turned off by the kubelet's --feature-gates, until v1.34 locks it on
	}
	if fromCRI && f.CRI != nil && f.CRI.RuntimeConfig && f.CRI.CgroupDriver != "" {
		return f.CRI.CgroupDriver, "the runtime's, over CRI"
	}
	if f.KubeletCgroupDriver != "" {
		return f.KubeletCgroupDriver, "the kubelet's " + f.KubeletCgroupDriverSource
	}
	return "cgroupfs", "the kubelet's default"
}
