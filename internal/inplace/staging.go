package inplace

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/nodeaccess"
)

// Stage puts opts.Release's files on the nodes opts names (stage.Run).
func Stage(ctx context.Context, opts stage.Options) (*stage.Result, error) {
	return stage.Run(ctx, opts)
}

// StageCluster puts opts.Release's files on every node of the cluster,
// each reached where inv says (stage.Cluster).
func StageCluster(ctx context.Context, client kubernetes.Interface, inv *nodeaccess.Inventory, opts stage.Options) (*stage.Result, error) {
	return stage.Cluster(ctx, client, inv, opts)
}
