package record

import (
	"context"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// NodeEvent is the Kubernetes Event kubelift records on a Node: a
// Warning when a part rolls back ("RollingBack"), Normal otherwise.
func NodeEvent(node, reason, msg string, now time.Time) *corev1.Event {
	t := metav1.NewTime(now)
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: node + ".kubelift-", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}, Reason: reason, Message: msg,
		Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "kubelift"}, FirstTimestamp: t, LastTimestamp: t, Count: 1}
	if reason == "RollingBack" {
		ev.Type = corev1.EventTypeWarning
	}
	return ev
}

// Events posts Events in the background, so that nodes in flight never
// wait on them; they go through the run's client and so its rate limit
// (--kube-qps). Best effort: when the queue is full an event is dropped,
// with a warning.
type Events struct {
	client kubernetes.Interface
	log    *slog.Logger
	ch     chan *corev1.Event
	done   chan struct{}
	// giveUp ends the posting of what is left (Close past its wait).
	giveUp context.CancelFunc
}

// NewEvents starts the queue; its posts outlive ctx's cancellation (the
// events of a failure are worth recording) until Close gives up.
func NewEvents(ctx context.Context, c kubernetes.Interface, log *slog.Logger) *Events {
	q := &Events{client: c, log: log, ch: make(chan *corev1.Event, 4096), done: make(chan struct{})}
	postCtx, giveUp := context.WithCancel(context.WithoutCancel(ctx))
	q.giveUp = giveUp
	go q.run(postCtx)
	return q
}

func (q *Events) run(ctx context.Context) {
	defer close(q.done)
	for ev := range q.ch {
		postCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := q.client.CoreV1().Events(ev.Namespace).Create(postCtx, ev, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
			q.log.Warn("cannot record an event", "node", ev.InvolvedObject.Name, "reason", ev.Reason, "err", err)
		}
		cancel()
	}
}

// Post queues ev.
func (q *Events) Post(ev *corev1.Event) {
	select {
	case q.ch <- ev:
	default:
		q.log.Warn("event queue full: event dropped", "node", ev.InvolvedObject.Name, "reason", ev.Reason)
	}
}

// Send queues ev on q, or, without a queue (q nil), posts it now
// through c: best effort, a failure is a warning.
func (q *Events) Send(ctx context.Context, c kubernetes.Interface, log *slog.Logger, ev *corev1.Event) {
	if q != nil {
		q.Post(ev)
		return
	}
	if _, err := c.CoreV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		log.Warn("cannot record an event", "node", ev.InvolvedObject.Name, "reason", ev.Reason, "err", err)
	}
}

// Close posts what is queued, waiting at most timeout; what is left
// then is given up, and the queue is gone when Close returns.
func (q *Events) Close(timeout time.Duration) {
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
