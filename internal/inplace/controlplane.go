package inplace

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/waiter"
)

// etcdStep snapshots etcd before the control plane is touched (the
// driver says how).
func (r *applyRun) etcdStep(ctx context.Context) error {
	if r.opts.SkipEtcdBackup || r.state.Backup != "" {
		return nil
	}
	if r.controlPlaneDone() {
		return nil
	}
	where, err := r.driver.BackupEtcd(ctx, r)
	if err != nil {
		return fmt.Errorf("%w (pass --skip-etcd-backup to upgrade without one)", err)
	}
	r.mu.Lock()
	r.state.Backup = where
	r.mu.Unlock()
	node, file, _ := strings.Cut(where, ":")
	r.log.Info("etcd snapshot", "node", node, "path", file)
	return r.save(ctx)
}

// controlPlaneDone: every control-plane part runs the target.
func (r *applyRun) controlPlaneDone() bool {
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
func (r *applyRun) controlPlaneStep(ctx context.Context) error {
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
			if err := r.driver.Upgrade(ctx, r, n.Name, t); err != nil {
				return err
			}
			if moved := r.takeMoved(n.Name); moved != nil {
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

// waitComponent waits for comp to run the version (and the API server to
// answer /readyz and /version at the node's address).
func (r *applyRun) waitComponent(ctx context.Context, o *nodeops.Ops, comp, version string) error {
	if r.dry {
		r.would(o.Name, fmt.Sprintf("wait for %s to run %s and be healthy", comp, version), "")
		return nil
	}
	defer r.timed(&r.res.Waiting)()
	err := r.wait.Poll(ctx, time.Second, r.opts.ReadyTimeout, func(ctx context.Context) error {
		v, err := o.Running(ctx, comp)
		switch {
		case err != nil:
			return err
		case v != version:
			return fmt.Errorf("%s runs %q, want %s", comp, v, version)
		case comp == "kube-apiserver" && r.opts.Plan.REST != nil:
			return preflight.Readyz(ctx, r.opts.Plan.REST, r.tgts[o.Name].Address)
		}
		return nil
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("node %s: %s not healthy at %s within %s: %w", o.Name, comp, version, r.opts.ReadyTimeout, err)
	}
	return err
}

// rollback restores comp after a failed swap and waits for the old
// version; it returns the original failure.
func (r *applyRun) rollback(ctx context.Context, o *nodeops.Ops, comp string, cause error) error {
	if lost := r.lostForGood(); lost != nil {
		r.log.Error("not rolled back: another run holds the upgrade lock now, and finishes the node", "node", o.Name, "component", comp, "err", cause)
		return fmt.Errorf("%w; %s on node %s not rolled back: %w (the run that holds it finishes the node)", cause, comp, o.Name, lost)
	}
	ctx = context.WithoutCancel(ctx)
	r.log.Error("rolling back", "node", o.Name, "component", comp, "err", cause)
	r.event(ctx, o.Name, "RollingBack", fmt.Sprintf("kubelift: %s back to %s: %v", comp, o.From, cause))
	if err := o.Restore(ctx, comp); err != nil {
		return fmt.Errorf("%w; rollback of %s failed too: %w", cause, comp, err)
	}
	if err := r.waitComponent(ctx, o, comp, o.From); err != nil {
		return fmt.Errorf("%w; after rollback %s: %w", cause, comp, err)
	}
	if comp == "kubelet" && r.watch != nil {
		if err := r.watch.until(ctx, o.Name, r.opts.ReadyTimeout, func(n *corev1.Node) bool {
			return cluster.NodeReady(n) && n.Status.NodeInfo.KubeletVersion == o.From
		}); err != nil {
			return fmt.Errorf("%w; after rollback node %s not Ready at %s: %w", cause, o.Name, o.From, err)
		}
	}
	if comp == "kubelet" {
		if err := r.uncordon(ctx, o.Name); err != nil {
			return fmt.Errorf("%w; after rollback: %w", cause, err)
		}
	}
	return fmt.Errorf("%w: node %s rolled back to %s: %w", ErrNodeFailed, o.Name, o.From, cause)
}
