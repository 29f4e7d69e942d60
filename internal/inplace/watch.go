package inplace

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubelift/kubelift/internal/waiter"
)

// nodeWatch serves every wait on Nodes from one shared informer (one LIST,
// then a WATCH), not polling.
type nodeWatch struct {
	lister func(name string) (*corev1.Node, error)
	mu     sync.Mutex
	wake   chan struct{} // closed and replaced on every change
	stop   context.CancelFunc
	wait   waiter.Waiter
}

func watchNodes(ctx context.Context, c kubernetes.Interface, wt waiter.Waiter) (*nodeWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := informers.NewSharedInformerFactory(c, 0)
	inf := f.Core().V1().Nodes()
	w := &nodeWatch{wake: make(chan struct{}), stop: cancel, wait: wt}
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

// until waits, at most timeout (on the run's clock), for cond to hold
// for node name.
func (w *nodeWatch) until(ctx context.Context, name string, timeout time.Duration, cond func(*corev1.Node) bool) error {
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
		if n, err := w.lister(name); err == nil && cond(n) {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

func (w *nodeWatch) close() { w.stop() }
