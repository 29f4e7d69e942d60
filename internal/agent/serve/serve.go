// Package serve is the node agent's loop (upgrade agent): it watches the
// step requests for its node, has the host run each (hoststep), and
// writes each result into its request. A request is acted on as soon as
// its watch event arrives, a running step looked at again soon after
// (10 ms, doubling to Tick) so that a short step's answer is written
// within milliseconds of its end; and every request is walked again
// every SweepEvery, so that a missed event costs that long, never the
// request. A request's directory on the host is kept until the request
// is deleted (the run deletes its requests at its end) and its step
// ended, so that a request seen again before its result reached the
// cache is answered, not run again; a request deleted is never started.
package serve

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/kubelift/kubelift/internal/agent"
)

// Host runs the steps on the node (*hoststep.Host). Run and Sweep come
// from one goroutine; Forget from the watch's, at any time.
type Host interface {
	// Run starts the request unless it began, and returns its result
	// once there is one (nil while it runs).
	Run(ctx context.Context, r agent.Request) (*agent.Result, error)
	// Forget marks a request deleted: never started again.
	Forget(name string)
	// Sweep removes what the host keeps of requests forgotten, or not
	// kept, once their steps ended.
	Sweep(ctx context.Context, keep func(name string) bool) error
}

// Agent serves one node's requests.
type Agent struct {
	Client kubernetes.Interface
	Node   string
	Host   Host
	// Tick is the longest a running step goes unlooked at (250 ms when
	// 0; it is looked at 10 ms after it starts, then twice as long each
	// time); SweepEvery how often every request is walked again and the
	// host's steps of deleted requests removed (5 s when 0).
	Tick, SweepEvery time.Duration
	Log              *slog.Logger
}

// sweepKey is the queue's item for a walk and sweep: no request's name.
const sweepKey = ""

// firstLook is how soon a step started is looked at again.
const firstLook = 10 * time.Millisecond

// Serve serves until ctx is done.
func (a *Agent) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tick, sweepEvery := a.Tick, a.SweepEvery
	if tick <= 0 {
		tick = 250 * time.Millisecond
	}
	if sweepEvery <= 0 {
		sweepEvery = 5 * time.Second
	}
	q := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](min(firstLook, tick), tick),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "requests"})
	defer q.ShutDown()

	sel := labels.SelectorFromSet(labels.Set{agent.LabelNode: agent.NodeLabel(a.Node)}).String()
	f := informers.NewSharedInformerFactoryWithOptions(a.Client, 0, informers.WithNamespace(agent.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	inf := f.Core().V1().Secrets()
	enqueue := func(obj any) {
		if s, ok := obj.(*corev1.Secret); ok {
			q.Add(s.Name)
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if s, ok := obj.(*corev1.Secret); ok {
				a.Host.Forget(s.Name)
			}
		},
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	// The watch stops with ctx: cancelled first, whatever ends Serve.
	defer func() { cancel(); f.Shutdown() }()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return fmt.Errorf("node %s: watching its requests in %s: %w", a.Node, agent.Namespace, ctx.Err())
	}
	a.Log.Info("serving", "node", a.Node, "namespace", agent.Namespace, "selector", sel)
	go func() {
		t := time.NewTicker(sweepEvery)
		defer t.Stop()
		for {
			q.Add(sweepKey)
			select {
			case <-ctx.Done():
				q.ShutDown()
				return
			case <-t.C:
			}
		}
	}()
	lister := inf.Lister().Secrets(agent.Namespace)
	for {
		name, shutdown := q.Get()
		if shutdown || ctx.Err() != nil {
			return nil // what is queued is served by the next agent
		}
		err := a.process(ctx, q, lister, name)
		q.Done(name)
		if err != nil {
			return err
		}
	}
}

// process moves request name on, or walks every request and sweeps the
// host (sweepKey).
func (a *Agent) process(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], lister listerscorev1.SecretNamespaceLister, name string) error {
	if name == sweepKey {
		secrets, err := lister.List(labels.Everything())
		if err != nil {
			return err
		}
		for _, s := range secrets {
			q.Add(s.Name)
		}
		// The steps of requests deleted (while this agent ran, or before
		// it started) leave the host once they ended.
		if err := a.Host.Sweep(ctx, func(name string) bool { _, err := lister.Get(name); return err == nil }); err != nil {
			a.Log.Warn("removing ended steps of deleted requests", "err", err)
		}
		return nil
	}
	s, err := lister.Get(name)
	if err != nil || !a.serve(ctx, s) {
		q.Forget(name) // deleted, or nothing more to do until it changes
		return nil
	}
	q.AddRateLimited(name)
	return nil
}

// serve moves one request on: nothing where it has a result, else the
// host's Run, and the result written where there is one. It says whether
// the request is to be looked at again (its step runs, or its result
// was not written).
func (a *Agent) serve(ctx context.Context, s *corev1.Secret) (again bool) {
	if s.DeletionTimestamp != nil || s.Type != agent.SecretType {
		return false // not a request: not this agent's to answer
	}
	if res, err := agent.ParseResult(s); res != nil || err != nil {
		return false // answered (a result that does not parse is the run's to refuse)
	}
	r, err := agent.ParseRequest(s)
	var res *agent.Result
	switch {
	case err != nil:
		a.Log.Warn("refused a request", "request", s.Name, "err", err)
		res = &agent.Result{Exit: 1, Failed: err.Error()}
	case r.Node != a.Node:
		res = &agent.Result{Exit: 1, Failed: fmt.Sprintf("request for node %s reached the agent of node %s", r.Node, a.Node)}
	default:
		if res, err = a.Host.Run(ctx, r); err != nil {
			a.Log.Warn("running a step", "request", s.Name, "err", err)
			return true
		}
	}
	if res == nil {
		return true // it runs
	}
	done, err := agent.WithResult(s, *res)
	if err != nil {
		done, _ = agent.WithResult(s, agent.Result{Exit: 1, Unit: res.Unit, Failed: err.Error()})
	}
	if _, err := a.Client.CoreV1().Secrets(s.Namespace).Update(ctx, done, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return false
		}
		if !apierrors.IsConflict(err) {
			a.Log.Warn("writing a result", "request", s.Name, "err", err)
		}
		return true // read again: the host answers from the step's directory
	}
	a.Log.Info("step done", "request", s.Name, "script", r.Script.Name, "exit", res.Exit, "failed", res.Failed)
	return false
}
