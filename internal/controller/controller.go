// Package controller runs the cluster's Upgrades (internal/upgradeapi)
// from inside the cluster: one at a time, oldest first, by the runbook
// apply runs, while it leads its Lease. It decides from the objects as
// they are now, not from events it saw, so a controller that takes over
// (its pod deleted, its node restarted) resumes where the last stopped:
// the run's record says which nodes are done.
package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/upgradeapi"
	"github.com/kubelift/kubelift/internal/upgradelock"
)

// Run is one run of an Upgrade, as the controller hands it to a Runner.
type Run struct {
	Upgrade *upgradeapi.Upgrade
	// Hold is called before each node's kubelet moves; it returns when
	// the node may go (not paused, the window open), or an error that
	// stops the run before the node: the Upgrade deleted, or its spec
	// changed (the controller runs it again with the new spec).
	Hold func(ctx context.Context, node string) error
}

// Outcome is what a run says of itself beside its error.
type Outcome struct {
	From, To, Bundle string
	Findings         []upgradeapi.Finding
}

// Runner runs the runbook for an Upgrade (apply, over agents) and
// returns when it ends: done, failed, or ctx cancelled.
type Runner func(ctx context.Context, run Run) (Outcome, error)

// errRespec stops a run whose Upgrade's spec changed: it runs again
// with the new one, resuming from the record.
var errRespec = errors.New("the upgrade's spec changed: the run starts again with it")

// errDeleted stops a run whose Upgrade was deleted.
var errDeleted = errors.New("the upgrade was deleted")

// errStopping stops a run before its next node: the controller is
// stopping (its pod deleted); the next leader resumes it.
var errStopping = errors.New("the controller is stopping: the next leader goes on")

// Controller runs Upgrades.
type Controller struct {
	Upgrades upgradeapi.Client
	Kube     kubernetes.Interface
	Run      Runner
	// Identity names this controller (its pod) in status and Events.
	Identity string
	Log      *slog.Logger
	// Poll is how often it looks at the Upgrades, a paused Upgrade and
	// the run's record (default 2 s).
	Poll time.Duration
	// Now is the clock the maintenance window is read with.
	Now func() time.Time
	// Stopping, closed, stops the run before its next node (the nodes
	// in flight finish) and starts no other: a pod being deleted hands
	// the run over at a node boundary, not in the middle of a node.
	Stopping <-chan struct{}
	// LockedBackoff: another run's lock is tried again after it
	// (DefaultLockedBackoff when 0).
	LockedBackoff time.Duration

	mu      sync.Mutex    // one status write at a time
	backoff time.Duration // the next pass waits this long (another run's lock)
}

// DefaultLockedBackoff is how long an Upgrade waits for the upgrade lock
// that another run holds before it is tried again: a try starts the
// agents.
const DefaultLockedBackoff = 30 * time.Second

func (c *Controller) poll() time.Duration {
	if c.Poll <= 0 {
		return 2 * time.Second
	}
	return c.Poll
}

func (c *Controller) stopping() bool {
	select {
	case <-c.Stopping:
		return true
	default:
		return false
	}
}

func (c *Controller) now() time.Time {
	if c.Now == nil {
		return time.Now()
	}
	return c.Now()
}

// Reconcile runs Upgrades until ctx is done: each pass lists them, says
// to every Upgrade but the one it runs that it waits, and runs that one
// to its end.
func (c *Controller) Reconcile(ctx context.Context) error {
	for {
		if c.stopping() {
			return nil
		}
		active, err := c.next(ctx)
		if err != nil {
			c.Log.Warn("upgrades", "err", err)
		}
		if active != nil && c.runUpgrade(ctx, active) {
			continue // ended: the next at once
		}
		wait := max(c.poll(), c.backoff)
		c.backoff = 0
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.Stopping:
		case <-time.After(wait):
		}
	}
}

// next picks the Upgrade to run and tells the others they wait for it:
// one that was started and not finished (a controller before this one
// ran it), else the oldest that is not done.
func (c *Controller) next(ctx context.Context) (*upgradeapi.Upgrade, error) {
	us, err := c.Upgrades.List(ctx)
	if err != nil {
		return nil, err
	}
	us = slices.DeleteFunc(us, func(u *upgradeapi.Upgrade) bool { return u.DeletionTimestamp != nil }) // going: not run
	var active *upgradeapi.Upgrade
	for _, u := range us {
		if !u.Done() && (u.Status.Phase == upgradeapi.Running || u.Status.Phase == upgradeapi.Paused) {
			active = u
			break
		}
	}
	for _, u := range us {
		if active == nil && !u.Done() {
			active = u
		}
	}
	if active == nil {
		return nil, nil
	}
	return active, c.tellWaiting(ctx, us, active.Name)
}

