// Package drivertest is what a driver's tests stand on: Effects that
// record what a driver asked of its run, over fake nodes, and a fake
// clock that moves only while something waits on it.
package drivertest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/waiter"
)

// Effects is a run's side of the driver seam, recorded. Nodes are the
// nodes OnNode reaches (by name); FenceErr, when set, is what Fence
// says (the lock lost) from its FenceFrom'th call on (from the first when
// 0), and LostErr what Lost says.
type Effects struct {
	Nodes               map[string]nodeaccess.Node
	Facts               map[string]*nodefacts.Facts
	StageDir, BackupDir string
	Dry                 bool
	FenceErr, LostErr   error
	FenceFrom           int
	fences              int
	// Wait is the clock Timed reads (the run's).
	Wait waiter.Waiter

	mu sync.Mutex
	// Statuses are each node's statuses, in order, as "STATUS STEP".
	Statuses map[string][]string
	// Events are the Events posted, as "NODE REASON".
	Events []string
	// Said are what a dry run would do, as "NODE: WHAT ### COMMAND"
	// (without " ### COMMAND" when there is none).
	Said []string
	// Moved are the parts marked moved, as "NODE/PART".
	Moved   []string
	Waiting time.Duration
}

var _ driver.Effects = (*Effects)(nil)

func (e *Effects) OnNode(ctx context.Context, node, from, to string, fn func(context.Context, *nodeops.Ops) error) error {
	if err := e.Fence(ctx); err != nil {
		return fmt.Errorf("node %s: not started: %w", node, err)
	}
	n, ok := e.Nodes[node]
	if !ok {
		return fmt.Errorf("node %s: unreachable", node)
	}
	f := e.Facts[node]
	if f == nil {
		f = &nodefacts.Facts{}
	}
	o := &nodeops.Ops{Node: n, Name: node, StageDir: e.StageDir, BackupDir: e.BackupDir, From: from, To: to, Facts: f}
	if e.Dry {
		o.Dry = func(node, command string) { e.Would(node, "", command) }
	}
	return fn(ctx, o)
}

func (e *Effects) SetNode(_ context.Context, node, status, step string, _ error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.Statuses == nil {
		e.Statuses = map[string][]string{}
	}
	e.Statuses[node] = append(e.Statuses[node], status+" "+step)
}

// Last is node's last status ("" when none was set).
func (e *Effects) Last(node string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.Statuses[node]
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

func (e *Effects) Event(_ context.Context, node, reason, _ string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.Events = append(e.Events, node+" "+reason)
}

func (e *Effects) Would(node, what, command string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	said := node + ": " + what
	if command != "" {
		said += " ### " + command
	}
	e.Said = append(e.Said, said)
}

func (e *Effects) Fence(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fences++
	if e.fences < e.FenceFrom {
		return nil
	}
	return e.FenceErr
}
func (e *Effects) Lost() error { return e.LostErr }

func (e *Effects) MarkMoved(node, part string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.Moved = append(e.Moved, node+"/"+part)
}

func (e *Effects) Timed() func() {
	began := e.Wait.Now()
	return func() {
		e.mu.Lock()
		e.Waiting += e.Wait.Since(began)
		e.mu.Unlock()
	}
}

// SteppingClock is a fake clock, at 2026-11-25 00:00 UTC, that moves on
// by step whenever something waits on it (until the test ends): time
// passes only while the code under test waits.
func SteppingClock(t *testing.T, step time.Duration) *clocktesting.FakeClock {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		for ctx.Err() == nil {
			if clk.HasWaiters() {
				clk.Step(step)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	return clk
}

// MirrorPod is the mirror pod of kubeadm's static pod comp on node cp-1,
// its image at version, Running and Ready or not.
func MirrorPod(comp, version string, ready bool) *corev1.Pod {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: comp + "-cp-1",
		Labels: map[string]string{"component": comp, "tier": "control-plane"}, Annotations: map[string]string{kubeletcompat.MirrorAnnotation: "h"}},
		Spec:   corev1.PodSpec{NodeName: "cp-1", Containers: []corev1.Container{{Name: comp, Image: "reg/library/" + comp + ":" + version}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}}}
}
