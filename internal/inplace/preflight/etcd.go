package preflight

import (
	"github.com/kubelift/kubelift/internal/inplace/etcd"
	"github.com/kubelift/kubelift/internal/inplace/release"
)

// etcd plans the move of a binary cluster's etcd to the one the bundle
// carries (etcd.PlanFor): blocking where etcd cannot go there in one move
// (a minor skipped, or 3.6 from a 3.5 below etcd.Floor36), warning where
// the API will fail requests meanwhile (etcd.Warnings).
// kubeadm moves its own etcd with its control plane.
func (pc *planCheck) etcd() {
	if pc.kind != release.KindBinary {
		return
	}
	arch := "" // the control-plane nodes' (a binary control plane is of one arch)
	for _, n := range pc.plan.Nodes {
		if n.Role == release.RoleControlPlane {
			arch = n.Arch
		}
	}
	if pc.target == nil || pc.target.Manifest == nil {
		return
	}
	if _, _, ok := pc.target.File(etcd.File, release.ArchOr(arch)); !ok {
		return // the members are read only for a move: a bundle without etcd needs nothing of them
	}
	members, err := etcd.Members(pc.view.Addresses, pc.view.Facts)
	if err == nil {
		pc.plan.Etcd, err = etcd.PlanFor(pc.target, members, arch)
	}
	if err == nil && pc.plan.Etcd != nil {
		for _, w := range etcd.Warnings(pc.view.Addresses, pc.view.Facts, members) {
			pc.add(Warning, CheckEtcd, "etcd", w.Message, w.Fix)
		}
	}
	if err != nil {
		pc.add(Blocking, CheckEtcd, "etcd", err.Error(), "make the bundle with an etcd the members can move to (bundle create --etcd), or pass --ignore-preflight "+string(CheckEtcd)+" to leave etcd as it is")
	}
}
