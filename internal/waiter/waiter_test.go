package waiter

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// drive steps the fake clock by step whenever something waits on it,
// until ctx ends: time passes only when the code under test waits.
func drive(ctx context.Context, c *clocktesting.FakeClock, step time.Duration) {
	go func() {
		for ctx.Err() == nil {
			if c.HasWaiters() {
				c.Step(step)
			}
			time.Sleep(time.Millisecond)
		}
	}()
}

func TestPollTimesOutWithTheLastReason(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := clocktesting.NewFakeClock(time.Unix(0, 0))
	drive(ctx, c, time.Second)
	w := Waiter{Clock: c}
	var calls atomic.Int32
	err := w.Poll(ctx, time.Second, 5*time.Minute, func(context.Context) error {
		calls.Add(1)
		return errors.New("kube-apiserver runs v1.30.14, want v1.31.4")
	})
	var te *TimeoutError
	if !errors.As(err, &te) || !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want a timeout", err)
	}
	if err.Error() != "kube-apiserver runs v1.30.14, want v1.31.4" {
		t.Errorf("message = %q, want the condition's last reason", err)
	}
	// Once at 0s and once a second until 300s.
	if got := calls.Load(); got != 301 {
		t.Errorf("condition called %d times in 5 fake minutes at 1s, want 301", got)
	}
	if got := c.Since(time.Unix(0, 0)); got != 5*time.Minute {
		t.Errorf("fake time passed %s, want exactly 5m", got)
	}
}

func TestPollDoneStopAndCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := clocktesting.NewFakeClock(time.Unix(0, 0))
	drive(ctx, c, time.Second)
	w := Waiter{Clock: c}

	n := 0
	if err := w.Poll(ctx, time.Second, time.Minute, func(context.Context) error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 3 {
		t.Errorf("done on the third call: err=%v calls=%d", err, n)
	}

	refused := errors.New("evict: forbidden")
	n = 0
	err := w.Poll(ctx, time.Second, time.Minute, func(context.Context) error { n++; return Stop(refused) })
	if err != refused || n != 1 {
		t.Errorf("Stop: err=%v calls=%d, want the error itself after one call", err, n)
	}

	cctx, ccancel := context.WithCancel(ctx)
	n = 0
	err = w.Poll(cctx, time.Second, time.Hour, func(context.Context) error {
		if n++; n == 2 {
			ccancel()
		}
		return errors.New("not yet")
	})
	if !errors.Is(err, context.Canceled) || n != 2 {
		t.Errorf("cancel: err=%v calls=%d, want context.Canceled after two calls", err, n)
	}
}

func TestPause(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := clocktesting.NewFakeClock(time.Unix(0, 0))
	drive(ctx, c, 15*time.Second)
	w := Waiter{Clock: c}
	if err := w.Pause(ctx, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := w.Since(time.Unix(0, 0)); got != 15*time.Second {
		t.Errorf("paused %s of fake time, want 15s", got)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if err := (Waiter{Clock: clocktesting.NewFakeClock(time.Unix(0, 0))}).Pause(cctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Pause on a cancelled context = %v", err)
	}
}
