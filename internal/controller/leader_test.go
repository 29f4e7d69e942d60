package controller

import (
	"context"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// recordingLock is a lock that records the holders it is updated to.
type recordingLock struct {
	resourcelock.Interface
	updates []string
}

func (l *recordingLock) Update(_ context.Context, r resourcelock.LeaderElectionRecord) error {
	l.updates = append(l.updates, r.HolderIdentity)
	return nil
}

// The Lease is released (updated to no holder) only once lead has
// returned; renewals go through always.
func TestReleaseOnlyAfterTheRun(t *testing.T) {
	inner := &recordingLock{}
	var returned atomic.Bool
	l := &releaseAfter{Interface: inner, returned: &returned}
	ctx := context.Background()
	_ = l.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "me"})
	_ = l.Update(ctx, resourcelock.LeaderElectionRecord{}) // the lease lost: the run still goes
	returned.Store(true)
	_ = l.Update(ctx, resourcelock.LeaderElectionRecord{}) // the run has returned
	if got := len(inner.updates); got != 2 || inner.updates[0] != "me" || inner.updates[1] != "" {
		t.Fatalf("updates %q: want the renewal, then one release after the run", inner.updates)
	}
}
