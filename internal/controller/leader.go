package controller

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseName is the Lease in the controller's namespace that its
// replicas elect a leader on: only the leader runs Upgrades.
const LeaseName = "kubelift-controller"

// Lease timings. An API server restart of the upgrade's own making (a
// single control-plane node's kube-apiserver swapped) must not cost the
// leader its lease: it keeps trying to renew for RenewDeadline, longer
// than such a restart; a leader that died is taken over LeaseDuration
// after its last renewal (at once when it stopped cleanly: it releases).
const (
	LeaseDuration = 60 * time.Second
	RenewDeadline = 45 * time.Second
	RetryPeriod   = 5 * time.Second
)

// StopTimeout is how long a controller told to stop (SIGTERM) lets the
// nodes in flight finish before it stops where it is; its pod's
// termination grace period is 15 s longer.
const StopTimeout = 90 * time.Second

// ErrNotLeading is returned when the controller stops leading while
// ctx goes on: the process exits, and its Deployment starts it again as
// a candidate.
var ErrNotLeading = errors.New("stopped leading")

// Lead runs lead while this process (identity) leads the Lease
// namespace/LeaseName, and returns when it stops leading or ctx is done.
// The Lease is released only once lead has returned: a replica that
// takes over never runs beside a run still stopping.
func Lead(ctx context.Context, c kubernetes.Interface, namespace, identity string, lead func(context.Context)) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: LeaseName},
		Client:     c.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	// The elector's context ends after lead's run has: ReleaseOnCancel
	// releases the Lease when it ends.
	electCtx, stopElecting := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElecting()
	var started atomic.Bool
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		if !started.Load() {
			stopElecting() // not leading: nothing runs
		}
	})
	defer stop()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: LeaseDuration, RenewDeadline: RenewDeadline, RetryPeriod: RetryPeriod,
		ReleaseOnCancel: true, Name: LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leading context.Context) {
				started.Store(true)
				defer close(done)
				defer stopElecting() // the run has stopped: release the Lease
				// It runs until ctx is done or the lease is lost.
				runCtx, cancel := context.WithCancel(leading)
				defer cancel()
				defer context.AfterFunc(ctx, cancel)()
				lead(runCtx)
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return fmt.Errorf("lease %s/%s: %w", namespace, LeaseName, err)
	}
	le.Run(electCtx) // returns when it stops leading, or is stopped before it leads
	if started.Load() {
		<-done // lead's run has stopped
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("lease %s/%s: %w", namespace, LeaseName, ErrNotLeading)
}
