package runbook

import (
	"context"
	"errors"

	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/record"
)

// fail records the error in the state, if there is one.
func (r *upgradeRun) fail(ctx context.Context, err error) {
	if r.state == nil {
		return
	}
	r.mu.Lock()
	if !errors.Is(err, driver.ErrNotStarted) { // held back before a node (a pause, a stop): nothing failed
		r.state.State, r.state.LastError = record.StateFailed, err.Error()
	}
	r.mu.Unlock()
	fctx, cancel := record.Finishing(ctx)
	defer cancel()
	if serr := r.save(fctx); serr != nil {
		r.log.Error("cannot record the failure in the state", "err", serr, "failure", err)
	}
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
		return record.Marshal(r.state)
	})
}

// startFlushing starts writing the state in the background, at most
// once a second (record.Flusher); the function it returns stops that
// and writes what is left.
func (r *upgradeRun) startFlushing(ctx context.Context) (stop func()) {
	r.flush = &record.Flusher{Save: r.save, Log: r.log, Wait: r.wait}
	return r.flush.Start(ctx)
}

func (r *upgradeRun) setState(ctx context.Context, s string) error {
	r.mu.Lock()
	r.state.State = s
	r.mu.Unlock()
	return r.save(ctx)
}

func (r *upgradeRun) setNode(ctx context.Context, name, status, step string, err error) {
	r.mu.Lock()
	r.state.SetNode(name, r.tgts[name].Role, status, step, err, r.opts.Plan.Now().UTC())
	r.mu.Unlock()
	if r.flush.Soon() {
		return
	}
	if serr := r.save(ctx); serr != nil {
		r.log.Warn("cannot record the state", "err", serr)
	}
}

// span records that node entered step, in the record's timeline (written
// with the next write).
func (r *upgradeRun) span(name, step string) {
	r.mu.Lock()
	r.state.Begin(name, r.tgts[name].Role, step, r.opts.Plan.Now().UTC())
	r.mu.Unlock()
	r.flush.Soon()
}

// event records a Kubernetes Event on a Node (best effort): through the
// run's event queue when it has one, so no node waits on it.
func (r *upgradeRun) event(ctx context.Context, node, reason, msg string) {
	if !r.dry {
		r.events.Send(ctx, r.client, r.log, record.NodeEvent(node, reason, msg, r.opts.Plan.Now()))
	}
}
