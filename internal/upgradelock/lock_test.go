package upgradelock

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)

// acquiring runs Acquire in the background and steps clk a second each
// time Acquire waits, calling tick first (a holder renewing, or not).
func acquiring(t *testing.T, c *fake.Clientset, clk *clocktesting.FakeClock, holder string, tick func()) (*Lock, error) {
	t.Helper()
	type result struct {
		l   *Lock
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := Acquire(context.Background(), c, holder, MinDuration, clk, nil)
		done <- result{l, err}
	}()
	for steps := 0; ; {
		select {
		case r := <-done:
			return r.l, r.err
		case <-time.After(time.Millisecond):
		}
		if clk.HasWaiters() {
			if steps++; steps > 100 {
				t.Fatal("Acquire still waiting after 100 s of its clock")
			}
			tick()
			clk.Step(time.Second)
		}
	}
}

// A held lease is taken over only after this process watched it go
// unrenewed for its whole duration, and refused as soon as it sees a
// renewal; what its renew time says (another machine's clock) decides
// neither.
func TestAcquireWatchesTheHolder(t *testing.T) {
	c := fake.NewClientset()
	clk := clocktesting.NewFakeClock(t0)
	a, err := Acquire(context.Background(), c, "admin-1_aaaa", MinDuration, clk, nil)
	if err != nil || a.TakenOver != "" {
		t.Fatalf("first: %v %+v", err, a)
	}
	// The holder renews while the second run watches: refused, naming it.
	_, err = acquiring(t, c, clk, "admin-2_bbbb", func() {
		if err := a.Renew(context.Background()); err != nil {
			t.Error(err)
		}
	})
	var le *LockedError
	if !errors.Is(err, ErrLocked) || !errors.As(err, &le) || le.Holder != "admin-1_aaaa" || !strings.Contains(err.Error(), "held by admin-1_aaaa") {
		t.Fatalf("second while the holder renews: %v", err)
	}
	// The holder's renew time is far in the future by this machine's
	// clock: it still lapses, once watched for its duration.
	leases := c.CoordinationV1().Leases("kube-system")
	l, _ := leases.Get(context.Background(), Name, metav1.GetOptions{})
	future := metav1.NewMicroTime(t0.Add(24 * time.Hour))
	l.Spec.RenewTime = &future
	if _, err := leases.Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	began := clk.Now()
	b, err := acquiring(t, c, clk, "admin-2_bbbb", func() {})
	if err != nil || b.TakenOver != "admin-1_aaaa" {
		t.Fatalf("take over: %v %+v", err, b)
	}
	if waited := clk.Since(began); waited < MinDuration {
		t.Errorf("taken over after watching %s, less than the lease's %s", waited, MinDuration)
	}
	// The dead one cannot renew what was taken, nor release it.
	if err := a.Renew(context.Background()); !errors.Is(err, ErrLocked) {
		t.Errorf("the old holder renewed a lease another took over: %v", err)
	}
	if err := a.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if l, _ := leases.Get(context.Background(), Name, metav1.GetOptions{}); deref(l.Spec.HolderIdentity) != "admin-2_bbbb" {
		t.Fatalf("a stale release freed the lock: held by %s", deref(l.Spec.HolderIdentity))
	}
	// Released, anyone takes it at once: no waiting.
	if err := b.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c2, err := Acquire(context.Background(), c, "admin-3_cccc", MinDuration, clk, nil); err != nil || c2.TakenOver != "" {
		t.Fatalf("after release: %v %+v", err, c2)
	}
}

