package preflight

import "github.com/kubelift/kubelift/internal/inplace/release"

// AllAtTarget: every node selected says (the kubelets a run moves) runs
// t's kubelet, every control-plane component runs t, and no etcd member
// moves.
func (p *Plan) AllAtTarget(t *release.Release, selected func(node string) bool) bool {
	to := t.Version.String()
	if p.Etcd != nil {
		return false
	}
	for _, n := range p.Nodes {
		if !n.AtTarget(t) && selected(n.Name) {
			return false
		}
		for _, c := range release.ControlPlaneFiles {
			if v, ok := n.Components[c]; ok && v != to {
				return false
			}
		}
	}
	return true
}

// AtTarget: the node's kubelet runs t, and so does its kube-proxy unit
// when it has one and the bundle carries kube-proxy.
func (n NodeState) AtTarget(t *release.Release) bool {
	to := t.Version.String()
	if n.Kubelet != to {
		return false
	}
	v, runs := n.Components[release.KubeProxy]
	if _, _, inBundle := t.File(release.KubeProxy, release.ArchOr(n.Arch)); runs && inBundle && v != to {
		return false
	}
	return true
}
