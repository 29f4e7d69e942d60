package runbook

import (
	"context"
	"fmt"
	"time"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
)

// onNode dials a node and runs fn with its operations, from the version
// its kubelet ran before this upgrade.
func (r *upgradeRun) onNode(ctx context.Context, name string, fn func(context.Context, *nodeops.Ops) error) error {
	return r.onNodeFrom(ctx, name, r.onNodeFromVersion(name), fn)
}

// fence is asked before every node step and record write: nil while the
// run holds the upgrade lock. A run whose renewals fail past the renew
// deadline (its API server unreachable) waits up to the lock's duration
// for one to succeed, then stops: another run may have taken the lock
// over by then (docs/runbook.md, "The lock").
func (r *upgradeRun) fence(ctx context.Context) error {
	if r.lock == nil {
		return nil
	}
	return r.lock.Fence(ctx, r.opts.LockDuration)
}

// lostForGood says why the run lost the lock for good (another run holds
// it now), nil otherwise: an undo then leaves the node to that run (it
// finishes a node from its in-flight record) instead of writing over
// what it may be doing.
func (r *upgradeRun) lostForGood() error {
	if r.lock == nil {
		return nil
	}
	return r.lock.Lost()
}

// onNodeFromVersion is the version node upgrades from: its kubelet's
// before this upgrade.
func (r *upgradeRun) onNodeFromVersion(name string) string {
	return r.plan.NodeFrom(r.nodeState(name), r.view.Facts[name], r.target.Version.String())
}

// onNodeFrom is onNode with the old version given.
func (r *upgradeRun) onNodeFrom(ctx context.Context, name, from string, fn func(context.Context, *nodeops.Ops) error) error {
	return r.onNodeTo(ctx, name, from, r.target.Version.String(), fn)
}

// onNodeTo is onNode moving from one given version to another (a hop).
func (r *upgradeRun) onNodeTo(ctx context.Context, name, from, to string, fn func(context.Context, *nodeops.Ops) error) error {
	if _, err := catalog.ParseReported(from); err != nil {
		return fmt.Errorf("node %s: the version it upgrades from: %w", name, err)
	}
	if err := r.fence(ctx); err != nil {
		return fmt.Errorf("node %s: not started: %w", name, err)
	}
	t := r.tgts[name]
	n, err := r.opts.Plan.Connector.Dial(ctx, t)
	if err != nil {
		return err
	}
	defer n.Close()
	// The plan read the node's units, programs and flags; they do not
	// change while it is upgraded (only what runs does, read live).
	f := r.view.Facts[name]
	if f == nil {
		return fmt.Errorf("node %s: not read by the plan", name)
	}
	o := &nodeops.Ops{Node: n, Name: name, StageDir: r.opts.Plan.StageDir, BackupDir: r.opts.BackupDir, From: from, To: to, Facts: f}
	if r.dry {
		o.Dry = func(node, command string) { r.would(node, "", command) }
	}
	o.Restarted = func(unit string, d time.Duration) {
		r.mu.Lock()
		r.res.Waiting += d.Seconds()
		r.res.Restarts = append(r.res.Restarts, UnitRestart{Node: name, Unit: unit, Seconds: d.Seconds()})
		r.mu.Unlock()
	}
	return fn(ctx, o)
}

func (r *upgradeRun) nodeState(name string) *preflight.NodeState {
	r.indexOnce.Do(func() {
		r.stateIdx = make(map[string]int, len(r.plan.Nodes))
		for i := range r.plan.Nodes {
			r.stateIdx[r.plan.Nodes[i].Name] = i
		}
	})
	if i, ok := r.stateIdx[name]; ok {
		return &r.plan.Nodes[i]
	}
	return nil
}
