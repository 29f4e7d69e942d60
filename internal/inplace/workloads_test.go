package inplace

import (
	"context"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The workloads step passes over a pod gone since the plan listed it (a
// rollout replaced it) and patches the others.
func TestWorkloadsPassOverAPodGone(t *testing.T) {
	pod := func(name string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}, Spec: corev1.PodSpec{NodeName: "worker-1"}}
	}
	here := pod("here")
	client := fake.NewClientset(&here)
	r := &applyRun{client: client, log: slog.New(slog.DiscardHandler), res: &ApplyResult{}, state: &UpgradeState{},
		opts: ApplyOptions{Plan: PlanOptions{Now: time.Now}}, view: &clusterView{pods: []corev1.Pod{pod("gone"), here}}}
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