// tellWaiting says to each Upgrade of us that is not done, but active,
// that it waits for active.
func (c *Controller) tellWaiting(ctx context.Context, us []*upgradeapi.Upgrade, active string) error {
	for _, u := range us {
		if u.Name == active || u.Done() || (u.Status.Phase == upgradeapi.Waiting && u.Status.WaitingFor == active) {
			continue
		}
		if err := c.setStatus(ctx, u.Name, func(now *upgradeapi.Upgrade) {
			s := &now.Status
			s.Phase, s.WaitingFor = upgradeapi.Waiting, active
			s.Message = "waits for upgrade " + active + ": one upgrade runs at a time"
		}); err != nil {
			return err
		}
	}
	return nil
}

// runUpgrade runs u until it ends (true), its spec changes (then the
// next pass runs it again), the upgrade lock is another run's, or ctx is
// done.
func (c *Controller) runUpgrade(ctx context.Context, u *upgradeapi.Upgrade) (ended bool) {
	if _, err := u.Spec.Check(); err != nil {
		c.finish(ctx, u, upgradeapi.Failed, &upgradeapi.FailedAction{Step: "spec", Reason: err.Error()}, nil)
		return true
	}
	err := c.setStatus(ctx, u.Name, func(now *upgradeapi.Upgrade) {
		s := &now.Status
		if s.Phase != upgradeapi.Running && s.Phase != upgradeapi.Paused {
			s.Phase, s.Message = upgradeapi.Running, ""
		}
		s.WaitingFor, s.Controller, s.ObservedGeneration, s.LastError, s.Completed = "", c.Identity, now.Generation, nil, nil
		if s.Started == nil {
			t := metav1.NewTime(c.now())
			s.Started = &t
		}
	})
	if err != nil {
		c.Log.Warn("upgrade "+u.Name, "err", err)
		return false
	}
	before := u.Status
	if u, err = c.Upgrades.Get(ctx, u.Name); err != nil || u == nil {
		return false
	}
	if before.Controller != c.Identity || (before.Phase != upgradeapi.Running && before.Phase != upgradeapi.Paused) {
		c.event(ctx, u, corev1.EventTypeNormal, "Running", fmt.Sprintf("%s runs the upgrade to %s", c.Identity, u.Spec.Version))
	}
	runCtx, cancel := context.WithCancel(ctx)
	mirrored := make(chan struct{})
	go func() {
		defer close(mirrored)
		c.mirror(runCtx, u)
	}()
	hold := func(ctx context.Context, node string) error { return c.hold(ctx, u, node) }
	// Nothing moves while it is paused or out of its window.
	var out Outcome
	err = hold(runCtx, "")
	if err == nil {
		out, err = c.Run(runCtx, Run{Upgrade: u, Hold: hold})
	}
	cancel()
	<-mirrored
	switch {
	case ctx.Err() != nil || errors.Is(err, errStopping):
		return false // stopped leading: the next leader resumes it
	case errors.Is(err, errRespec):
		c.event(ctx, u, corev1.EventTypeNormal, "SpecChanged", "the spec changed: the run starts again with it, from its record")
		return false
	case errors.Is(err, errDeleted):
		return true
	case errors.Is(err, upgradelock.ErrLocked) || errors.Is(err, upgradelock.ErrLost):
		// Another run holds the lock (an admin machine's apply, or the
		// run of a leader before this one): not this Upgrade's failure.
		// It is tried again after LockedBackoff.
		msg := "waits for the upgrade lock (kube-system/" + upgradelock.Name + ")"
		if locked := (*upgradelock.LockedError)(nil); errors.As(err, &locked) {
			msg += ", held by " + locked.Holder
		}
		if before.Message != msg {
			c.event(ctx, u, corev1.EventTypeWarning, "Locked", msg+": "+err.Error())
			if err := c.setStatus(ctx, u.Name, func(now *upgradeapi.Upgrade) { now.Status.Message = msg }); err != nil {
				c.Log.Warn("upgrade "+u.Name, "err", err)
			}
		}
		c.backoff = c.LockedBackoff
		if c.backoff <= 0 {
			c.backoff = DefaultLockedBackoff
		}
		return false
	case err != nil:
		c.Log.Warn("upgrade "+u.Name+" failed", "err", err)
		c.finish(ctx, u, upgradeapi.Failed, failedAction(c.recordOf(ctx, u), err), &out)
	default:
		c.finish(ctx, u, upgradeapi.Complete, nil, &out)
	}
	return true
}

