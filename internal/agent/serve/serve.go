// Package serve is the node agent's loop (upgrade agent): it watches the
// step requests for its node, has the host run each (hoststep), and
// writes each result into its request. Its decisions come from the
// current state of its cache of the requests, walked on a tick, not from
// events alone: a missed event is a tick late, never lost. A request's
// directory on the host is kept until the request is deleted (the run
// deletes its requests at its end), so that a request seen again before
// its result reached the cache is answered, not run again.
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
	// Forget removes what the host keeps of a request.
	Forget(name string) error
}

// Agent serves one node's requests.
type Agent struct {
	Client kubernetes.Interface
	Node   string
	Host   Host
	// Tick is how often the pending requests are looked at (250 ms
	// when 0).
	Tick time.Duration
	Log  *slog.Logger
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
				if err := a.Host.Forget(s.Name); err != nil {
					a.Log.Warn("forgetting a deleted request", "request", s.Name, "err", err)
				}
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
	for {
		secrets, err := inf.Lister().Secrets(agent.Namespace).List(labels.Everything())
		if err != nil {
			return err
		}
		for _, s := range secrets {
			a.serve(ctx, s)
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
	if s.DeletionTimestamp != nil {
		return
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
