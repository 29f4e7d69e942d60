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
// is read from the cache the watch keeps.
type answers struct {
	stop   chan struct{}
	lister listerscorev1.SecretNamespaceLister
	synced cache.InformerSynced
}

// watch is the run's watch, started on the first call. After stopWatch
// there is none: answers are read from the API (every recheck).
func (c *Connector) watch() *answers {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.answers == nil {
		a := &answers{stop: make(chan struct{}), synced: func() bool { return false }}
		c.answers = a
		if c.watchStopped {
			return a
		}
		sel := labels.SelectorFromSet(labels.Set{agent.LabelRun: c.Run}).String()
		f := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithNamespace(agent.Namespace),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
		inf := f.Core().V1().Secrets()
		a.lister, a.synced = inf.Lister().Secrets(agent.Namespace), inf.Informer().HasSynced
		f.Start(a.stop)
	}
	return c.answers
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
		c.answers = &answers{stop: make(chan struct{}), synced: func() bool { return false }}
	}
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
