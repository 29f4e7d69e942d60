package inplace

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/versions"
)

// VersionState is one version of the catalog or the cluster's records,
// with its state (versions.State).
type VersionState = versions.State

// Version states, computed from what the nodes run.
const (
	StateActive      = versions.StateActive
	StatePartial     = versions.StatePartial
	StateAvailable   = versions.StateAvailable
	StateImported    = versions.StateImported
	StateUnavailable = versions.StateUnavailable
)

// Versions lists the catalog's versions and the cluster's imported ones,
// each with its state (versions.List).
func Versions(ctx context.Context, c kubernetes.Interface, cat *catalog.Catalog) ([]VersionState, error) {
	return versions.List(ctx, c, cat)
}
