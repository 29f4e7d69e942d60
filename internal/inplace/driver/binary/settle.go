package binary

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/waiter"
)

// Settle: each part's unit on node runs version, and the same main
// process a health window later; a part whose process changes meanwhile
// is waited for again, for at most ReadyTimeout and two windows in all.
// A part that does not run is started once. The parts are those the node
// ran before (the plan's) and those the step moved: a unit the operator
// keeps stopped is left so.
func (d Driver) Settle(ctx context.Context, r *driver.Run, node, version string, atLeast bool, moved map[string]bool) error {
	ns := r.Node(node)
	var parts []string
	for _, c := range d.Components(ns) {
		if ns.Components[c] != "" || moved[c] {
			parts = append(parts, c)
		}
	}
	if len(parts) == 0 {
		return nil
	}
	want, err := catalog.ParseVersion(version)
	if err != nil {
		return err
	}
	good := func(v string) bool {
		if v == version {
			return true
		}
		pv, err := catalog.ParseReported(v)
		return atLeast && err == nil && pv.Compare(want) > 0
	}
	return r.OnNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error {
		deadline := r.Wait.Now().Add(r.ReadyTimeout + 2*r.HealthWindow)
		started := map[string]bool{}
		for {
			pids, err := running(ctx, r, o, parts, version, good, started)
			if err != nil {
				return err
			}
			// Every part runs (one that was down started): the leaders
			// lead again.
			if err := driver.WaitLeasesRenewed(ctx, r); err != nil {
				return fmt.Errorf("node %s: %w", node, err)
			}
			if err := r.Wait.Pause(ctx, r.HealthWindow); err != nil {
				return err
			}
			changed, err := restarted(ctx, o, parts, pids, good)
			if err != nil || len(changed) == 0 {
				return err
			}
			if r.Wait.Now().After(deadline) {
				return fmt.Errorf("node %s: %s restarted within the health window (%s), again and again for %s", node, strings.Join(changed, ", "), r.HealthWindow, r.ReadyTimeout+2*r.HealthWindow)
			}
			r.Log.Warn("restarted within the health window: waiting for a steady one", "node", node, "parts", changed, "window", r.HealthWindow)
		}
	})
}

// running waits until each part runs a good version, starting (once) a
// part that does not run, and returns each one's main process.
func running(ctx context.Context, r *driver.Run, o *nodeops.Ops, parts []string, version string, good func(string) bool, started map[string]bool) (map[string]int, error) {
	pids := map[string]int{}
	for _, comp := range parts {
		err := r.Wait.Poll(ctx, time.Second, r.ReadyTimeout, func(ctx context.Context) error {
			v, pid, err := o.Process(ctx, comp)
			switch {
			case err != nil:
				return err
			case pid == 0 && !started[comp]:
				started[comp] = true
				r.Log.Warn("does not run: starting its unit", "node", o.Name, "component", comp)
				if err := o.Start(ctx, comp); err != nil {
					return waiter.Stop(err)
				}
				return fmt.Errorf("%s does not run (its unit was started)", comp)
			case pid == 0:
				return fmt.Errorf("%s does not run", comp)
			case !good(v):
				return fmt.Errorf("%s runs %s, want %s", comp, v, version)
			}
			pids[comp] = pid
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("node %s: %s is not running %s within %s: %w", o.Name, comp, version, r.ReadyTimeout, err)
		}
	}
	return pids, nil
}

// restarted lists the parts whose process is no longer pids' (or whose
// version is no longer good).
func restarted(ctx context.Context, o *nodeops.Ops, parts []string, pids map[string]int, good func(string) bool) ([]string, error) {
	var changed []string
	for _, comp := range parts {
		v, pid, err := o.Process(ctx, comp)
		if err != nil {
			return nil, err
		}
		if pid != pids[comp] || !good(v) {
			changed = append(changed, fmt.Sprintf("%s (process %d, now %d)", comp, pids[comp], pid))
		}
	}
	return changed, nil
}
