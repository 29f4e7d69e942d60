package runbook

import (
	"context"
	"errors"
	"fmt"

	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/nodestack"
)

// stack moves this run's nodes' runtimes (nodestack.Mover).
func (r *upgradeRun) stack() nodestack.Mover {
	return nodestack.Mover{View: r.view, Target: r.target, Wait: r.wait, ReadyTimeout: r.opts.ReadyTimeout, Event: r.event, Log: r.log}
}

// wouldMoveRuntime says, in a dry run, the runtime move the node gets.
func (r *upgradeRun) wouldMoveRuntime(k *kubeletRun) string { return r.stack().Would(k.name, k.arch) }

// moveRuntime moves the node's containerd (and runc) to the bundle's
// before its kubelet, where the bundle carries a newer one than the node
// runs, once the run still holds the lock (nodestack.Mover.Move): if the
// same containers do not run after it with the same processes, or the
// swap fails, the old containerd is put back and the node's upgrade
// stops here, its kubelet not swapped.
func (r *upgradeRun) moveRuntime(ctx context.Context, k *kubeletRun) error {
	s := r.stack()
	m, err := s.For(k.name, k.arch)
	if err != nil || m == nil {
		return err
	}
	if err := r.fence(ctx); err != nil {
		return fmt.Errorf("node %s: containerd not moved: %w", k.name, err)
	}
	if err := s.Move(ctx, k.o, m, k.before); err != nil {
		return err
	}
	k.runtimeMoved = true
	return nil
}

// rollbackNode puts k's node back after cause: its old kubelet (which
// ran on the old containerd and on the new), then its old containerd
// where this run moved it, or a run this one resumes did (the plan then
// read the bundle's containerd on the node, and this upgrade's backup of
// the old one is there: a run killed after the node's runtime step).
func (r *upgradeRun) rollbackNode(ctx context.Context, k *kubeletRun, cause error) error {
	err := r.rollback(ctx, k.o, "kubelet", cause)
	if !k.runtimeMoved {
		backed, berr := k.o.RuntimeBackedUp(context.WithoutCancel(ctx))
		if berr != nil {
			return errors.Join(err, fmt.Errorf("node %s: whether this upgrade moved its containerd: %w", k.name, berr))
		}
		if !backed {
			return err
		}
	}
	return r.stack().Restore(ctx, k.o, err)
}

// undoRuntime puts back the containerd a runtime move on node backed up,
// if one did (putRuntimeBack).
func (r *upgradeRun) undoRuntime(ctx context.Context, node string) error {
	return r.onNodeFrom(ctx, node, r.plan.From[0], r.putRuntimeBack)
}

// putRuntimeBack restores the containerd a runtime move on o's node
// backed up, if one did, and checks that the same containers run with
// the same processes after it (nodestack.Mover.PutBack).
func (r *upgradeRun) putRuntimeBack(ctx context.Context, o *nodeops.Ops) error {
	backed, err := o.RuntimeBackedUp(ctx)
	if err != nil || !backed {
		return err
	}
	if r.dry {
		r.would(o.Name, "put back the containerd the runtime move replaced; the same containers must run with the same processes", "")
		return nil
	}
	return r.stack().PutBack(ctx, o)
}
