package runbook

import (
	"context"
	"slices"

	"github.com/kubelift/kubelift/internal/inplace/coredns"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
)

// corednsStep moves a binary cluster's CoreDNS to the release's once the
// control plane runs the target (coredns.Roller.Move; kubeadm moves its own).
func (r *upgradeRun) corednsStep(ctx context.Context) error {
	if r.view.Kubeadm != nil || slices.Contains(r.opts.Ignore, preflight.CheckCoreDNS) {
		return nil
	}
	return r.dns().Move(ctx, coredns.ImageIn(r.target.Record), r.fence)
}

// corednsUndo puts back what this upgrade's CoreDNS move replaced.
func (r *upgradeRun) corednsUndo(ctx context.Context) error { return r.dns().PutBack(ctx) }

func (r *upgradeRun) dns() coredns.Roller {
	return coredns.Roller{Client: r.client, Upgrade: r.state.From + " to " + r.state.To, Wait: r.wait, Timeout: r.opts.ReadyTimeout, Log: r.log, Dry: r.dry, Would: r.would}
}
