package access

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/waiter"
)

// answers watches the run's requests (one watch for the whole run, not a
// read per step and poll: a window of 100 nodes in flight would otherwise
// spend a client's whole request budget asking), so that a step's answer
// is read from the cache the watch keeps; and the agents' pods, so that
// a node whose agent runs is reached without reading its pod.
type answers struct {
	stop   chan struct{}
	lister listerscorev1.SecretNamespaceLister
	synced cache.InformerSynced
	pods   listerscorev1.PodNamespaceLister
	podsOK cache.InformerSynced
}

// notSynced is a watch that never synced: every answer is read from the API.
func notSynced() *answers {
	never := func() bool { return false }
	return &answers{stop: make(chan struct{}), synced: never, podsOK: never}
}

// watch is the run's watch, started on the first call. After stopWatch
// there is none: answers are read from the API (every recheck).
func (c *Connector) watch() *answers {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.answers == nil {
		a := notSynced()
		c.answers = a
		if c.watchStopped {
			return a
		}
		f := c.labelled(labels.Set{agent.LabelRun: c.Run})
		inf := f.Core().V1().Secrets()
		a.lister, a.synced = inf.Lister().Secrets(agent.Namespace), inf.Informer().HasSynced
		f.Start(a.stop)
		// Every agent's pod, this run's or not (one of another run's
		// image is refused by name).
		pf := c.labelled(labels.Set{LabelApp: appName})
		pinf := pf.Core().V1().Pods()
		a.pods, a.podsOK = pinf.Lister().Pods(agent.Namespace), pinf.Informer().HasSynced
		pf.Start(a.stop)
	}
	return c.answers
}

// labelled is a watch of agent mode's namespace, of what bears set.
func (c *Connector) labelled(set labels.Set) informers.SharedInformerFactory {
	sel := labels.SelectorFromSet(set).String()
	return informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithNamespace(agent.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
}

// stopWatch ends the run's watch, if it began; none starts after.
func (c *Connector) stopWatch() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.watchStopped {
		c.watchStopped = true
		if c.answers != nil {
			close(c.answers.stop)
		}
		c.answers = notSynced()
	}
}

// runningAgent is the agent pod name as the watch last saw it, where it
// runs image and its container runs: nil where the watch does not say so
// (the caller then reads the pod from the API).
func (a *answers) runningAgent(name, image string) *corev1.Pod {
	if !a.podsOK() {
		return nil
	}
	p, err := a.pods.Get(name)
	if err != nil || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning ||
		len(p.Spec.Containers) != 1 || p.Spec.Containers[0].Image != image || !containerRuns(p) {
		return nil
	}
	return p
}

// recheck is how often a step not answered in the watch's cache is read
// from the API itself: the watch may lag, or have missed the request's
// creation.
const recheck = 10 * time.Second

// waiting is one step's wait for its answer.
type waiting struct {
	name string
	// seen: the watch's cache held the request; read: when it was last
	// read from the API itself.
	seen bool
	read time.Time
}

// answer is the step's answer: from the watch's cache, or, every
// recheck, from the API (nil, nil: none yet). A request gone (from the
// cache after it was there, or from the API) and an answer that does not
// parse end the wait (waiter.Stop); an API error does not.
func (c *Connector) answer(ctx context.Context, w *waiting) (*agent.Result, error) {
	a := c.watch()
	if a.synced() {
		s, err := a.lister.Get(w.name)
		switch {
		case err == nil:
			w.seen = true
			return parsed(s)
		case w.seen:
			return nil, waiter.Stop(errGone)
		}
	}
	if c.Wait.Since(w.read) < recheck {
		return nil, nil
	}
	w.read = c.Wait.Now()
	s, err := c.Client.CoreV1().Secrets(agent.Namespace).Get(ctx, w.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, waiter.Stop(errGone)
	}
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s: %w", agent.Namespace, w.name, err)
	}
	return parsed(s)
}

// parsed is s's answer, nil while there is none.
func parsed(s *corev1.Secret) (*agent.Result, error) {
	res, err := agent.ParseResult(s)
	if err != nil {
		return nil, waiter.Stop(err)
	}
	return res, nil
}

// errGone: a request deleted before its answer.
var errGone = errors.New("the request was deleted before its answer")
