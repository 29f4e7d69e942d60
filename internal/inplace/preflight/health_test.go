package preflight

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A probe keeps trying, with its backoff capped, for the whole window: a
// leader that takes over after many failed probes (a lease expiring while
// its component restarts) passes. (wait.Backoff stopped at its cap, after
// 7.5 s of a 30 s window.)
func TestProbeUsesTheWholeWindow(t *testing.T) {
	pc := &planCheck{opts: PlanOptions{HealthWindow: 10 * time.Second, HealthBackoff: time.Millisecond, HealthBackoffCap: 4 * time.Millisecond}}
	calls := 0
	err := pc.probe(context.Background(), func(context.Context) error {
		calls++
		if calls < 30 {
			return errors.New("no live lease")
		}
		return nil
	})
	if err != nil || calls != 30 {
		t.Fatalf("probe: %v after %d probes, want success at the 30th", err, calls)
	}
	// One that never passes says how long and how often it failed.
	pc.opts.HealthWindow = 50 * time.Millisecond
	err = pc.probe(context.Background(), func(context.Context) error { return errors.New("no live lease") })
	if err == nil || !strings.Contains(err.Error(), "no live lease (failing for") || !strings.Contains(err.Error(), "probes)") {
		t.Fatalf("probe: %v", err)
	}
}