// A holder that has not renewed within its renew deadline may not act
// (Held, Fence): before anyone could take the lease over. A renewal that
// succeeds later (its API server back) proves nobody did, and Fence lets
// it go on; once another holder wrote the lease, nothing does.
func TestHeldAndFence(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	clk := clocktesting.NewFakeClock(t0)
	a, err := Acquire(ctx, c, "admin-1_aaaa", 6*time.Second, clk, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Held(); err != nil {
		t.Fatalf("just acquired: %v", err)
	}
	clk.Step(4 * time.Second) // the deadline: two thirds of 6 s
	if err := a.Held(); err != nil {
		t.Fatalf("at the renew deadline: %v", err)
	}
	clk.Step(time.Second)
	var nr *NotRenewedError
	if err := a.Held(); !errors.As(err, &nr) || !errors.Is(err, ErrLost) {
		t.Fatalf("past the renew deadline: %v", err)
	}
	// Fence waits for a renewal, and lets the run go on after one.
	fenced := make(chan error, 1)
	go func() { fenced <- a.Fence(ctx, time.Minute) }()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-fenced:
		t.Fatalf("Fence returned %v before a renewal", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := a.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-fenced; err != nil {
		t.Fatalf("Fence after a renewal: %v", err)
	}
	// Without one it gives up after its wait, saying why.
	clk.Step(5 * time.Second)
	go func() { fenced <- a.Fence(ctx, 3*time.Second) }()
	for i := 0; i < 3; i++ {
		for !clk.HasWaiters() {
			time.Sleep(time.Millisecond)
		}
		clk.Step(time.Second)
	}
	if err := <-fenced; !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "renew deadline") {
		t.Fatalf("Fence with no renewal: %v", err)
	}
	// Another run writes the lease: the renewal fails, for good.
	leases := c.CoordinationV1().Leases("kube-system")
	l, _ := leases.Get(ctx, Name, metav1.GetOptions{})
	other := "admin-2_bbbb"
	l.Spec.HolderIdentity = &other
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Renew(ctx); !errors.Is(err, ErrLocked) {
		t.Fatalf("renewal over another's write: %v", err)
	}
}

// NewHolder is unique per call (two containers on one host share the
// hostname, and may share a pid).
func TestNewHolderIsUnique(t *testing.T) {
	a, b := NewHolder(), NewHolder()
	if a == b || !strings.Contains(a, "_") {
		t.Errorf("holders %q and %q", a, b)
	}
}

// A lock shorter than MinDuration is refused before any Lease is written:
// its Lease would count 0 seconds (taken over at once) and its keeper
// would tick every third of nothing.
func TestAcquireRefusesAShortLock(t *testing.T) {
	c := fake.NewClientset()
	if _, err := Acquire(context.Background(), c, "admin-1_aaaa", 900*time.Millisecond, nil, nil); err == nil || !strings.Contains(err.Error(), "900ms") {
		t.Fatalf("a 900ms lock: %v", err)
	}
	if leases, _ := c.CoordinationV1().Leases("kube-system").List(context.Background(), metav1.ListOptions{}); len(leases.Items) != 0 {
		t.Errorf("%d Leases written", len(leases.Items))
	}
}

// Keep rides out an API server that fails for a while (kubeadm restarts
// it): after a failed renewal it tries every second. An API server that
// answers with a refusal for longer than the lease lasts loses the lock
// for good; one that cannot be reached or cannot answer does not, but the
// lock is not Held past its renew deadline (the run must not act: another
// may take the lease through another API server).
func TestKeepRidesOutAnAPIServerRestart(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int32 // renewals that fail before they succeed again (-1: all)
		lost     bool
		err      error
	}{
		{"a restart", 2, false, errors.New("renew: etcd leader changed")},
		{"refusing past the lease's duration", -1, true, apierrors.NewForbidden(schema.GroupResource{Resource: "leases"}, "kubelift-upgrade", errors.New("RBAC"))},
		{"unreachable past the lease's duration", -1, false, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}},
		{"timing out past the lease's duration", -1, false, apierrors.NewServerTimeout(schema.GroupResource{Resource: "leases"}, "get", 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset()
			l, err := Acquire(context.Background(), c, "admin-1_aaaa", MinDuration, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			var gets atomic.Int32
			c.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
				if n := gets.Add(1); tc.failures < 0 || n <= tc.failures {
					return true, nil, tc.err
				}
				return false, nil, nil
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			lost := make(chan error, 1)
			done := make(chan struct{})
			go func() { l.Keep(ctx, func(err error) { lost <- err }); close(done) }()
			// Watched for over two lease durations; every renewal attempt is
			// bounded, so this ends.
			select {
			case err := <-lost:
				if !tc.lost {
					t.Fatalf("lost the lock across %d failed renewals: %v", tc.failures, err)
				}
				if !errors.Is(err, ErrLost) || !errors.Is(l.Held(), ErrLost) {
					t.Errorf("lost with %v; Held says %v", err, l.Held())
				}
			case <-time.After(2*MinDuration + time.Second):
				if tc.lost {
					t.Fatal("kept a lock no renewal succeeded for")
				}
				if gets.Load() <= tc.failures {
					t.Fatalf("%d renewals tried", gets.Load())
				}
				held := l.Held()
				if tc.failures < 0 && !errors.Is(held, ErrLost) {
					t.Errorf("unrenewed for %s, and Held says %v", 2*MinDuration, held)
				}
				if tc.failures >= 0 && held != nil {
					t.Errorf("renewed again, and Held says %v", held)
				}
			}
			cancel()
			<-done
		})
	}
}

