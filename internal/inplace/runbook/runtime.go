package runbook

import (
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/verify"
	"github.com/kubelift/kubelift/internal/waiter"
)

// runtimeMove is the move of k's node's containerd the bundle makes
// (release.RuntimeMoveFor, from the runtime the plan held to the target:
// preflight.View.Runtime); nil when it makes none.
func (r *upgradeRun) runtimeMove(k *kubeletRun) (*release.RuntimeMove, error) {
	rt, err := r.view.Runtime(k.name)
	if err != nil {
		return nil, err
	}
	return r.target.RuntimeMoveFor(rt, release.ArchOr(k.arch))
}

// runtimePaths are where node name keeps containerd's programs, its
// config and runc, as the plan read them on the node (nodefacts'
// containerd section); what it did not read takes nodeops' defaults.
func (r *upgradeRun) runtimePaths(name string) nodeops.RuntimePaths {
	var p nodeops.RuntimePaths
	if r.view == nil || r.view.Facts[name] == nil {
		return p
	}
	c := r.view.Facts[name].Containerd
	if c.Binary != "" {
		p.ContainerdDir = path.Dir(c.Binary)
	}
	p.Config, p.RuncBinary = c.Config, c.Runc
	return p
}

// wouldMoveRuntime says, in a dry run, the runtime move the node gets.
func (r *upgradeRun) wouldMoveRuntime(k *kubeletRun) string {
	m, err := r.runtimeMove(k)
	if err != nil {
		return "refuse the node: " + err.Error()
	}
	if m == nil {
		return ""
	}
	what := fmt.Sprintf("move containerd %s to %s", m.From, m.To)
	if m.RuncSHA256 != "" {
		what += " and runc to the bundle's"
	}
	if m.Major {
		what += ", its config migrated by the new containerd"
	}
	return what + "; restart it; the same containers must run with the same processes, else containerd is put back"
}

// moveRuntime moves the node's containerd (and runc) to the bundle's
// before its kubelet, where the bundle carries a newer one than the node
// runs: once the run still holds the lock, runtime-swap backs the old
// programs and config up, renames the staged ones into place and
// restarts containerd. The containers run on under their shims, so the
// same ones must run after it with the same processes; if they do not,
// or the swap fails, the old containerd is put back and the node's
// upgrade stops here, its kubelet not swapped.
func (r *upgradeRun) moveRuntime(ctx context.Context, k *kubeletRun) error {
	m, err := r.runtimeMove(k)
	if err != nil || m == nil {
		return err
	}
	if err := r.fence(ctx); err != nil {
		return fmt.Errorf("node %s: containerd not moved: %w", k.name, err)
	}
	r.event(ctx, k.name, "MovingRuntime", fmt.Sprintf("kubelift: containerd %s -> %s", m.From, m.To))
	if err := k.o.SwapRuntime(ctx, m, r.runtimePaths(k.name)); err != nil {
		return r.restoreRuntime(ctx, k, err)
	}
	if err := r.sameContainers(ctx, k.o, k.before); err != nil {
		return r.restoreRuntime(ctx, k, err)
	}
	k.runtimeMoved = true
	r.log.Info("containerd moved", "node", k.name, "from", m.From.String(), "to", m.To.String(), "containers", len(k.before))
	return nil
}

// restoreRuntime puts the node's old containerd back after cause, and
// returns cause (with the restore's own failure, if any).
func (r *upgradeRun) restoreRuntime(ctx context.Context, k *kubeletRun, cause error) error {
	if err := k.o.RestoreRuntime(context.WithoutCancel(ctx), r.runtimePaths(k.name)); err != nil {
		return errors.Join(cause, fmt.Errorf("node %s: putting the old containerd back: %w", k.name, err))
	}
	r.event(ctx, k.name, "RuntimeRestored", fmt.Sprintf("kubelift: containerd put back: %v", cause))
	return fmt.Errorf("%w; the old containerd is back", cause)
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
	return r.restoreRuntime(ctx, k, err)
}

// undoRuntime puts back the containerd a runtime move on node backed up,
// if one did (putRuntimeBack).
func (r *upgradeRun) undoRuntime(ctx context.Context, node string) error {
	return r.onNodeFrom(ctx, node, r.plan.From[0], r.putRuntimeBack)
}

// putRuntimeBack restores the containerd a runtime move on o's node
// backed up, if one did, and checks that the same containers run with
// the same processes after it.
func (r *upgradeRun) putRuntimeBack(ctx context.Context, o *nodeops.Ops) error {
	backed, err := o.RuntimeBackedUp(ctx)
	if err != nil || !backed {
		return err
	}
	if r.dry {
		r.would(o.Name, "put back the containerd the runtime move replaced; the same containers must run with the same processes", "")
		return nil
	}
	before, err := o.Containers(ctx)
	if err != nil {
		return err
	}
	if err := o.RestoreRuntime(ctx, r.runtimePaths(o.Name)); err != nil {
		return err
	}
	if err := r.sameContainers(ctx, o, before); err != nil {
		return err
	}
	r.event(ctx, o.Name, "RuntimeRestored", "kubelift: containerd put back by the rollback")
	return nil
}

// sameContainers waits, up to the run's ReadyTimeout, for containerd on
// o's node to answer over CRI (after `systemctl restart containerd` the
// socket may not be there yet: a unit started is not a runtime serving),
// then judges its first answer: every container of before runs with the
// same process (verify.Gone), or the move restarted some. A runtime that
// never answers fails with its last read's error.
func (r *upgradeRun) sameContainers(ctx context.Context, o *nodeops.Ops, before map[string]nodeops.Container) error {
	err := r.wait.Poll(ctx, time.Second, r.opts.ReadyTimeout, func(ctx context.Context) error {
		after, err := o.Containers(ctx)
		if err != nil {
			return fmt.Errorf("node %s: the containers after containerd restarted: %w", o.Name, err)
		}
		if gone := verify.Gone(before, after, nil); len(gone) > 0 {
			return waiter.Stop(&verify.RestartedError{Node: o.Name, Containers: gone})
		}
		return nil
	})
	if t, ok := errors.AsType[*waiter.TimeoutError](err); ok && t.Last != nil {
		return fmt.Errorf("%w (still, %s after the restart)", t.Last, t.After)
	}
	return err
}
