// Package upgradelock is the coordination.k8s.io Lease that lets one
// upgrade at a time change a cluster: acquired (or taken over once a run
// that died has let it lapse), renewed while the run works, released at
// the end. It fences as client-go's leaderelection does: a holder that
// cannot renew within its renew deadline (shorter than the lease) stops
// acting, and a candidate takes a lease over only after watching it go
// unrenewed for the lease's whole duration on its own clock, so two
// machines' clocks are never compared.
package upgradelock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/kubelift/kubelift/internal/waiter"
)

// Name is the coordination.k8s.io Lease in kube-system that one
// upgrade at a time holds while it runs.
const Name = "kubelift-upgrade"

// ErrLocked means another upgrade holds the lock.
var ErrLocked = errors.New("another upgrade holds the lock")

// ErrLost means this run no longer holds the lock: another took it over,
// or it could not be renewed within its renew deadline (another may take
// it over now). The run stops before its next step.
var ErrLost = errors.New("lost the upgrade lock")

// LockedError names the holder of a live lock: its lease was renewed
// while this run watched it.
type LockedError struct {
	Holder string
	// Renewed is when the holder last renewed, by its own clock.
	Renewed time.Time
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("lease kube-system/%s is held by %s, which renewed it while this run watched (at %s by its clock): %v; wait for that run to end, or stop it (a dead run's lock is taken over once it has gone unrenewed for its duration)",
		Name, e.Holder, e.Renewed.Format(time.RFC3339), ErrLocked)
}

func (e *LockedError) Unwrap() error { return ErrLocked }

// NewHolder is an identity unique to this process: the host's name and a
// random suffix (two containers on one host share a hostname and often a
// pid, and so would "hostname/pid"), as leaderelection's callers build
// theirs.
func NewHolder() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "kubelift"
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24)
	return host + "_" + hex.EncodeToString(b)
}

// MinDuration is the shortest lock: a Lease's duration is whole
// seconds, and the lock is renewed every third of it.
const MinDuration = 3 * time.Second

// Lock is a held upgrade lock.
type Lock struct {
	client   kubernetes.Interface
	holder   string
	duration time.Duration
	// deadline: a run that has not renewed for this long stops acting;
	// two thirds of the duration (leaderelection's 10 s of 15 s).
	deadline time.Duration
	clock    clock.Clock
	renewing sync.Mutex            // one renewal at a time; held across its requests
	mu       sync.Mutex            // the fields below; never held across a request
	lease    *coordinationv1.Lease // as last written by this run
	renewed  time.Time             // when this process last renewed, by its clock
	lost     error                 // set once for good
	changed  chan struct{}         // closed and replaced when renewed or lost change
	// TakenOver is the holder whose lapsed lease this lock took over.
	TakenOver string
}

// RenewDeadline is how long a holder may go without renewing before it
// stops acting: two thirds of the lease's duration, so that it has
// stopped before any other run can take the lease over.
func RenewDeadline(duration time.Duration) time.Duration { return duration * 2 / 3 }

// retryPeriod is how often a candidate reads a lease it watches, and a
// holder retries a failed renewal.
const retryPeriod = time.Second

// Acquire takes the upgrade lock for holder, for duration at a time: it
// creates the Lease, takes a released one at once, and takes over one
// another holder let lapse. Whether the other holder is alive is judged
// as leaderelection does: by watching its lease for a change, on this
// process's clock; a lease renewed while watched is refused
// (LockedError), and one that went unrenewed for its whole duration is
// taken over. A live holder renews every third of its duration, so a
// refusal comes within that; a takeover waits the lease's duration.
// Waits run on clk (the real clock when nil); log says what is watched.
func Acquire(ctx context.Context, c kubernetes.Interface, holder string, duration time.Duration, clk clock.Clock, log *slog.Logger) (*Lock, error) {
	if duration < MinDuration {
		return nil, fmt.Errorf("upgrade lock duration %s: at least %s (a Lease counts whole seconds, renewed every third of it)", duration, MinDuration)
	}
	if holder == "" {
		return nil, errors.New("upgrade lock: no holder identity")
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Lock{client: c, holder: holder, duration: duration, deadline: RenewDeadline(duration), clock: clk, changed: make(chan struct{})}
	leases := c.CoordinationV1().Leases("kube-system")
	secs := int32(duration / time.Second)
	// What is watched: the lease as first seen (any write changes its
	// resourceVersion, and a renewal its renew time), and when this
	// process first saw it so.
	var seen *coordinationv1.Lease
	var seenAt time.Time
	for {
		existing, err := leases.Get(ctx, Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			t := metav1.NewMicroTime(clk.Now())
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: Name, Namespace: "kube-system", Labels: map[string]string{"app.kubernetes.io/managed-by": "kubelift"}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &t, RenewTime: &t}}
			created, err := leases.Create(ctx, lease, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue // another run created it first: watch it
			}
			if err != nil {
				return nil, fmt.Errorf("lease kube-system/%s: %w", Name, err)
			}
			l.took(created)
			return l, nil
		}
		if err != nil {
			return nil, fmt.Errorf("lease kube-system/%s: %w", Name, err)
		}
		other := deref(existing.Spec.HolderIdentity)
		free := existing.Spec.HolderIdentity == nil || *existing.Spec.HolderIdentity == "" || other == holder
		if !free {
			switch {
			case seen == nil:
				seen, seenAt = existing, clk.Now()
				d := leaseDuration(existing)
				log.Info("the upgrade lock is held: watching it for a renewal before taking it over", "lease", "kube-system/"+Name, "holder", other, "for", d.String())
			case !same(existing, seen):
				renewed := time.Time{}
				if existing.Spec.RenewTime != nil {
					renewed = existing.Spec.RenewTime.Time
				}
				return nil, &LockedError{Holder: other, Renewed: renewed}
			}
			if clk.Since(seenAt) < leaseDuration(existing) {
				if err := (waiter.Waiter{Clock: clk}).Pause(ctx, retryPeriod); err != nil {
					return nil, fmt.Errorf("lease kube-system/%s held by %s: %w", Name, other, err)
				}
				continue
			}
			l.TakenOver = other
		}
		t := metav1.NewMicroTime(clk.Now())
		existing.Spec.HolderIdentity, existing.Spec.LeaseDurationSeconds, existing.Spec.AcquireTime, existing.Spec.RenewTime = &holder, &secs, &t, &t
		existing.Spec.LeaseTransitions = ptrTo(deref32(existing.Spec.LeaseTransitions) + 1)
		// Conditional on the resourceVersion read (and watched): a
		// conflict means somebody wrote it meanwhile.
		updated, err := leases.Update(ctx, existing, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			return nil, fmt.Errorf("lease kube-system/%s changed while taking it: %w", Name, ErrLocked)
		}
		if err != nil {
			return nil, fmt.Errorf("lease kube-system/%s: %w", Name, err)
		}
		l.took(updated)
		return l, nil
	}
}

