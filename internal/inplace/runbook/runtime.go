package runbook

import (
	"context"
	"fmt"

	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/nodestack"
)

// stack moves this run's nodes' runtimes (nodestack.Mover).
func (r *upgradeRun) stack() nodestack.Mover {
	return nodestack.Mover{View: r.view, Target: r.target, Wait: r.wait, ReadyTimeout: r.opts.ReadyTimeout, Event: r.event, Log: r.log}
}

// moveRuntime moves the node's containerd (and runc) to the bundle's
// before its kubelet, where the bundle carries a newer one than the node
// runs, once the run still holds the lock (nodestack.Mover.Move): if the
// same containers do not run after it with the same processes, or the
// swap fails, the old containerd is put back, and the old CNI plugins and
// crictl where the tools step moved them, and the node's upgrade stops
// here, its kubelet not swapped.
func (r *upgradeRun) moveRuntime(ctx context.Context, k *kubeletRun) error {
	s := r.stack()
	m, err := s.For(k.name, k.arch)
	if err != nil {
		return s.PutToolsBackAfter(ctx, k.o, err)
	}
	if m == nil {
		return nil
	}
	// A lost lock stops the run where it is (the next apply resumes the
	// node); nothing is put back by a run that no longer holds it.
	if err := r.fence(ctx); err != nil {
		return fmt.Errorf("node %s: containerd not moved: %w", k.name, err)
	}
	if err := s.Move(ctx, k.o, m, k.before); err != nil {
		return s.PutToolsBackAfter(ctx, k.o, err)
	}
	k.runtimeMoved = true
	return nil
}

// moveTools moves the node's CNI plugins and crictl to the bundle's where
// the bundle carries the node stack and they differ, once the run still
// holds the lock (nodestack.Mover.MoveTools): if the swap fails, the old
// ones are put back and the node's upgrade stops here, nothing else
// moved.
func (r *upgradeRun) moveTools(ctx context.Context, k *kubeletRun) error {
	s := r.stack()
	tm := s.ToolsFor(k.arch)
	if tm == nil {
		return nil
	}
	if err := r.fence(ctx); err != nil {
		return fmt.Errorf("node %s: CNI plugins and crictl not moved: %w", k.name, err)
	}
	return s.MoveTools(ctx, k.o, tm)
}

// rollbackNode puts k's node back after cause: its old kubelet (which
// ran on the old containerd and on the new), then what a move of its
// runtime and tools backed up (nodestack.Mover.PutBackAfter).
func (r *upgradeRun) rollbackNode(ctx context.Context, k *kubeletRun, cause error) error {
	return r.stack().PutBackAfter(ctx, k.o, k.runtimeMoved, r.rollback(ctx, k.o, "kubelet", cause))
}

// undoRuntime puts back, for the cluster's rollback, the containerd and
// the CNI plugins and crictl that moves on node backed up, where they did
// (putBack).
func (r *upgradeRun) undoRuntime(ctx context.Context, node string) error {
	return r.onNodeFrom(ctx, node, r.plan.From[0], r.putBack)
}

// putBack restores what moves on o's node backed up (nodestack.Mover.Undo);
// a dry run says it instead.
func (r *upgradeRun) putBack(ctx context.Context, o *nodeops.Ops) error {
	var would func(node, what string)
	if r.dry {
		would = func(node, what string) { r.would(node, what, "") }
	}
	return r.stack().Undo(ctx, o, would)
}
