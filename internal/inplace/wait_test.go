package inplace

import (
	"context"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
	"github.com/kubelift/kubelift/internal/waiter"
)

// A component that never comes up at the target is given up after
// --ready-timeout of the run's clock, read once a second, with the last
// reason: five minutes of waiting take no real five minutes.
func TestComponentWaitIsOnTheRunsClock(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	clk := steppingClock(t, time.Second)
	// A node whose component never moves: every read of what runs says
	// v1.30.14.
	node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
		nodescript.Running.Name: func([]string) (string, error) { return "Kubernetes v1.30.14\npid 4242\n", nil },
	}}
	r := &applyRun{opts: ApplyOptions{ReadyTimeout: 5 * time.Minute}, res: &ApplyResult{}, wait: waiter.Waiter{Clock: clk}}
	o := &nodeops.Ops{Node: node, Name: "cp-1", Facts: &nodefacts.Facts{}}

	err := r.waitComponent(ctx, o, "kube-scheduler", "v1.31.4")
	if err == nil {
		t.Fatal("a component that never moves was taken for healthy")
	}
	for _, want := range []string{"node cp-1", "kube-scheduler not healthy at v1.31.4 within 5m0s", `runs "v1.30.14", want v1.31.4`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if got := clk.Since(start); got != 5*time.Minute {
		t.Errorf("waited %s of the run's clock, want the 5m timeout", got)
	}
	if got := node.Count(nodescript.Running.Name); got != 301 {
		t.Errorf("read what runs %d times, want 301 (at once, then every second for 5m)", got)
	}
	if r.res.Waiting != (5 * time.Minute).Seconds() {
		t.Errorf("Waiting = %vs, want 300 (the run's clock)", r.res.Waiting)
	}
}

// steppingClock is a fake clock, at 2026-11-25 00:00 UTC, that moves on
// by step whenever something waits on it (until the test ends): time
// passes only while the run waits.
func steppingClock(t *testing.T, step time.Duration) *clocktesting.FakeClock {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		for ctx.Err() == nil {
			if clk.HasWaiters() {
				clk.Step(step)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	return clk
}
