package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// writeLimit bounds how long write tries one API write again.
const writeLimit = time.Minute

// write makes one of the sandbox's API writes, and makes it again while
// it fails on the way to the API server: client-go tries a GET again
// after a broken connection, never a write. Through a three-control-plane
// sandbox's load balancer a write's connection is closed when its API
// server is marked down (FC27: a node's Patch failed with "unexpected
// EOF" as Up labelled the nodes for the workloads, on a cold make test's
// busy machine), and an API server that kubeadm restarts refuses
// connections for a while. Every write the sandbox makes may be made
// twice: creates take AlreadyExists as done, patches are merges.
func write(ctx context.Context, what string, do func() error) error {
	deadline := time.Now().Add(writeLimit)
	for tries := 1; ; tries++ {
		err := do()
		if err == nil || !transient(err) {
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: still failing after %d tries in %s: %w", what, tries, writeLimit, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}

// transient says err is a failure on the way to the API server (the
// connection broken or refused, a timeout, an API server not ready or
// shedding load), not the server's answer to the request.
func transient(err error) bool {
	var ne net.Error
	switch {
	case utilnet.IsProbableEOF(err), utilnet.IsConnectionReset(err), utilnet.IsConnectionRefused(err), utilnet.IsHTTP2ConnectionLost(err):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		return true
	case apierrors.IsServerTimeout(err), apierrors.IsTimeout(err), apierrors.IsServiceUnavailable(err), apierrors.IsTooManyRequests(err):
		return true
	}
	return false
}

// created takes a create's AlreadyExists as done: the object is there,
// made by an earlier try whose answer was lost, or by an earlier Up.
func created(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