func (l *Lock) took(lease *coordinationv1.Lease) {
	l.lease, l.renewed = lease, l.clock.Now()
}

// same: b is the lease a was, unwritten since (its resourceVersion, and
// the holder and times in its spec, which every write changes).
func same(a, b *coordinationv1.Lease) bool {
	return a.ResourceVersion == b.ResourceVersion && deref(a.Spec.HolderIdentity) == deref(b.Spec.HolderIdentity) &&
		microEqual(a.Spec.RenewTime, b.Spec.RenewTime) && microEqual(a.Spec.AcquireTime, b.Spec.AcquireTime) &&
		deref32(a.Spec.LeaseTransitions) == deref32(b.Spec.LeaseTransitions)
}

func microEqual(a, b *metav1.MicroTime) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(b)
}

func leaseDuration(l *coordinationv1.Lease) time.Duration {
	if l.Spec.LeaseDurationSeconds == nil {
		return 0
	}
	return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
}

// ours: the lease as read is still this run's. Either nobody wrote it
// since this run last did (same), or the one who wrote it is this run:
// its holder identity is unique to this process, and every other writer
// (a takeover, a release) changes it. The second is a renewal whose
// answer was lost, the write done (an update sent as the API server or
// etcd restarts, or one that timed out on the client): read back, it is
// the lease this run now builds on.
func (l *Lock) ours(read, mine *coordinationv1.Lease) bool {
	return same(read, mine) || deref(read.Spec.HolderIdentity) == l.holder
}

// Holder is this lock's holder identity.
func (l *Lock) Holder() string { return l.holder }

// Renew extends the lease. It reads the lease, and writes over it (on
// its resourceVersion) only while it is still this run's, so a renewal
// that succeeds proves that nobody else wrote the lease since: not even
// while this run could not reach its API server. It fails with ErrLocked
// when another holder took it (or released or deleted it).
func (l *Lock) Renew(ctx context.Context) error {
	l.renewing.Lock()
	defer l.renewing.Unlock()
	l.mu.Lock()
	lost, mine := l.lost, l.lease
	l.mu.Unlock()
	if lost != nil {
		return lost
	}
	leases := l.client.CoordinationV1().Leases("kube-system")
	lease, err := leases.Get(ctx, Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("renew lease kube-system/%s: deleted since this run renewed it: %w", Name, ErrLocked)
	}
	if err != nil {
		return fmt.Errorf("renew lease kube-system/%s: %w", Name, err)
	}
	if !l.ours(lease, mine) {
		return fmt.Errorf("renew lease kube-system/%s: written by %s since this run renewed it: %w", Name, deref(lease.Spec.HolderIdentity), ErrLocked)
	}
	t := metav1.NewMicroTime(l.clock.Now())
	lease.Spec.RenewTime = &t
	updated, err := leases.Update(ctx, lease, metav1.UpdateOptions{})
	if err != nil {
		// A conflict too is not a loss by itself: written since this run
		// read it, by another or by this run's own earlier renewal that
		// landed late; the next renewal reads which.
		return fmt.Errorf("renew lease kube-system/%s: %w", Name, err)
	}
	l.mu.Lock()
	l.lease, l.renewed = updated, l.clock.Now()
	l.signal()
	l.mu.Unlock()
	return nil
}

