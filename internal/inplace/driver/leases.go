package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
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

// kubeletLeaseDuration is a kubelet's default nodeLeaseDurationSeconds:
// a live kubelet renews its Lease four times within it.
const kubeletLeaseDuration = 40 * time.Second

// WaitNodeLeaseRenewed waits until node's Lease (kube-node-lease) is
// renewed, or made, after this wait first reads it: the kubelet that
// runs there now is alive. The Node's Ready condition cannot say so: a
// kubelet that never starts posts nothing, and the condition stays what
// the last one wrote, until the node controller marks the node NotReady
// (docs/runbook.md). The wait lasts timeout, and at least the Lease's
// duration (a kubelet's default where it cannot be read), within which
// a live kubelet renews it four times.
func WaitNodeLeaseRenewed(ctx context.Context, r *Run, node string, timeout time.Duration) error {
	leases := r.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	bound := max(timeout, kubeletLeaseDuration)
	// The first reading, which a renewal must differ from (none: the
	// Lease's making is one); one that fails is made by the wait.
	first, err := leases.Get(ctx, node, metav1.GetOptions{})
	read := err == nil || apierrors.IsNotFound(err)
	if err != nil {
		first = nil
	} else if first.Spec.LeaseDurationSeconds != nil {
		bound = max(bound, time.Duration(*first.Spec.LeaseDurationSeconds)*time.Second)
	}
	err = r.Wait.Poll(ctx, time.Second, bound, func(ctx context.Context) error {
		l, err := leases.Get(ctx, node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			read = true
			return fmt.Errorf("lease %s/%s: none yet", corev1.NamespaceNodeLease, node)
		case err != nil && !upgradelock.Unavailable(err):
			return waiter.Stop(fmt.Errorf("lease %s/%s: %w", corev1.NamespaceNodeLease, node, err))
		case err != nil:
			return err
		case !read:
			read, first = true, l
			return fmt.Errorf("lease %s/%s: waiting for a renewal", corev1.NamespaceNodeLease, node)
		case first == nil || leaseRenewed(first, l):
			return nil
		}
		return fmt.Errorf("lease %s/%s not renewed since this wait first read it (renewed %s)", corev1.NamespaceNodeLease, node, renewTime(l))
	})
	switch {
	case errors.Is(err, waiter.ErrTimeout) && !read:
		return fmt.Errorf("node %s: its Lease could not be read within %s: %w", node, bound, err)
	case errors.Is(err, waiter.ErrTimeout):
		return fmt.Errorf("node %s: no kubelet renewed its Lease within %s: %w", node, bound, err)
	}
	return err
}

func renewTime(l *coordinationv1.Lease) string {
	if l.Spec.RenewTime == nil {
		return "never"
	}
	return l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
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
