package driver_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/driver/drivertest"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
	"github.com/kubelift/kubelift/internal/waiter"
)

// A part that never comes up at the target is given up after
// --ready-timeout of the run's clock, read once a second, with the last
// reason: five minutes of waiting take no real five minutes.
func TestPartWaitIsOnTheRunsClock(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	clk := drivertest.SteppingClock(t, time.Second)
	// A node whose part never moves: every read of what runs says
	// v1.30.14.
	node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
		nodescript.Running.Name: func([]string) (string, error) { return "Kubernetes v1.30.14\npid 4242\n", nil },
	}}
	fx := &drivertest.Effects{Wait: waiter.Waiter{Clock: clk}}
	r := &driver.Run{ReadyTimeout: 5 * time.Minute, Wait: waiter.Waiter{Clock: clk}, Log: slog.New(slog.DiscardHandler), Fx: fx}
	o := &nodeops.Ops{Node: node, Name: "cp-1", Facts: &nodefacts.Facts{}}

	err := driver.WaitPart(ctx, r, o, "kube-scheduler", "v1.31.4")
	if err == nil {
		t.Fatal("a part that never moves was taken for healthy")
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
	if fx.Waiting != 5*time.Minute {
		t.Errorf("Waiting = %s, want 5m (the run's clock)", fx.Waiting)
	}
}

// A node the hook held back before it began stays pending; one put back
// is rolled back; any other failure is failed.
func TestFailedStatus(t *testing.T) {
	for err, want := range map[error]string{
		fmt.Errorf("node worker-1: pre-hook: %w: paused", driver.ErrNotStarted): record.NodePending,
		fmt.Errorf("node worker-1: %w", driver.ErrNodeFailed):                   record.NodeRolledBack,
		errors.New("node worker-1: swap: exit status 1"):                        record.NodeFailed,
	} {
		if got := driver.FailedStatus(err); got != want {
			t.Errorf("%v: %s, want %s", err, got, want)
		}
	}
}