// failedAction names what failed: the node the record says failed that
// the run's error names, its step and its error; else the run's error
// (a node an earlier attempt left failed is not this failure).
func failedAction(st *record.Status, err error) *upgradeapi.FailedAction {
	f := &upgradeapi.FailedAction{Reason: err.Error()}
	if st == nil {
		return f
	}
	for _, n := range st.Nodes {
		if (n.Status == record.NodeFailed || n.Status == record.NodeRolledBack) && names(err, n.Name) {
			f.Node, f.Step = n.Name, n.Step
			if n.LastError != "" {
				f.Reason = n.LastError
			}
			break
		}
	}
	return f
}

// names says whether err names node ("node NAME " or "node NAME:", as
// the engine's errors do).
func names(err error, node string) bool {
	msg := err.Error()
	return strings.Contains(msg, "node "+node+" ") || strings.Contains(msg, "node "+node+":")
}

// finish writes an Upgrade's end, trying again (every poll) until it is
// written or ctx is done: an end left unwritten would run it again.
func (c *Controller) finish(ctx context.Context, u *upgradeapi.Upgrade, phase string, failed *upgradeapi.FailedAction, out *Outcome) {
	st := c.recordOf(ctx, u)
	for {
		err := c.setStatus(ctx, u.Name, func(now *upgradeapi.Upgrade) {
			s := &now.Status
			t := metav1.NewTime(c.now())
			s.Phase, s.LastError, s.Completed, s.Message = phase, failed, &t, ""
			// The generation it ended at: a later one that changed only
			// paused or the window changed nothing it ran.
			s.ObservedGeneration = u.Generation
			if samePolicy(now.Spec, u.Spec) {
				s.ObservedGeneration = now.Generation
			}
			if out != nil {
				s.From, s.To, s.Bundle, s.Findings = out.From, out.To, out.Bundle, out.Findings
			}
			mirrorRecord(s, st)
			s.Current = ""
			if failed != nil {
				s.Message = failed.Reason
				s.Current = failed.Node
			}
		})
		if err == nil || ctx.Err() != nil {
			break
		}
		c.Log.Warn("upgrade "+u.Name, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(c.poll()):
		}
	}
	if failed != nil {
		where := ""
		if failed.Node != "" {
			where = fmt.Sprintf(" (node %s, step %s)", failed.Node, failed.Step)
		}
		c.event(ctx, u, corev1.EventTypeWarning, "Failed", "the upgrade failed"+where+": "+failed.Reason)
		return
	}
	c.event(ctx, u, corev1.EventTypeNormal, "Complete", "every node runs "+u.Spec.Version)
}

// samePolicy says whether two specs ask the same run: all but paused
// and the window, which only hold it.
func samePolicy(a, b upgradeapi.Spec) bool {
	a.Paused, a.Window, b.Paused, b.Window = false, nil, false, nil
	return reflect.DeepEqual(a, b)
}

// hold returns when node may go ("": the run may start): the Upgrade
// not paused and its window open; errRespec when its policy changed
// since the run started (u), and errDeleted when it is gone. While it
// holds, the Upgrade says Paused.
func (c *Controller) hold(ctx context.Context, u *upgradeapi.Upgrade, node string) error {
	where := "before node " + node
	if node == "" {
		where = "before it starts"
	}
	said := ""
	for {
		if c.stopping() {
			return errStopping
		}
		now, err := c.Upgrades.Get(ctx, u.Name)
		switch {
		case err != nil:
			c.Log.Warn("upgrade "+u.Name, "err", err) // the API may be restarting: look again
		case now == nil || now.DeletionTimestamp != nil:
			return errDeleted
		case !samePolicy(now.Spec, u.Spec):
			return errRespec
		case now.Spec.Paused || !now.Spec.Window.Open(c.now()):
			why := "spec.paused"
			if !now.Spec.Paused {
				why = "outside its window (" + now.Spec.Window.String() + ")"
			}
			if msg := "holds " + where + ": " + why; msg != said {
				c.event(ctx, now, corev1.EventTypeNormal, "Paused", msg)
				if err := c.setStatus(ctx, u.Name, func(now *upgradeapi.Upgrade) {
					now.Status.Phase, now.Status.Message = upgradeapi.Paused, msg
				}); err != nil {
					c.Log.Warn("upgrade "+u.Name, "err", err)
				} else {
					said = msg
				}
			}
		default:
			if said != "" || now.Status.Phase == upgradeapi.Paused {
				c.event(ctx, now, corev1.EventTypeNormal, "Resumed", "goes on "+where)
				if err := c.setStatus(ctx, u.Name, func(now *upgradeapi.Upgrade) {
					now.Status.Phase, now.Status.Message = upgradeapi.Running, ""
				}); err != nil {
					c.Log.Warn("upgrade "+u.Name, "err", err)
				}
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.Stopping:
		case <-time.After(c.poll()):
		}
	}
}
