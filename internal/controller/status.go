package controller

// The Upgrade's status: the run's record mirrored into it, each write on
// its newest copy, and the Events the controller leaves on it.

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/upgradeapi"
)

// recordOf reads the run's record when it is u's: to u's version, and
// written since u started (an earlier run's record of the same version
// is not u's); nil otherwise.
func (c *Controller) recordOf(ctx context.Context, u *upgradeapi.Upgrade) *record.Status {
	st, err := record.ReadStatus(ctx, c.Kube)
	if err != nil {
		c.Log.Warn("record", "err", err)
		return nil
	}
	if st == nil || st.To != u.Spec.Version {
		return nil
	}
	now, err := c.Upgrades.Get(ctx, u.Name)
	if err != nil || now == nil || now.Status.Started == nil || st.Updated.Before(now.Status.Started.Time) {
		return nil // not started, or an earlier run's
	}
	return st
}

// mirror copies the run's record into the Upgrade's status every poll
// until ctx is done, and tells Upgrades written meanwhile that they wait.
func (c *Controller) mirror(ctx context.Context, u *upgradeapi.Upgrade) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.poll()):
		}
		if us, err := c.Upgrades.List(ctx); err == nil {
			if err := c.tellWaiting(ctx, us, u.Name); err != nil && ctx.Err() == nil {
				c.Log.Warn("upgrades", "err", err)
			}
		}
		st := c.recordOf(ctx, u)
		if st == nil {
			continue // no record of this upgrade yet
		}
		if err := c.setStatus(ctx, u.Name, func(now *upgradeapi.Upgrade) { mirrorRecord(&now.Status, st) }); err != nil && ctx.Err() == nil {
			c.Log.Warn("upgrade "+u.Name, "err", err)
		}
	}
}

// mirrorRecord copies a run's record into s: each node's status, step
// and kubelet version, the progress, the node in flight.
func mirrorRecord(s *upgradeapi.Status, st *record.Status) {
	if st == nil {
		return
	}
	s.From, s.To = st.From, st.To
	s.Nodes = s.Nodes[:0]
	done, current := 0, []string{}
	for _, n := range st.Nodes {
		updated := metav1.NewTime(n.Updated)
		s.Nodes = append(s.Nodes, upgradeapi.NodeStatus{Name: n.Name, Role: n.Role, Status: n.Status, Step: n.Step,
			Version: st.Kubelets[n.Name], LastError: n.LastError, Updated: &updated})
		if st.Kubelets[n.Name] == st.To {
			done++
		}
		if n.Status == record.NodeUpgrading {
			current = append(current, n.Name)
		}
	}
	s.Progress = fmt.Sprintf("%d/%d", done, len(st.Nodes))
	if len(current) > 0 {
		s.Current = strings.Join(current, ",")
	}
	updated := metav1.NewTime(st.Updated)
	s.Updated = &updated
}

// setStatus changes the Upgrade name's status as change says (it may
// read the rest), on its newest copy, again on a conflict.
func (c *Controller) setStatus(ctx context.Context, name string, change func(*upgradeapi.Upgrade)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u, err := c.Upgrades.Get(ctx, name)
		if err != nil || u == nil {
			return err
		}
		change(u)
		_, err = c.Upgrades.UpdateStatus(ctx, u)
		return err
	})
}

// event records an Event on the Upgrade (in default: the Upgrade has no
// namespace); one that cannot be written is logged.
func (c *Controller) event(ctx context.Context, u *upgradeapi.Upgrade, kind, reason, message string) {
	now := metav1.NewTime(c.now())
	ev := &corev1.Event{
		// Named as client-go's recorder names them.
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", u.Name, time.Now().UnixNano()), Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{APIVersion: upgradeapi.Group + "/" + upgradeapi.Version, Kind: upgradeapi.Kind,
			Name: u.Name, UID: u.UID},
		Type: kind, Reason: reason, Message: message, FirstTimestamp: now, LastTimestamp: now, Count: 1,
		Source: corev1.EventSource{Component: "kubelift-controller", Host: c.Identity},
	}
	if _, err := c.Kube.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
		c.Log.Warn("event", "upgrade", u.Name, "reason", reason, "err", err)
	}
}
