package runbook

import (
	"context"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/inplace/verify"
	"github.com/kubelift/kubelift/internal/inplace/workloads"
)

// ErrWorkloadsUnavailable means workloads fully available before a node's
// swap were not again within --health-window after it.
var ErrWorkloadsUnavailable = workloads.ErrUnavailable

// gateSnapshot is the workloads of pods (a node's) fully available now
// (none without the gate).
func (r *upgradeRun) gateSnapshot(pods map[types.UID]verify.Pod) (map[string]int64, error) {
	if r.workloads == nil {
		return nil, nil
	}
	var owners []string
	for _, p := range pods {
		if !p.Ended() {
			owners = append(owners, p.Owner)
		}
	}
	return r.workloads.FullyAvailable(owners)
}

// gate waits, at most the health window, until every workload of before
// that still exists is fully available again.
func (r *upgradeRun) gate(ctx context.Context, node string, before map[string]int64) error {
	if r.workloads == nil || len(before) == 0 {
		return nil
	}
	defer r.timed(&r.res.Waiting)()
	return r.workloads.Again(ctx, r.wait, r.opts.Plan.HealthWindow, node, before)
}
