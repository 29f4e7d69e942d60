package runbook

import (
	"context"
	"fmt"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/upgradelock"
	"github.com/kubelift/kubelift/internal/waiter"
)

// Rollback walks the runbook backward, undoing each step that changed
// something: it restores the binaries the recorded upgrade replaced, from the
// backups on each node, in reverse order: kubelets (workers, then
// control-plane nodes), then the control plane node by node through the
// cluster's driver (binary: scheduler, controller manager, API server;
// kubeadm: the manifests kubeadm kept), each waited for at the old
// version.
// It holds the upgrade lock, and refuses what RollbackAllowed refuses.
//
// With DryRun it reads what runs, takes no lock and changes nothing: the
// result lists each restore it would make (ApplyResult.DryRun).
func Rollback(ctx context.Context, opts ApplyOptions) (*ApplyResult, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	p := &opts.Plan
	st, err := preflight.RecordedUpgrade(ctx, p.Client)
	if err != nil {
		return nil, err
	}
	to, from := st.To, st.From
	var lock *upgradelock.Lock
	if !opts.DryRun {
		var stop func()
		if lock, ctx, stop, err = upgradelock.Take(ctx, p.Client, opts.Holder, opts.LockDuration, opts.Clock, p.Log, opts.Locked); err != nil {
			return nil, err
		}
		defer stop()
	}

	tv, err := catalog.ParseVersion(to)
	if err != nil {
		return nil, err
	}
	p.Target = &release.Release{Version: tv}
	v, nodes, err := preflight.ReadRollback(ctx, *p, from, to)
	if err != nil {
		return nil, err
	}
	if !opts.DryRun {
		st.Holder = opts.Holder // the record is this run's now
	}
	r := &upgradeRun{opts: opts, client: p.Client, log: p.Log, target: p.Target, view: v, state: st, res: &ApplyResult{State: st},
		plan: &preflight.Plan{From: []string{from}}, tgts: map[string]nodeaccess.Address{}, dry: opts.DryRun, wait: waiter.Waiter{Clock: opts.Clock}, lock: lock}
	for _, t := range v.Addresses {
		r.tgts[t.Name] = t
	}
	if !r.dry {
		defer r.startFlushing(ctx)()
		w, err := cluster.WatchNodes(ctx, p.Client, r.wait)
		if err != nil {
			return nil, err
		}
		defer w.Close()
		r.watch = w
	}
	r.driver = driverFor(v)
	r.plan.Nodes = nodes
	// The runbook backward: each step that changed something undone.
	steps := r.runbook()
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		if s.undo == nil {
			continue
		}
		r.step = s.name
		r.log.Info("undo", "step", s.name, "dryRun", r.dry)
		if err := s.undo(ctx); err != nil {
			r.fail(ctx, err)
			return r.res, fmt.Errorf("undo %s: %w", s.name, err)
		}
	}
	return r.res, nil
}

// kubeletsUndo puts every kube-proxy unit, kubelet and moved containerd
// back, workers, then control-plane nodes, and uncordons what a run
// cordoned.
func (r *upgradeRun) kubeletsUndo(ctx context.Context) error {
	for _, role := range []bool{false, true} {
		for _, n := range r.plan.Nodes {
			if (n.Role == release.RoleControlPlane) != role {
				continue
			}
			// kube-proxy moved after the kubelet: back first.
			if _, ok := n.Components[release.KubeProxy]; ok {
				if err := r.undoComponent(ctx, n.Name, release.KubeProxy); err != nil {
					return err
				}
			}
			if err := r.undoComponent(ctx, n.Name, "kubelet"); err != nil {
				return err
			}
			// The old kubelet runs on either containerd: the runtime
			// after it.
			if err := r.undoRuntime(ctx, n.Name); err != nil {
				return err
			}
			// A run killed after its drain left the node cordoned
			// (kubelift.dev/cordoned): uncordoned; one cordoned by hand
			// stays so.
			if err := r.uncordon(ctx, n.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// controlPlaneUndo puts each control-plane node's control plane back,
// through the driver, in the reverse of the order they moved in (the
// first control plane, where kubeadm's `upgrade apply` ran, last).
func (r *upgradeRun) controlPlaneUndo(ctx context.Context) error {
	for i := len(r.plan.Nodes) - 1; i >= 0; i-- {
		n := r.plan.Nodes[i]
		if n.Role != release.RoleControlPlane {
			continue
		}
		from := r.plan.From[0]
		if err := r.driver.Undo(ctx, r.driverRun(), n.Name); err != nil {
			return err
		}
		if moved := r.moved.Take(n.Name); moved != nil {
			if err := r.settleControlPlane(ctx, n.Name, from, false, moved); err != nil {
				r.setNode(ctx, n.Name, record.NodeFailed, "control plane at "+from, err)
				return err
			}
		}
	}
	return nil
}

// recordUndo records the upgrade as rolled back.
func (r *upgradeRun) recordUndo(ctx context.Context) error {
	return r.setState(ctx, record.StateRolledBack)
}

// undoComponent puts comp (a kubelet or kube-proxy) on node back at the
// version the recorded upgrade started from, when it runs the version it
// went to (a part that never moved, or is back already, is left alone),
// and waits for it; a kubelet must be back (kubeletBack), and its node
// loses kubelift's annotations.
func (r *upgradeRun) undoComponent(ctx context.Context, node, comp string) error {
	from := r.plan.From[0]
	return r.onNodeFrom(ctx, node, from, func(ctx context.Context, o *nodeops.Ops) error {
		moved, err := driver.UndoPart(ctx, r.driverRun(), o, comp)
		if err != nil || !moved {
			return err
		}
		if comp == "kubelet" && r.dry {
			r.would(node, "wait for its kubelet to renew the node's Lease and the node Ready at "+from+"; remove kubelift's annotations", "")
		} else if comp == "kubelet" {
			if err := r.kubeletBack(ctx, node, from); err != nil {
				return err
			}
			if err := record.Unmark(ctx, r.client, node); err != nil {
				return fmt.Errorf("node %s: %w", node, err)
			}
		}
		r.setNode(ctx, node, record.NodeRolledBack, comp, nil)
		return nil
	})
}
