// Package upgradelock is the coordination.k8s.io Lease that lets one
// upgrade at a time change a cluster: acquired (or taken over once a run
// that died lets it expire), renewed while the run works, released at the
// end.
package upgradelock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Name is the coordination.k8s.io Lease in kube-system that one
// upgrade at a time holds while it runs.
const Name = "kubelift-upgrade"

// ErrLocked means another upgrade holds the lock.
var ErrLocked = errors.New("another upgrade holds the lock")

// LockedError names the holder.
type LockedError struct {
	Holder  string
	Renewed time.Time
	Expires time.Time
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("lease kube-system/%s is held by %s (renewed %s, expires %s unless renewed): %v; if that run is dead, run again after it expires to take over",
		Name, e.Holder, e.Renewed.Format(time.RFC3339), e.Expires.Format(time.RFC3339), ErrLocked)
}

func (e *LockedError) Unwrap() error { return ErrLocked }

// Lock is a held upgrade lock.
type Lock struct {
	client   kubernetes.Interface
	holder   string
	duration time.Duration
	now      func() time.Time
	mu       sync.Mutex
	lease    *coordinationv1.Lease
	// TakenOver is the holder whose expired lease this lock took over.
	TakenOver string
}

// MinDuration is the shortest lock: a Lease's duration is whole
// seconds, and the lock is renewed every third of it.
const MinDuration = 3 * time.Second

// Acquire takes the upgrade lock for holder, for duration at a time: it
// creates the Lease, or takes it over when its holder let it expire (a
// dead run: that is resume). A live lease of another holder is refused.
func Acquire(ctx context.Context, c kubernetes.Interface, holder string, duration time.Duration, now func() time.Time) (*Lock, error) {
	if duration < MinDuration {
		return nil, fmt.Errorf("upgrade lock duration %s: at least %s (a Lease counts whole seconds, renewed every third of it)", duration, MinDuration)
	}
	if now == nil {
		now = time.Now
	}
	l := &Lock{client: c, holder: holder, duration: duration, now: now}
	leases := c.CoordinationV1().Leases("kube-system")
	secs := int32(duration / time.Second)
	t := metav1.NewMicroTime(now())
	existing, err := leases.Get(ctx, Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: Name, Namespace: "kube-system", Labels: map[string]string{"app.kubernetes.io/managed-by": "kubelift"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &t, RenewTime: &t}}
		created, err := leases.Create(ctx, lease, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("lease kube-system/%s: %w", Name, err)
		}
		l.lease = created
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lease kube-system/%s: %w", Name, err)
	}
	if h := existing.Spec.HolderIdentity; h != nil && *h != "" && *h != holder {
		renewed := time.Time{}
		if existing.Spec.RenewTime != nil {
			renewed = existing.Spec.RenewTime.Time
		}
		d := time.Duration(0)
		if existing.Spec.LeaseDurationSeconds != nil {
			d = time.Duration(*existing.Spec.LeaseDurationSeconds) * time.Second
		}
		if now().Before(renewed.Add(d)) {
			return nil, &LockedError{Holder: *h, Renewed: renewed, Expires: renewed.Add(d)}
		}
		l.TakenOver = *h
	}
	existing.Spec.HolderIdentity, existing.Spec.LeaseDurationSeconds, existing.Spec.AcquireTime, existing.Spec.RenewTime = &holder, &secs, &t, &t
	updated, err := leases.Update(ctx, existing, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return nil, fmt.Errorf("lease kube-system/%s changed while taking it over: %w", Name, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("lease kube-system/%s: %w", Name, err)
	}
	l.lease = updated
	return l, nil
}

// Renew extends the lease; it fails if another holder took it.
func (l *Lock) Renew(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	lease, err := l.client.CoordinationV1().Leases("kube-system").Get(ctx, Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("renew lease kube-system/%s: %w", Name, err)
	}
	if h := lease.Spec.HolderIdentity; h == nil || *h != l.holder || lease.ResourceVersion != l.lease.ResourceVersion {
		return fmt.Errorf("renew lease kube-system/%s: taken over by %s: %w", Name, deref(lease.Spec.HolderIdentity), ErrLocked)
	}
	t := metav1.NewMicroTime(l.now())
	lease.Spec.RenewTime = &t
	updated, err := l.client.CoordinationV1().Leases("kube-system").Update(ctx, lease, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("renew lease kube-system/%s: %w", Name, err)
	}
	l.lease = updated
	return nil
}

// Keep renews the lease every third of its duration until ctx ends. The
// lock is lost (lost is called) when a renewal finds the lease held by
// another, or when renewals the API server answered have failed for
// longer than the lease lasts. While the API server cannot be reached or
// cannot answer (kubeadm restarting etcd and the API server), renewals
// are tried every second and the lock is not given up: nobody can take a
// Lease from an API server that does not answer, and the first renewal
// after it answers again finds out whether somebody did.
func (l *Lock) Keep(ctx context.Context, lost func(error)) {
	// Every third of the duration; after a failure every second, each
	// attempt bounded.
	every := l.duration / 3
	wait := every
	lastOK := l.now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
			rctx, cancel := context.WithTimeout(ctx, min(every, 10*time.Second))
			err := l.Renew(rctx)
			cancel()
			if err != nil {
				taken := errors.Is(err, ErrLocked) || apierrors.IsConflict(errors.Unwrap(err))
				if taken || (l.now().Sub(lastOK) > l.duration && !Unavailable(err)) {
					lost(err)
					return
				}
				wait = time.Second
				continue
			}
			lastOK, wait = l.now(), every
		}
	}
}

// Release gives the lock up (the Lease stays, without a holder).
func (l *Lock) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	lease, err := l.client.CoordinationV1().Leases("kube-system").Get(ctx, Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("release lease kube-system/%s: %w", Name, err)
	}
	if h := lease.Spec.HolderIdentity; h == nil || *h != l.holder {
		return nil // taken over: not ours to release
	}
	empty := ""
	lease.Spec.HolderIdentity = &empty
	if _, err := l.client.CoordinationV1().Leases("kube-system").Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("release lease kube-system/%s: %w", Name, err)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return "nobody"
	}
	return *s
}

// Hold renews lock in the background until the returned stop is called;
// losing it cancels the returned context with the reason. stop waits for
// the renewals to end, then releases the lock (a failure to is logged:
// the lease then expires by itself).
func Hold(ctx context.Context, lock *Lock, log *slog.Logger) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	keepCtx, stopKeep := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lock.Keep(keepCtx, func(err error) { cancel(fmt.Errorf("lost the upgrade lock: %w", err)) })
	}()
	return ctx, func() {
		stopKeep()
		<-done
		// Released even when ctx ended; bounded, so that an API server
		// that is what failed does not hold the exit.
		rctx, cancelRelease := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancelRelease()
		if err := lock.Release(rctx); err != nil {
			log.Warn("cannot release the upgrade lock: it expires by itself", "lease", "kube-system/"+Name, "err", err)
		}
		cancel(nil)
	}
}

// Unavailable says err means the API server could not be reached or could
// not answer in time (a network error, a timeout, 429, 500, 503 or 504),
// as opposed to an answer.
func Unavailable(err error) bool {
	var ne net.Error
	var se apierrors.APIStatus
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.As(err, &ne):
		return true
	case errors.As(err, &se):
		switch se.Status().Code {
		case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true
		}
	}
	return false
}
