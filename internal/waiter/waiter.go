// Package waiter is how kubelift waits: for a condition, polled at an
// interval until a timeout, or for a pause. Every wait runs on a clock
// that tests can drive (k8s.io/utils/clock), so no unit test sleeps, and
// every wait ends when its context does.
package waiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/utils/clock"
)

// Waiter waits on Clock (the real clock when nil).
type Waiter struct {
	Clock clock.Clock
}

func (w Waiter) clock() clock.Clock {
	if w.Clock == nil {
		return clock.RealClock{}
	}
	return w.Clock
}

// Now is the clock's time.
func (w Waiter) Now() time.Time { return w.clock().Now() }

// Since is the clock's time since t.
func (w Waiter) Since(t time.Time) time.Duration { return w.clock().Since(t) }

// Pause waits d, or until ctx ends (its error then).
func (w Waiter) Pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := w.clock().NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ErrTimeout is what a Poll that ran out of time wraps (with the reason
// the condition last gave).
var ErrTimeout = errors.New("timed out")

// TimeoutError is a Poll that ran out of time: After is the timeout, Last
// the condition's last reason for not being done (nil: it never said).
type TimeoutError struct {
	After time.Duration
	Last  error
}

// Error is the condition's last reason, so that a caller's message reads
// "X not healthy within 5m: <why>".
func (e *TimeoutError) Error() string {
	if e.Last == nil {
		return fmt.Sprintf("%s after %s", ErrTimeout, e.After)
	}
	return e.Last.Error()
}

// Unwrap gives ErrTimeout and the last reason.
func (e *TimeoutError) Unwrap() []error { return []error{ErrTimeout, e.Last} }

// permanent marks an error that ends a Poll at once.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Stop makes a condition's error end the Poll at once (Poll returns err
// itself), instead of being a reason to try again.
func Stop(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// Poll calls cond at once and then every interval until it returns nil,
// returns an error made by Stop (that error is returned), ctx ends (ctx's
// error), or timeout passes (a *TimeoutError holding cond's last error).
// Any other error from cond is a reason it is not done yet.
func (w Waiter) Poll(ctx context.Context, interval, timeout time.Duration, cond func(context.Context) error) error {
	c := w.clock()
	deadline := c.Now().Add(timeout)
	var last error
	for {
		err := cond(ctx)
		if err == nil {
			return nil
		}
		var p permanent
		if errors.As(err, &p) {
			return p.err
		}
		last = err
		if ctx.Err() != nil {
			return ctx.Err()
		}
		left := deadline.Sub(c.Now())
		if left <= 0 {
			return &TimeoutError{After: timeout, Last: last}
		}
		if err := w.Pause(ctx, min(interval, left)); err != nil {
			return err
		}
	}
}
