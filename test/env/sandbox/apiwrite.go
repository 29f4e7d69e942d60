package sandbox

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubelift/kubelift/internal/cluster"
)

// writeTries bounds how often write makes one API write: a second apart,
// about a minute in all.
var writeTries = wait.Backoff{Duration: time.Second, Factor: 1, Steps: 60}

// write makes one of the sandbox's API writes, and makes it again while
// it fails on the way to the API server (cluster.OnTransient, as the
// engine's record writer does): client-go tries a GET again
// after a broken connection, never a write. Through a three-control-plane
// sandbox's load balancer a write's connection is closed when its API
// server is marked down (FC27: a node's Patch failed with "unexpected
// EOF" as Up labelled the nodes for the workloads, on a cold make test's
// busy machine), and an API server that kubeadm restarts refuses
// connections for a while. Every write the sandbox makes may be made
// twice: creates take AlreadyExists as done, patches are merges. Each
// try runs under ctx, so one cut off by ctx ends it.
func write(ctx context.Context, what string, do func() error) error {
	err := cluster.OnTransient(ctx, writeTries, nil, do)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w (last: %v)", what, ctx.Err(), err)
	case cluster.Transient(err):
		return fmt.Errorf("%s: still failing after %d tries a second apart: %w", what, writeTries.Steps, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// created takes a create's AlreadyExists as done: the object is there,
// made by an earlier try whose answer was lost, or by an earlier Up.
func created(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
