package runbook

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubelift/kubelift/internal/inplace/drain"
)

// nodes is the run's drainer, built on first use.
func (r *upgradeRun) nodes() *drain.Drainer {
	r.drainerOnce.Do(func() {
		r.drainer = &drain.Drainer{Client: r.client, Log: r.log, Timeout: r.opts.DrainTimeout, Event: r.event, Lost: r.lostForGood, Dry: r.dry,
			// A node this run did not cordon is judged by the run's Node
			// informer while it runs (a cordon by an earlier run was seen
			// there long before), at no request.
			Cached: func(name string) (*corev1.Node, error) {
				if r.watch == nil {
					return nil, errNoWatch
				}
				return r.watch.Cached(name)
			}}
	})
	return r.drainer
}

// drain cordons the node and evicts its pods (drain.Drainer.Drain).
func (r *upgradeRun) drain(ctx context.Context, name string) error { return r.nodes().Drain(ctx, name) }

// uncordon undoes a cordon of kubelift's, none other.
func (r *upgradeRun) uncordon(ctx context.Context, name string) error {
	return r.nodes().Uncordon(ctx, name)
}

// errNoWatch: the run watches no Nodes (yet): read the API.
var errNoWatch = errors.New("no node informer")
