// Package serve is the node agent's loop (upgrade agent): it watches the
// step requests for its node, has the host run each (hoststep), and
// writes each result into its request. Its decisions come from the
// current state of its cache of the requests, walked on a tick, not from
// events alone: a missed event is a tick late, never lost. A request's
// directory on the host is kept until the request is deleted (the run
// deletes its requests at its end) and its step ended, so that a request
// seen again before its result reached the cache is answered, not run
// again; a request deleted is never started.
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
	"k8s.io/client-go/tools/cache"

	"github.com/kubelift/kubelift/internal/agent"
)

// Host runs the steps on the node (*hoststep.Host).
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
	// Tick is how often the pending requests are looked at (250 ms
	// when 0), SweepEvery how often the host's steps of deleted requests
	// are (5 s when 0).
	Tick, SweepEvery time.Duration
	Log              *slog.Logger
}

// Serve serves until ctx is done.
func (a *Agent) Serve(ctx context.Context) error {
	sel := labels.SelectorFromSet(labels.Set{agent.LabelNode: agent.NodeLabel(a.Node)}).String()
	f := informers.NewSharedInformerFactoryWithOptions(a.Client, 0, informers.WithNamespace(agent.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	inf := f.Core().V1().Secrets()
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
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
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return fmt.Errorf("node %s: watching its requests in %s: %w", a.Node, agent.Namespace, ctx.Err())
	}
	a.Log.Info("serving", "node", a.Node, "namespace", agent.Namespace, "selector", sel)
	tick := a.Tick
	if tick <= 0 {
		tick = 250 * time.Millisecond
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	lister := inf.Lister().Secrets(agent.Namespace)
	sweepEvery := a.SweepEvery
	if sweepEvery <= 0 {
		sweepEvery = 5 * time.Second
	}
	var swept time.Time
	for {
		secrets, err := lister.List(labels.Everything())
		if err != nil {
			return err
		}
		for _, s := range secrets {
			a.serve(ctx, s)
		}
		if time.Since(swept) > sweepEvery {
			// The steps of requests deleted (while this agent ran, or
			// before it started) leave the host once they ended.
			if err := a.Host.Sweep(ctx, func(name string) bool { _, err := lister.Get(name); return err == nil }); err != nil {
				a.Log.Warn("removing ended steps of deleted requests", "err", err)
			}
			swept = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// serve moves one request on: nothing where it has a result, else the
// host's Run, and the result written where there is one.
func (a *Agent) serve(ctx context.Context, s *corev1.Secret) {
	if s.DeletionTimestamp != nil || s.Type != agent.SecretType {
		return // not a request: not this agent's to answer
	}
	if res, err := agent.ParseResult(s); res != nil || err != nil {
		return // answered (a result that does not parse is the run's to refuse)
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
			return // the next tick tries again
		}
	}
	if res == nil {
		return
	}
	done, err := agent.WithResult(s, *res)
	if err != nil {
		done, _ = agent.WithResult(s, agent.Result{Exit: 1, Unit: res.Unit, Failed: err.Error()})
	}
	if _, err := a.Client.CoreV1().Secrets(s.Namespace).Update(ctx, done, metav1.UpdateOptions{}); err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			a.Log.Warn("writing a result", "request", s.Name, "err", err)
		}
		return // the next tick reads it again: the host answers from the step's directory
	}
	a.Log.Info("step done", "request", s.Name, "script", r.Script.Name, "exit", res.Exit, "failed", res.Failed)
}
