package preflight

import (
	"context"

	"github.com/kubelift/kubelift/internal/inplace/coredns"
	"github.com/kubelift/kubelift/internal/inplace/release"
)

// coreDNS plans a binary cluster's CoreDNS move to the release's
// (coredns.PlanFor), kubeadm's being kubeadm's: blocking where it cannot
// be moved (the fix: move it by hand, or ignore the check to leave it).
func (pc *planCheck) coreDNS(ctx context.Context) {
	image := coredns.ImageIn(pc.target.Record)
	if pc.kind != release.KindBinary || image == "" {
		return
	}
	m, warn, err := coredns.PlanFor(ctx, pc.opts.Client, image)
	obj := "deployment/" + coredns.Namespace + "/" + coredns.Name
	switch {
	case err != nil:
		pc.add(Blocking, CheckCoreDNS, obj, err.Error(),
			"move CoreDNS to the release's by hand (its Corefile too), or pass --ignore-preflight "+string(CheckCoreDNS)+" to leave it as it is")
		return
	case warn != "":
		pc.add(Warning, CheckCoreDNS, obj, warn,
			"make the anti-affinity preferred, or have a node free for each replica; else the roll does not finish within --ready-timeout and CoreDNS is put back")
	}
	pc.plan.CoreDNS = m
}
