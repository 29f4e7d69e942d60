package record

import (
	"context"
	"log/slog"
	"time"

	"github.com/kubelift/kubelift/internal/waiter"
)

// FinishTimeout bounds a write that must finish after its run's context
// ended: when the API server is what failed, it does not hold the exit.
const FinishTimeout = 30 * time.Second

// Finishing is the context for such a write: not cancelled with ctx,
// bounded by FinishTimeout.
func Finishing(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), FinishTimeout)
}

// FlushInterval bounds how often a Flusher writes.
const FlushInterval = time.Second

// Flusher folds the requests to write the record that come while a
// write is pending, or within FlushInterval of the last, into one: a
// hundred nodes in flight cost one write a second, not a hundred.
type Flusher struct {
	// Save writes the record now.
	Save func(context.Context) error
	Log  *slog.Logger
	Wait waiter.Waiter
	// dirty asks the loop for a write.
	dirty chan struct{}
}

// Soon asks for a write, and says false when the Flusher does not run
// (the caller writes at once, or the next write carries the change).
func (f *Flusher) Soon() bool {
	if f == nil || f.dirty == nil {
		return false
	}
	select {
	case f.dirty <- struct{}{}:
	default:
	}
	return true
}

// Start runs the loop; the function it returns stops it, waits for it,
// and writes what it left pending, so that nothing is written once the
// run lets go of the lock and nothing touches the record the caller then
// reads.
func (f *Flusher) Start(ctx context.Context) (stop func()) {
	f.dirty = make(chan struct{}, 1)
	loopCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.loop(loopCtx)
	}()
	return func() {
		cancel()
		<-done
		select {
		case <-f.dirty:
			fctx, cancel := Finishing(ctx)
			defer cancel()
			if err := f.Save(fctx); err != nil {
				f.Log.Warn("cannot record the state", "err", err)
			}
		default:
		}
	}
}

// loop writes when Soon asks, at most once per FlushInterval, until ctx
// ends.
func (f *Flusher) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.dirty:
		}
		// A write once begun is finished: stopping waits for it.
		fctx, cancel := Finishing(ctx)
		err := f.Save(fctx)
		cancel()
		if err != nil {
			f.Log.Warn("cannot record the state", "err", err)
		}
		if f.Wait.Pause(ctx, FlushInterval) != nil {
			return
		}
	}
}
