package inplace

import (
	"context"
	"encoding/json"
	"time"

	"github.com/kubelift/kubelift/internal/inplace/record"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fail records the error in the state, if there is one.
func (r *upgradeRun) fail(ctx context.Context, err error) {
	if r.state == nil {
		return
	}
	r.mu.Lock()
	r.state.State, r.state.LastError = record.StateFailed, err.Error()
	r.mu.Unlock()
	fctx, cancel := finishing(ctx)
	defer cancel()
	if serr := r.save(fctx); serr != nil {
		r.log.Error("cannot record the failure in the state", "err", serr, "failure", err)
	}
}

// finishTimeout bounds a write that must finish after its run's context
// ended: when the API server is what failed, it does not hold the exit.
const finishTimeout = 30 * time.Second

// finishing is the context for such a write: not cancelled with ctx,
// bounded by finishTimeout.
func finishing(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
}

// save writes the state now (a dry run keeps it in memory).
func (r *upgradeRun) save(ctx context.Context) error {
	if r.dry {
		return nil
	}
	r.writerOnce.Do(func() { r.writer = &record.Writer{Client: r.client, Holder: r.opts.Holder, Fence: r.fence} })
	return r.writer.Write(ctx, func() ([]byte, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.state.Updated = r.opts.Plan.Now().UTC()
		return json.Marshal(r.state)
	})
}

// stateFlushInterval bounds how often per-node progress is written.
const stateFlushInterval = time.Second

// saveSoon asks flushLoop to write the state; requests that come while a
// write is pending or within stateFlushInterval of the last are folded
// into one, so a hundred nodes in flight cost one write a second, not a
// hundred. Without a flushLoop the next save carries the change.
func (r *upgradeRun) saveSoon() {
	select {
	case r.dirty <- struct{}{}:
	default:
	}
}

// flushLoop writes the state when saveSoon asks, at most once per
// stateFlushInterval, until ctx ends.
func (r *upgradeRun) flushLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.dirty:
		}
		// A write once begun is finished: stopping waits for it.
		fctx, cancel := finishing(ctx)
		err := r.save(fctx)
		cancel()
		if err != nil {
			r.log.Warn("cannot record the state", "err", err)
		}
		if r.wait.Pause(ctx, stateFlushInterval) != nil {
			return
		}
	}
}

// startFlushing starts flushLoop; the function it returns stops it, waits
// for it, and writes what it left pending, so that nothing is written
// once the run lets go of the lock and nothing touches the state the
// caller then reads.
func (r *upgradeRun) startFlushing(ctx context.Context) (stop func()) {
	r.dirty = make(chan struct{}, 1)
	loopCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.flushLoop(loopCtx)
	}()
	return func() {
		cancel()
		<-done
		select {
		case <-r.dirty:
			fctx, cancel := finishing(ctx)
			defer cancel()
			if err := r.save(fctx); err != nil {
				r.log.Warn("cannot record the state", "err", err)
			}
		default:
		}
	}
}

func (r *upgradeRun) setState(ctx context.Context, s string) error {
	r.mu.Lock()
	r.state.State = s
	r.mu.Unlock()
	return r.save(ctx)
}

func (r *upgradeRun) setNode(ctx context.Context, name, status, step string, err error) {
	r.mu.Lock()
	e := r.state.Node(name, r.tgts[name].Role)
	e.Status, e.Step, e.Updated = status, step, r.opts.Plan.Now().UTC()
	e.LastError = ""
	if err != nil {
		e.LastError = err.Error()
	}
	r.mu.Unlock()
	if r.dirty == nil {
		if serr := r.save(ctx); serr != nil {
			r.log.Warn("cannot record the state", "err", serr)
		}
		return
	}
	r.saveSoon()
}

// event records a Kubernetes Event on a Node (best effort): through the
// run's event queue when it has one, so no node waits on it.
func (r *upgradeRun) event(ctx context.Context, node, reason, msg string) {
	if r.dry {
		return
	}
	ev := record.NodeEvent(node, reason, msg, r.opts.Plan.Now())
	if r.events != nil {
		r.events.Post(ev)
		return
	}
	if _, err := r.client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		r.log.Warn("cannot record an event", "node", node, "err", err)
	}
}
