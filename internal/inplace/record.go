package inplace

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/inplace/record"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fail records the error in the state, if there is one.
func (r *applyRun) fail(ctx context.Context, err error) {
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
func (r *applyRun) save(ctx context.Context) error {
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
func (r *applyRun) saveSoon() {
	select {
	case r.dirty <- struct{}{}:
	default:
	}
}

// flushLoop writes the state when saveSoon asks, at most once per
// stateFlushInterval, until ctx ends.
func (r *applyRun) flushLoop(ctx context.Context) {
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
func (r *applyRun) startFlushing(ctx context.Context) (stop func()) {
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

func (r *applyRun) setState(ctx context.Context, s string) error {
	r.mu.Lock()
	r.state.State = s
	r.mu.Unlock()
	return r.save(ctx)
}

func (r *applyRun) setNode(ctx context.Context, name, status, step string, err error) {
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
func (r *applyRun) event(ctx context.Context, node, reason, msg string) {
	if r.dry {
		return
	}
	now := metav1.NewTime(r.opts.Plan.Now())
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: node + ".kubelift-", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}, Reason: reason, Message: msg,
		Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "kubelift"}, FirstTimestamp: now, LastTimestamp: now, Count: 1}
	if reason == "RollingBack" {
		ev.Type = corev1.EventTypeWarning
	}
	if r.events != nil {
		r.events.post(ev)
		return
	}
	if _, err := r.client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		r.log.Warn("cannot record an event", "node", node, "err", err)
	}
}

// eventQueue posts Events in the background, so that nodes in flight
// never wait on them; they go through the run's client and so its rate
// limit (--kube-qps). Best effort: when the queue is full an event is
// dropped, with a warning.
type eventQueue struct {
	client kubernetes.Interface
	log    *slog.Logger
	ch     chan *corev1.Event
	done   chan struct{}
	// giveUp ends the posting of what is left (close past its wait).
	giveUp context.CancelFunc
}

// newEventQueue starts the queue; its posts outlive ctx's cancellation
// (the events of a failure are worth recording) until close gives up.
func newEventQueue(ctx context.Context, c kubernetes.Interface, log *slog.Logger) *eventQueue {
	q := &eventQueue{client: c, log: log, ch: make(chan *corev1.Event, 4096), done: make(chan struct{})}
	postCtx, giveUp := context.WithCancel(context.WithoutCancel(ctx))
	q.giveUp = giveUp
	go q.run(postCtx)
	return q
}

func (q *eventQueue) run(ctx context.Context) {
	defer close(q.done)
	for ev := range q.ch {
		postCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := q.client.CoreV1().Events(ev.Namespace).Create(postCtx, ev, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
			q.log.Warn("cannot record an event", "node", ev.InvolvedObject.Name, "reason", ev.Reason, "err", err)
		}
		cancel()
	}
}

func (q *eventQueue) post(ev *corev1.Event) {
	select {
	case q.ch <- ev:
	default:
		q.log.Warn("event queue full: event dropped", "node", ev.InvolvedObject.Name, "reason", ev.Reason)
	}
}

// close posts what is queued, waiting at most timeout; what is left
// then is given up, and the queue is gone when close returns.
func (q *eventQueue) close(timeout time.Duration) {
	close(q.ch)
	select {
	case <-q.done:
	case <-time.After(timeout):
		q.log.Warn("events still queued at exit were not recorded")
		q.giveUp()
		<-q.done
	}
	q.giveUp()
}
