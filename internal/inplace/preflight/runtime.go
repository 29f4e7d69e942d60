package preflight

import (
	"fmt"
	"strings"
)

// runtime: every node's container runtime is a version the target's
// kubelet supports (the catalog's containerRuntimes, from the runtime's
// own compatibility table). The kubelet moves straight to the target, so
// the hops do not count.
func (pc *planCheck) runtime() {
	rel := pc.target.Catalog
	if len(rel.ContainerRuntimes) == 0 {
		return // a bundle made before the catalog said
	}
	for _, s := range pc.plan.Nodes {
		rt, ok := pc.runtimes[s.Name]
		if !ok {
			continue
		}
		supported, listed := rel.RuntimeSupport(rt.Name, rt.Version)
		switch {
		case !listed:
			pc.add(Warning, CheckRuntime, "node/"+s.Name,
				fmt.Sprintf("the node runs %s; the catalog lists no versions of %s for kubelet %s, so its support is not checked", rt, rt.Name, pc.target.Version),
				"check "+rt.Name+"'s own compatibility table for Kubernetes "+pc.target.Version.MinorString())
		case !supported:
			pc.add(Blocking, CheckRuntime, "node/"+s.Name,
				fmt.Sprintf("the node runs %s, which kubelet %s does not support (it supports %s %s)", rt, pc.target.Version, rt.Name, strings.Join(rel.RuntimeVersions(rt.Name), ", ")),
				fmt.Sprintf("move the node to a supported %s before this upgrade: kubelift does not move the runtime yet", rt.Name))
		}
	}
}
