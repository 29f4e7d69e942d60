package inplace

import (
	"context"

	"github.com/kubelift/kubelift/internal/inplace/preflight"
)

// BuildPlan reads the cluster and says what an upgrade would do and what
// stands in its way, changing nothing (preflight.BuildPlan).
func BuildPlan(ctx context.Context, opts preflight.PlanOptions) (*preflight.Plan, error) {
	return preflight.BuildPlan(ctx, opts)
}
