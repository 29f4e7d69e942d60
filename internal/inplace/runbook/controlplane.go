package runbook

import (
	"context"
	"fmt"

	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
)

// controlPlaneDone: every control-plane part runs the target.
func (r *upgradeRun) controlPlaneDone() bool {
	to := r.target.Version.String()
	for i := range r.plan.Nodes {
		n := &r.plan.Nodes[i]
		for _, c := range r.driver.Components(n) {
			if n.Components[c] != to {
				return false
			}
		}
	}
	return true
}

// controlPlaneStep moves each control-plane node's control plane, one
// node at a time, through the cluster's driver: to each hop in turn (every
// control-plane node at a hop before any moves past it: the API servers
// never more than one minor apart), then to the target. The kubelets stay
// where they are meanwhile, within the skew the bundle was made for.
func (r *upgradeRun) controlPlaneStep(ctx context.Context) error {
	if err := r.setState(ctx, record.StateUpgradingControlPlane); err != nil {
		return err
	}
	for _, t := range r.target.Chain() {
		to := t.Version.String()
		if len(r.target.Hops) > 0 {
			r.log.Info("control plane", "to", to, "hop", t != r.target)
		}
		for _, n := range r.plan.Nodes {
			if n.Role != release.RoleControlPlane {
				continue
			}
			if err := r.driver.Upgrade(ctx, r.driverRun(), n.Name, t); err != nil {
				return err
			}
			if moved := r.moved.Take(n.Name); moved != nil {
				if err := r.settleControlPlane(ctx, n.Name, to, t != r.target, moved); err != nil {
					r.setNode(ctx, n.Name, record.NodeFailed, "control plane at "+to, err)
					return err
				}
			}
			r.setNode(ctx, n.Name, record.NodePending, "control plane at "+to, nil)
		}
	}
	return r.setState(ctx, record.StateUpgradedControlPlane)
}

// rollback restores comp (a kubelet or kube-proxy) after a failed swap
// and waits for the old version; a kubelet must be back (kubeletBack),
// and its node is uncordoned. It returns the original failure.
func (r *upgradeRun) rollback(ctx context.Context, o *nodeops.Ops, comp string, cause error) error {
	if err := driver.PutBack(ctx, r.driverRun(), o, comp, cause); err != nil {
		return err
	}
	if comp != "kubelet" {
		return driver.RolledBack(o, cause)
	}
	ctx = context.WithoutCancel(ctx)
	if r.watch != nil {
		if err := r.kubeletBack(ctx, o.Name, o.From); err != nil {
			return fmt.Errorf("%w; after rollback %w", cause, err)
		}
	}
	if err := r.uncordon(ctx, o.Name); err != nil {
		return fmt.Errorf("%w; after rollback: %w", cause, err)
	}
	return driver.RolledBack(o, cause)
}

// kubeletBack waits for node's kubelet at from to be alive: its Lease
// renewed after this wait begins, then the Node Ready at from. Ready
// alone may be stale: a new kubelet that never started posted nothing.
func (r *upgradeRun) kubeletBack(ctx context.Context, node, from string) error {
	if err := driver.WaitNodeLeaseRenewed(ctx, r.driverRun(), node, r.opts.ReadyTimeout); err != nil {
		return err
	}
	if err := r.watch.Until(ctx, node, r.opts.ReadyTimeout, cluster.ReadyAt(from)); err != nil {
		return fmt.Errorf("node %s not Ready at %s: %w", node, from, err)
	}
	return nil
}
