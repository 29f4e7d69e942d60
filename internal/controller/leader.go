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
// namespace/LeaseName, and returns when it stops leading or ctx is done,
// once lead has returned. The Lease is released only once lead has
// returned: a replica that takes over never runs beside a run still
// stopping. (A lease lost while leading is not released: it lapses.)
func Lead(ctx context.Context, c kubernetes.Interface, namespace, identity string, lead func(context.Context)) error {
	var state atomic.Int32 // idle, then leading or stopped before it led
	const idle, leading, stopped = 0, 1, 2
	var returned atomic.Bool // lead has returned: the Lease may go
	lock := &releaseAfter{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: LeaseName},
		Client:     c.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}, returned: &returned}
	// The elector's context ends after lead's run has: ReleaseOnCancel
	// releases the Lease when it ends.
	electCtx, stopElecting := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElecting()
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		if state.CompareAndSwap(idle, stopped) {
			stopElecting() // not leading: nothing runs
		}
	})
	defer stop()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: LeaseDuration, RenewDeadline: RenewDeadline, RetryPeriod: RetryPeriod,
		ReleaseOnCancel: true, Name: LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(led context.Context) {
				if !state.CompareAndSwap(idle, leading) {
					return // stopped before it led
				}
				// It runs until ctx is done or the lease is lost.
				runCtx, cancel := context.WithCancel(led)
				stopRun := context.AfterFunc(ctx, cancel)
				lead(runCtx)
				stopRun()
				cancel()
				returned.Store(true)
				stopElecting() // the run has stopped: release the Lease
				close(done)
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return fmt.Errorf("lease %s/%s: %w", namespace, LeaseName, err)
	}
	le.Run(electCtx) // returns when it stops leading, or is stopped before it leads
	if state.Load() == leading {
		<-done // lead's run has stopped
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("lease %s/%s: %w", namespace, LeaseName, ErrNotLeading)
}

// releaseAfter is a lock whose release (an update to no holder) is made
// only once lead has returned: client-go releases as soon as it stops
// renewing, which a lost lease does while the run still goes.
type releaseAfter struct {
	resourcelock.Interface
	returned *atomic.Bool
}

func (l *releaseAfter) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	if r.HolderIdentity == "" && !l.returned.Load() {
		return nil // left to lapse
	}
	return l.Interface.Update(ctx, r)
}
