package runbook

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubelift/kubelift/internal/inplace/driver/drivertest"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/waiter"
)

// The workloads step passes over a pod gone since the plan listed it (a
// rollout replaced it) and patches the others.
func TestWorkloadsPassOverAPodGone(t *testing.T) {
	pod := func(name string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}, Spec: corev1.PodSpec{NodeName: "worker-1"}}
	}
	here := pod("here")
	client := fake.NewClientset(&here)
	r := &upgradeRun{client: client, log: slog.New(slog.DiscardHandler), res: &ApplyResult{}, state: &record.Upgrade{},
		opts: ApplyOptions{Plan: preflight.PlanOptions{Now: time.Now}}, view: &preflight.View{Pods: []corev1.Pod{pod("gone"), here}}}
	if err := r.workloadsStep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(r.res.Patched) != 1 || r.res.Patched[0] != "shop/here" {
		t.Errorf("patched %v, want shop/here", r.res.Patched)
	}
	got, _ := client.CoreV1().Pods("shop").Get(context.Background(), "here", metav1.GetOptions{})
	if len(got.Spec.Tolerations) != 2 {
		t.Errorf("tolerations %v", got.Spec.Tolerations)
	}
}

// podsOn waits out an API server that refuses connections (restarting),
// and fails at once on one that answers with a refusal.
func TestPodsOnWaitsForARestartingAPIServer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fail    error
		wantErr bool
	}{
		{"connection refused, twice", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, false},
		{"forbidden", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("no")), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "p", UID: "u"}, Spec: corev1.PodSpec{NodeName: "cp-1"}})
			calls := 0
			client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				calls++
				if calls <= 2 {
					return true, nil, tc.fail
				}
				return false, nil, nil
			})
			r := &upgradeRun{client: client, opts: ApplyOptions{ReadyTimeout: time.Minute}, wait: waiter.Waiter{Clock: drivertest.SteppingClock(t, time.Second)}}
			pods, err := r.checker().PodsOn(context.Background(), "cp-1")
			if tc.wantErr {
				if err == nil || calls != 1 {
					t.Fatalf("podsOn: %v after %d calls, want an error at once", err, calls)
				}
				return
			}
			if err != nil || len(pods) != 1 || calls != 3 {
				t.Fatalf("podsOn: %v, %d pods after %d calls", err, len(pods), calls)
			}
		})
	}
}
