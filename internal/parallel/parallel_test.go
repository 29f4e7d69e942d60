package parallel

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

func TestForEachBoundsAndStops(t *testing.T) {
	var running, peak, calls atomic.Int32
	err := ForEach(context.Background(), 3, 50, func(ctx context.Context, i int) error {
		calls.Add(1)
		r := running.Add(1)
		for {
			p := peak.Load()
			if r <= p || peak.CompareAndSwap(p, r) {
				break
			}
		}
		defer running.Add(-1)
		return nil
	})
	if err != nil || calls.Load() != 50 || peak.Load() > 3 {
		t.Fatalf("err=%v calls=%d peak=%d", err, calls.Load(), peak.Load())
	}

	boom := errors.New("boom")
	calls.Store(0)
	err = ForEach(context.Background(), 1, 50, func(ctx context.Context, i int) error {
		calls.Add(1)
		if i == 4 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || calls.Load() > 6 {
		t.Fatalf("err=%v calls=%d", err, calls.Load())
	}
}

func TestForEachCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ForEach(ctx, 2, 10, func(context.Context, int) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}
