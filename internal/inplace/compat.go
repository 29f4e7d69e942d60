package inplace

import (
	"context"

	"github.com/kubelift/kubelift/internal/inplace/compat"
)

// Cleanup removes the hash-skip file where no running container needs it
// any more (compat.Cleanup).
func Cleanup(ctx context.Context, opts compat.CleanupOptions) ([]compat.NodeCleanup, error) {
	return compat.Cleanup(ctx, opts)
}
