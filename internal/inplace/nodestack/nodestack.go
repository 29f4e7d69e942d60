// Package nodestack moves what runs under and beside one node's kubelet in
// place, before its kubelet: containerd (and runc) to the bundle's where
// the bundle carries a newer one than the node runs, every container kept
// with its process, the old runtime put back on any failure; the CNI
// plugins and crictl to the bundle's where they differ (tools.go); and
// puts such moves back for a rollback. The runbook says when (a node's
// "runtime" and "tools" steps, its rollback, the kubelets' undo); this
// room says how, and, for a dry run, in words.
package nodestack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"time"

	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/verify"
	"github.com/kubelift/kubelift/internal/waiter"
)

// Mover moves the runtimes of one upgrade's nodes.
type Mover struct {
	// View is what the plan read: each node's runtime, and where it
	// keeps containerd's programs and config. Target is the release the
	// upgrade moves to.
	View   *preflight.View
	Target *release.Release
	// Wait and ReadyTimeout bound the wait for containerd to answer over
	// CRI again after its restart.
	Wait         waiter.Waiter
	ReadyTimeout time.Duration
	// Event posts an Event on a node.
	Event func(ctx context.Context, node, reason, msg string)
	Log   *slog.Logger
}

// For is the move of node's containerd the bundle makes
// (release.RuntimeMoveFor, from the runtime the plan held to the
// target): nil when it makes none.
func (m Mover) For(node, arch string) (*release.RuntimeMove, error) {
	rt, err := m.View.Runtime(node)
	if err != nil {
		return nil, err
	}
	return m.Target.RuntimeMoveFor(rt, release.ArchOr(arch))
}

// Would says, for a dry run, the move node gets ("" for none).
func (m Mover) Would(node, arch string) string {
	mv, err := m.For(node, arch)
	if err != nil {
		return "refuse the node: " + err.Error()
	}
	if mv == nil {
		return ""
	}
	what := fmt.Sprintf("move containerd %s to %s", mv.From, mv.To)
	if mv.RuncSHA256 != "" {
		what += " and runc to the bundle's"
	}
	if mv.Major {
		what += ", its config migrated by the new containerd"
	}
	return what + "; restart it; the same containers must run with the same processes, else containerd is put back"
}

// Move moves o's node's containerd (and runc) as mv says: runtime-swap
// backs the old programs and config up, renames the staged ones into
// place and restarts containerd. The containers run on under their
// shims, so those of before must run after it with the same processes;
// if they do not, or the swap fails, the old containerd is put back and
// the error says so.
func (m Mover) Move(ctx context.Context, o *nodeops.Ops, mv *release.RuntimeMove, before map[string]nodeops.Container) error {
	m.Event(ctx, o.Name, "MovingRuntime", fmt.Sprintf("kubelift: containerd %s -> %s", mv.From, mv.To))
	if err := o.SwapRuntime(ctx, mv, m.paths(o.Name)); err != nil {
		return m.Restore(ctx, o, err)
	}
	if err := m.sameContainers(ctx, o, before); err != nil {
		return m.Restore(ctx, o, err)
	}
	m.Log.Info("containerd moved", "node", o.Name, "from", mv.From.String(), "to", mv.To.String(), "containers", len(before))
	return nil
}

// Restore puts o's node's old containerd back after cause, and returns
// cause (with the restore's own failure, if any).
func (m Mover) Restore(ctx context.Context, o *nodeops.Ops, cause error) error {
	if err := o.RestoreRuntime(context.WithoutCancel(ctx), m.paths(o.Name)); err != nil {
		return errors.Join(cause, fmt.Errorf("node %s: putting the old containerd back: %w", o.Name, err))
	}
	m.Event(ctx, o.Name, "RuntimeRestored", fmt.Sprintf("kubelift: containerd put back: %v", cause))
	return fmt.Errorf("%w; the old containerd is back", cause)
}

// PutBack restores the containerd a move on o's node backed up (the
// caller checked that one did: nodeops.Ops.RuntimeBackedUp), and checks
// that the same containers run with the same processes after it.
func (m Mover) PutBack(ctx context.Context, o *nodeops.Ops) error {
	before, err := o.Containers(ctx)
	if err != nil {
		return err
	}
	if err := o.RestoreRuntime(ctx, m.paths(o.Name)); err != nil {
		return err
	}
	if err := m.sameContainers(ctx, o, before); err != nil {
		return err
	}
	m.Event(ctx, o.Name, "RuntimeRestored", "kubelift: containerd put back by the rollback")
	return nil
}

// PutBackAfter puts o's node's runtime and tools back after cause, for a
// node whose kubelet was just put back (the old kubelet runs on either
// containerd): its old containerd where this run moved it (moved), or a
// run this one resumes did (the plan then read the bundle's containerd on
// the node, and this upgrade's backup of the old one is there: a run
// killed after the node's runtime step); then its old CNI plugins and
// crictl where a tools move backed them up. It returns cause, joined with
// what failed on the way.
func (m Mover) PutBackAfter(ctx context.Context, o *nodeops.Ops, moved bool, cause error) error {
	err := cause
	if !moved {
		var berr error
		if moved, berr = o.RuntimeBackedUp(context.WithoutCancel(ctx)); berr != nil {
			err = errors.Join(err, fmt.Errorf("node %s: whether this upgrade moved its containerd: %w", o.Name, berr))
		}
	}
	if moved {
		err = m.Restore(ctx, o, err)
	}
	return m.PutToolsBackAfter(ctx, o, err)
}

// Undo puts back, for the cluster's rollback, what moves on o's node
// backed up: its containerd (PutBack: the same containers must run with
// the same processes after it), then, whether that worked or not, its CNI
// plugins and crictl. With would (a dry run), it says what it would put
// back instead.
func (m Mover) Undo(ctx context.Context, o *nodeops.Ops, would func(node, what string)) error {
	backed, err := o.RuntimeBackedUp(ctx)
	switch {
	case err != nil:
	case backed && would != nil:
		would(o.Name, "put back the containerd the runtime move replaced; the same containers must run with the same processes")
	case backed:
		err = m.PutBack(ctx, o)
	}
	// The tools whatever became of the runtime: they do not depend on it.
	return errors.Join(err, m.undoTools(ctx, o, would))
}

// paths are where node keeps containerd's programs, its config and
// runc, as the plan read them on the node (nodefacts' containerd
// section); what it did not read takes nodeops' defaults.
func (m Mover) paths(name string) nodeops.RuntimePaths {
	var p nodeops.RuntimePaths
	if m.View == nil || m.View.Facts[name] == nil {
		return p
	}
	c := m.View.Facts[name].Containerd
	if c.Binary != "" {
		p.ContainerdDir = path.Dir(c.Binary)
	}
	p.Config, p.RuncBinary = c.Config, c.Runc
	return p
}

// sameContainers waits, up to ReadyTimeout, for containerd on o's node
// to answer over CRI (after `systemctl restart containerd` the socket
// may not be there yet: a unit started is not a runtime serving), then
// judges its first answer: every container of before runs with the same
// process (verify.Gone), or the move restarted some. A runtime that
// never answers fails with its last read's error.
func (m Mover) sameContainers(ctx context.Context, o *nodeops.Ops, before map[string]nodeops.Container) error {
	err := m.Wait.Poll(ctx, time.Second, m.ReadyTimeout, func(ctx context.Context) error {
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