// Losing the lock for good cancels Hold's context with the reason.
func TestHoldCancelsOnLoss(t *testing.T) {
	c := fake.NewClientset()
	l, err := Acquire(context.Background(), c, "admin-1_aaaa", MinDuration, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := Hold(context.Background(), l, slog.New(slog.DiscardHandler))
	defer stop()
	leases := c.CoordinationV1().Leases("kube-system")
	lease, _ := leases.Get(context.Background(), Name, metav1.GetOptions{})
	other := "admin-2_bbbb"
	lease.Spec = coordinationv1.LeaseSpec{HolderIdentity: &other, LeaseDurationSeconds: lease.Spec.LeaseDurationSeconds}
	if _, err := leases.Update(context.Background(), lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(3 * MinDuration):
		t.Fatal("the context outlived the lock")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, ErrLost) || !strings.Contains(cause.Error(), "admin-2_bbbb") {
		t.Errorf("cause %v", cause)
	}
}

// A renewal whose write lands but whose answer is lost (the API server or
// its etcd restarting under kubeadm, the client's timeout) leaves the
// lease newer than this run knows it: written by this run, so the next
// renewal builds on it and the lock is kept. Another's write after that
// still loses it.
func TestARenewalWhoseAnswerWasLostKeepsTheLock(t *testing.T) {
	c := fake.NewClientset()
	l, err := Acquire(context.Background(), c, "admin-1_aaaa", MinDuration, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	leases := c.CoordinationV1().Leases("kube-system")
	var lose atomic.Bool
	lose.Store(true)
	c.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !lose.CompareAndSwap(true, false) {
			return false, nil, nil
		}
		// The write is done; its answer never comes.
		obj := a.(k8stesting.UpdateAction).GetObject()
		if err := c.Tracker().Update(a.GetResource(), obj, "kube-system"); err != nil {
			t.Errorf("the lost renewal's write: %v", err)
		}
		return true, nil, apierrors.NewTimeoutError("request did not complete within requested timeout", 0)
	})
	if err := l.Renew(context.Background()); err == nil || errors.Is(err, ErrLocked) {
		t.Fatalf("the renewal whose answer was lost: %v", err)
	}
	before, _ := leases.Get(context.Background(), Name, metav1.GetOptions{})
	if err := l.Renew(context.Background()); err != nil {
		t.Fatalf("the next renewal: %v", err)
	}
	after, _ := leases.Get(context.Background(), Name, metav1.GetOptions{})
	if microEqual(after.Spec.RenewTime, before.Spec.RenewTime) {
		t.Errorf("the next renewal wrote nothing")
	}
	if err := l.Held(); err != nil {
		t.Errorf("Held: %v", err)
	}
	other := "admin-2_bbbb"
	after.Spec.HolderIdentity = &other
	if _, err := leases.Update(context.Background(), after, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(context.Background()); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), other) {
		t.Errorf("renewal after %s took it: %v", other, err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, _ := leases.Get(context.Background(), Name, metav1.GetOptions{}); deref(got.Spec.HolderIdentity) != other {
		t.Errorf("released another's lease: held by %s", deref(got.Spec.HolderIdentity))
	}
}

// Take runs its then once the lock is held, with the held context; a
// then that fails leaves nothing held: the next run takes the lock at
// once.
func TestTakeRunsThenUnderTheLock(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	log := slog.New(slog.DiscardHandler)
	ran := false
	_, _, _, err := Take(ctx, c, "admin-1_aaaa", MinDuration, nil, log, func(ctx context.Context, _ string) error {
		l, err := c.CoordinationV1().Leases("kube-system").Get(ctx, Name, metav1.GetOptions{})
		ran = err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "admin-1_aaaa"
		return errors.New("adopt failed")
	})
	if err == nil || err.Error() != "adopt failed" || !ran {
		t.Fatalf("Take with a failing then: %v (ran under the lock: %v)", err, ran)
	}
	lock, _, stop, err := Take(ctx, c, "admin-2_bbbb", MinDuration, nil, log, nil)
	if err != nil || lock.TakenOver != "" {
		t.Fatalf("the next run, after a then that failed: %v %+v", err, lock)
	}
	stop()
}
