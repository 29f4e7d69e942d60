package upgradelock

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestLock(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	now := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	a, err := Acquire(ctx, c, "admin-1/100", time.Minute, clock)
	if err != nil || a.TakenOver != "" {
		t.Fatalf("first: %v %+v", err, a)
	}
	// A second run while the first holds a live lease is refused, naming it.
	_, err = Acquire(ctx, c, "admin-2/200", time.Minute, clock)
	var le *LockedError
	if !errors.Is(err, ErrLocked) || !errors.As(err, &le) || le.Holder != "admin-1/100" || !strings.Contains(err.Error(), "held by admin-1/100") {
		t.Fatalf("second while held: %v", err)
	}
	// Renewed, it stays held past its first expiry.
	now = now.Add(50 * time.Second)
	if err := a.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	now = now.Add(50 * time.Second)
	if _, err := Acquire(ctx, c, "admin-2/200", time.Minute, clock); !errors.Is(err, ErrLocked) {
		t.Fatalf("after a renewal: %v", err)
	}
	// The holder dies: after expiry another run takes over (resume).
	now = now.Add(2 * time.Minute)
	b, err := Acquire(ctx, c, "admin-2/200", time.Minute, clock)
	if err != nil || b.TakenOver != "admin-1/100" {
		t.Fatalf("take over: %v %+v", err, b)
	}
	// The dead one cannot renew what was taken.
	if err := a.Renew(ctx); err == nil {
		t.Error("the old holder renewed a lease another took over")
	}
	// The dead one's release does not free what another holds.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(ctx, c, "admin-3/300", time.Minute, clock); !errors.Is(err, ErrLocked) {
		t.Fatalf("a stale release freed the lock: %v", err)
	}
	// Released, anyone takes it at once.
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if c2, err := Acquire(ctx, c, "admin-3/300", time.Minute, clock); err != nil || c2.TakenOver != "" {
		t.Fatalf("after release: %v %+v", err, c2)
	}
}

// A lock shorter than MinDuration is refused before any Lease is written:
// its Lease would count 0 seconds (taken over at once) and its keeper
// would tick every third of nothing.
func TestAcquireRefusesAShortLock(t *testing.T) {
	c := fake.NewClientset()
	if _, err := Acquire(context.Background(), c, "admin-1/100", 900*time.Millisecond, nil); err == nil || !strings.Contains(err.Error(), "900ms") {
		t.Fatalf("a 900ms lock: %v", err)
	}
	if leases, _ := c.CoordinationV1().Leases("kube-system").List(context.Background(), metav1.ListOptions{}); len(leases.Items) != 0 {
		t.Errorf("%d Leases written", len(leases.Items))
	}
}

// Keep rides out an API server that fails for a while (kubeadm restarts
// it): after a failed renewal it tries every second. An API server that
// answers with a refusal for longer than the lease lasts loses the lock;
// one that cannot be reached or cannot answer does not (nobody can take
// the Lease from it meanwhile).
func TestKeepRidesOutAnAPIServerRestart(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int32 // renewals that fail before they succeed again (-1: all)
		lost     bool
		err      error
	}{
		{"a restart", 2, false, errors.New("renew: etcd leader changed")},
		{"refusing past the lease's duration", -1, true, apierrors.NewForbidden(schema.GroupResource{Resource: "leases"}, "kubelift-upgrade", errors.New("RBAC"))},
		// kubeadm restarting etcd and the API server: nobody can take the
		// Lease meanwhile, and the lock is kept.
		{"unreachable past the lease's duration", -1, false, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}},
		{"timing out past the lease's duration", -1, false, apierrors.NewServerTimeout(schema.GroupResource{Resource: "leases"}, "get", 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset()
			l, err := Acquire(context.Background(), c, "admin-1/100", MinDuration, nil)
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
			case <-time.After(2*MinDuration + time.Second):
				if tc.lost {
					t.Fatal("kept a lock no renewal succeeded for")
				}
				if gets.Load() <= tc.failures {
					t.Fatalf("%d renewals tried", gets.Load())
				}
			}
			cancel()
			<-done
		})
	}
}