// Lost is why the lock is lost for good (another run took it over, or the
// API server refused renewals for the lease's duration), nil while it is
// not: a run that lost it leaves the nodes to the run that holds it now.
func (l *Lock) Lost() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// signal wakes the waiters of Fence; l.mu held.
func (l *Lock) signal() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// lose marks the lock lost for good.
func (l *Lock) lose(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost == nil {
		l.lost = fmt.Errorf("%w: %w", ErrLost, err)
		l.signal()
	}
}

// Held says whether this run may act now: nil while the lease was renewed
// within the renew deadline; ErrLost (for good) once another took it or
// the API server refused renewals for the lease's duration; a
// NotRenewedError while renewals fail for longer than the deadline (the
// API server unreachable: the lease may lapse, and another take it).
func (l *Lock) Held() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heldLocked()
}

func (l *Lock) heldLocked() error {
	if l.lost != nil {
		return l.lost
	}
	if since := l.clock.Since(l.renewed); since > l.deadline {
		return &NotRenewedError{Since: since, Deadline: l.deadline}
	}
	return nil
}

// NotRenewedError: the lock has not been renewed within its deadline.
type NotRenewedError struct {
	Since, Deadline time.Duration
}

func (e *NotRenewedError) Error() string {
	return fmt.Sprintf("the upgrade lock was last renewed %s ago, past its renew deadline of %s (is the API server reachable?)", e.Since.Round(time.Second), e.Deadline)
}

// Unwrap: not renewed in time is the lock lost for acting, though a later
// renewal may still prove nobody took it.
func (e *NotRenewedError) Unwrap() error { return ErrLost }

// Fence is what a run asks before each step that acts on a node: nil when
// it holds the lock. While renewals fail past the renew deadline it waits
// up to within for one to succeed (the API server back: the renewal is
// conditional, so its success proves nobody took the lease meanwhile),
// and otherwise returns the reason, wrapping ErrLost.
func (l *Lock) Fence(ctx context.Context, within time.Duration) error {
	end := l.clock.Now().Add(within)
	for {
		l.mu.Lock()
		err, changed := l.heldLocked(), l.changed
		l.mu.Unlock()
		var nr *NotRenewedError
		if err == nil || !errors.As(err, &nr) {
			return err
		}
		left := end.Sub(l.clock.Now())
		if left <= 0 {
			return err
		}
		t := l.clock.NewTimer(min(left, retryPeriod))
		select {
		case <-changed:
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		t.Stop()
	}
}

// Keep renews the lease every third of its duration (after a failure,
// every second) until ctx ends. The lock is lost for good (lost is
// called) when a renewal finds the lease written by another, or when the
// API server answered renewals with refusals for longer than the lease
// lasts. While the API server cannot be reached or cannot answer, Held
// reports the lock not renewed once the renew deadline passes; renewals
// go on, and the first that succeeds proves nobody took it.
func (l *Lock) Keep(ctx context.Context, lost func(error)) {
	every := l.duration / 3
	wait := every
	for {
		if err := (waiter.Waiter{Clock: l.clock}).Pause(ctx, wait); err != nil {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, min(every, 10*time.Second))
		err := l.Renew(rctx)
		cancel()
		if err == nil {
			wait = every
			continue
		}
		if ctx.Err() != nil {
			return
		}
		l.mu.Lock()
		since := l.clock.Since(l.renewed)
		l.mu.Unlock()
		taken := errors.Is(err, ErrLocked) || errors.Is(err, ErrLost)
		if taken || (since > l.duration && !Unavailable(err)) {
			l.lose(err)
			lost(l.Held())
			return
		}
		wait = retryPeriod
	}
}

// Release gives the lock up (the Lease stays, without a holder), only
// where it is still this run's as it last wrote it.
func (l *Lock) Release(ctx context.Context) error {
	l.renewing.Lock()
	defer l.renewing.Unlock()
	l.mu.Lock()
	mine := l.lease
	l.mu.Unlock()
	leases := l.client.CoordinationV1().Leases("kube-system")
	lease, err := leases.Get(ctx, Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("release lease kube-system/%s: %w", Name, err)
	}
	if !l.ours(lease, mine) {
		return nil // taken over: not ours to release
	}
	empty := ""
	lease.Spec.HolderIdentity = &empty
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
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

func deref32(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}

func ptrTo[T any](v T) *T { return &v }

// Hold renews lock in the background until the returned stop is called;
// losing it for good cancels the returned context with the reason. stop
// waits for the renewals to end, then releases the lock (a failure to is
// logged: the lease then lapses by itself).
func Hold(ctx context.Context, lock *Lock, log *slog.Logger) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	keepCtx, stopKeep := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lock.Keep(keepCtx, func(err error) { cancel(err) })
	}()
	return ctx, func() {
		stopKeep()
		<-done
		// Released even when ctx ended; bounded, so that an API server
		// that is what failed does not hold the exit.
		rctx, cancelRelease := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancelRelease()
		if err := lock.Release(rctx); err != nil {
			log.Warn("cannot release the upgrade lock: it lapses by itself", "lease", "kube-system/"+Name, "err", err)
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
