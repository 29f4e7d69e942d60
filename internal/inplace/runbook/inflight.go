package runbook

import (
	"context"
	"fmt"

	"github.com/kubelift/kubelift/internal/inplace/record"
)

// markInFlight writes the record on node before its kubelet is swapped
// (record.MarkInFlight).
func (r *upgradeRun) markInFlight(ctx context.Context, node string, f *record.InFlight) error {
	if r.dry {
		r.would(node, fmt.Sprintf("annotate the node %s: the %d containers and %d pods verify compares after the swap", record.AnnotationInFlight, len(f.Containers), len(f.Pods)), "")
		return nil
	}
	return record.MarkInFlight(ctx, r.client, node, f)
}

// clearInFlight removes the record from node, even when ctx is done.
func (r *upgradeRun) clearInFlight(ctx context.Context, node string) error {
	return record.ClearInFlight(context.WithoutCancel(ctx), r.client, node)
}

// inFlightOf is the record a run left on node, as the plan read the Node
// (nil when there is none).
func (r *upgradeRun) inFlightOf(node string) (*record.InFlight, error) {
	n := r.view.Node(node)
	if n == nil {
		return nil, nil
	}
	return record.InFlightOn(n)
}
