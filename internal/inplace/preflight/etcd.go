package preflight

import (
	"github.com/kubelift/kubelift/internal/inplace/etcd"
	"github.com/kubelift/kubelift/internal/inplace/release"
)

// EtcdMembers are the members of a binary cluster's etcd as the plan's
// nodes said (control-plane nodes that run the etcd unit).
func EtcdMembers(v *View) ([]etcd.Member, error) {
	var cps []string
	for _, t := range v.Addresses {
		if t.Role == release.RoleControlPlane {
			cps = append(cps, t.Name)
		}
	}
	return etcd.Members(cps, v.Facts)
}

// etcd plans the move of a binary cluster's etcd to the one the bundle
// carries (etcd.PlanFor): blocking where etcd cannot go there in one move
// (a minor skipped, or 3.6 from a 3.5 below etcd.Floor36). kubeadm moves
// its own etcd with its control plane.
func (pc *planCheck) etcd() {
	if pc.kind != release.KindBinary {
		return
	}
	members, err := EtcdMembers(pc.view)
	arch := ""
	for _, n := range pc.plan.Nodes {
		if len(members) > 0 && n.Name == members[0].Node {
			arch = n.Arch
		}
	}
	if err == nil {
		pc.plan.Etcd, err = etcd.PlanFor(pc.target, members, arch)
	}
	if err != nil {
		pc.add(Blocking, CheckEtcd, "etcd", err.Error(), "make the bundle with an etcd the members can move to (bundle create --etcd), or pass --ignore-preflight "+string(CheckEtcd)+" to leave etcd as it is")
	}
}
