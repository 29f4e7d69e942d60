package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubelift/kubelift/internal/waiter"
)

// NodeWatch serves every wait on Nodes from one shared informer (one LIST,
// then a WATCH), not polling.
//
// The informer runs for as long as the run's context: once that ends (a
// cancel, a lost lock) its cache no longer moves, and a wait that must
// still finish (the undo of a node in flight) reads the Node from the API
// server instead, every second.
type NodeWatch struct {
	lister  func(name string) (*corev1.Node, error)
	client  kubernetes.Interface
	stopped <-chan struct{} // closed when the informer stopped
	mu      sync.Mutex
	wake    chan struct{} // closed and replaced on every change
	stop    context.CancelFunc
	wait    waiter.Waiter
}

// WatchNodes starts a NodeWatch for as long as ctx; waits are on wt's
// clock.
func WatchNodes(ctx context.Context, c kubernetes.Interface, wt waiter.Waiter) (*NodeWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := informers.NewSharedInformerFactory(c, 0)
	inf := f.Core().V1().Nodes()
	w := &NodeWatch{wake: make(chan struct{}), stop: cancel, wait: wt, client: c, stopped: ctx.Done()}
	notify := func(any) {
		w.mu.Lock()
		close(w.wake)
		w.wake = make(chan struct{})
		w.mu.Unlock()
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: notify, UpdateFunc: func(_, n any) { notify(n) }, DeleteFunc: notify,
	}); err != nil {
		cancel()
		return nil, err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		cancel()
		return nil, fmt.Errorf("watch nodes: %w", ctx.Err())
	}
	w.lister = inf.Lister().Get
	return w, nil
}

// Until waits, at most timeout (on the watch's clock), for cond to hold
// for node name.
func (w *NodeWatch) Until(ctx context.Context, name string, timeout time.Duration, cond func(*corev1.Node) bool) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		if w.wait.Pause(ctx, timeout) == nil {
			cancel(context.DeadlineExceeded)
		}
	}()
	for {
		w.mu.Lock()
		wake := w.wake
		w.mu.Unlock()
		select {
		case <-w.stopped:
			// The cache stopped with the run: read the Node live.
			if n, err := w.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err == nil && cond(n) {
				return nil
			}
			if err := w.wait.Pause(ctx, time.Second); err != nil {
				return context.Cause(ctx)
			}
			continue
		default:
		}
		if n, err := w.lister(name); err == nil && cond(n) {
			return nil
		}
		select {
		case <-wake:
		case <-w.stopped:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// Close stops the informer.
func (w *NodeWatch) Close() { w.stop() }

// Cached is the Node named as the informer's cache has it (no request).
func (w *NodeWatch) Cached(name string) (*corev1.Node, error) { return w.lister(name) }
