package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/upgradelock"
	"github.com/kubelift/kubelift/internal/waiter"
)

// LeaderComponents are the parts that lead through a Lease in
// kube-system, and exit when they lose it.
var LeaderComponents = []string{"kube-controller-manager", "kube-scheduler"}

// WaitLeasesRenewed waits until the controller manager's and scheduler's
// leases are renewed while this run watches (their holder or renew time
// changes): a live holder, judged without comparing this machine's clock
// to the cluster's. A component without a lease (no leader election) is
// left to the per-node check; an API server that cannot answer for a
// while is waited for.
func WaitLeasesRenewed(ctx context.Context, r *Run) error {
	leases := r.Client.CoordinationV1().Leases(metav1.NamespaceSystem)
	for _, comp := range LeaderComponents {
		var first *coordinationv1.Lease
		none := false
		err := r.Wait.Poll(ctx, time.Second, r.ReadyTimeout, func(ctx context.Context) error {
			l, err := leases.Get(ctx, comp, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err) && first == nil:
				none = true
				return nil
			case err != nil && !upgradelock.Unavailable(err):
				return waiter.Stop(err)
			case err != nil:
				return err
			case first == nil:
				first = l
				return fmt.Errorf("lease kube-system/%s: waiting for a renewal", comp)
			case leaseRenewed(first, l):
				return nil
			}
			return fmt.Errorf("lease kube-system/%s not renewed since this run first read it (holder %s)", comp, deref(l.Spec.HolderIdentity))
		})
		if errors.Is(err, waiter.ErrTimeout) {
			return fmt.Errorf("%s holds no live lease within %s: %w", comp, r.ReadyTimeout, err)
		}
		if err != nil {
			return err
		}
		if none {
			r.Log.Debug("no lease: not leader-elected", "component", comp)
		}
	}
	return nil
}

// leaseRenewed: b is a later reading of lease a, renewed since (its
// holder or renew time changed).
func leaseRenewed(a, b *coordinationv1.Lease) bool {
	if deref(a.Spec.HolderIdentity) != deref(b.Spec.HolderIdentity) {
		return deref(b.Spec.HolderIdentity) != ""
	}
	if a.Spec.RenewTime == nil || b.Spec.RenewTime == nil {
		return b.Spec.RenewTime != nil
	}
	return !a.Spec.RenewTime.Equal(b.Spec.RenewTime)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
