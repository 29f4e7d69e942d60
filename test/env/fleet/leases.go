package fleet

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// renewLeases renews, every LeaseRenew until the fleet closes, the Lease
// of each node whose kubelet runs.
func (f *Fleet) renewLeases() {
	defer f.wg.Done()
	t := time.NewTicker(f.cfg.LeaseRenew)
	defer t.Stop()
	for {
		select {
		case <-f.ctx.Done():
			return
		case <-t.C:
		}
		for _, n := range f.order {
			n.mu.Lock()
			u := n.units["kubelet"]
			runs := u != nil && u.version != ""
			n.mu.Unlock()
			if runs {
				f.renewLease(n.spec.Name)
			}
		}
	}
}

// renewLease makes or renews node's Lease, held by the node, for 40 s
// (a kubelet's default), as its kubelet does.
func (f *Fleet) renewLease(node string) {
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	leases := f.cfg.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, node, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		secs := int32(40)
		_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &node, LeaseDurationSeconds: &secs, RenewTime: &now}}, metav1.CreateOptions{})
	case err == nil:
		l.Spec.RenewTime = &now
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	// Renewed meanwhile by the other writer (the start's, the ticker's).
	if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
		return
	}
	if err != nil && f.ctx.Err() == nil {
		f.patchErrors.Add(1)
		f.cfg.Log("fleet: node %s: renew its Lease: %v", node, err)
	}
}
