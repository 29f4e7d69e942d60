package cluster

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
)

// TransientRetry is how a write that failed with a Transient error (or a
// conflict, read again) is made again: after a quarter second, doubling,
// about 30 s in all (an etcd election takes a second or two; an API
// server restarting behind a balancer, some more).
var TransientRetry = wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 8}

// etcdTransient are the messages of etcd's errors that say "try again"
// (go.etcd.io/etcd/api/v3/v3rpc/rpctypes): an API server passes them on
// as an internal error (500) with etcd's message, its only trace.
var etcdTransient = []string{
	"etcdserver: leader changed",
	"etcdserver: no leader",
	"etcdserver: request timed out",
	"etcdserver: too many requests",
}

// Transient says err is what an API server answers while it, its etcd or
// the way to it is busy or changing hands: an HA control plane's etcd
// electing a leader, an API server restarting behind a balancer, a server
// timeout, 429 or 503. The same request is worth making again a moment
// later; anything else is an answer.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	switch {
	case apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsTooManyRequests(err), apierrors.IsServiceUnavailable(err):
		return true
	case apierrors.IsInternalError(err):
		msg := err.Error()
		for _, m := range etcdTransient {
			if strings.Contains(msg, m) {
				return true
			}
		}
		return false
	case utilnet.IsConnectionReset(err), utilnet.IsConnectionRefused(err), utilnet.IsProbableEOF(err), utilnet.IsHTTP2ConnectionLost(err):
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// OnTransient makes do again, after backoff's pauses, while it fails with
// a Transient error or one also accepts (nil: none), and while ctx lasts:
// a cancelled request's error reads as a timeout, and an ending run must
// not wait out the pauses.
func OnTransient(ctx context.Context, backoff wait.Backoff, also func(error) bool, do func() error) error {
	return retry.OnError(backoff, func(err error) bool {
		return ctx.Err() == nil && (Transient(err) || also != nil && also(err))
	}, do)
}
