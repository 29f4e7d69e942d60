package sandbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kubelift/kubelift/test/env/sandbox"
)

// A kubelet that refuses a pod for NodeAffinity because its copy of the
// Node lacks a label gets the pod again once it has the label; one that
// never gets it refuses selectingPodTries pods and CreateSelectingPod
// says so. The refusals are made on purpose here: each pod is bound to
// the node by name, past the scheduler, with a selector the node lacks.
func TestCreateSelectingPodAfterRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	m := node(t, "worker-4")
	ns := "refusals"
	if err := sandbox.EnsureNamespace(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	label := "kubelift.io/refusal-test"
	// setLabel runs in the test's cleanup too, after ctx is cancelled.
	setLabel := func(value string) {
		body := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, label, value)
		if _, err := client.CoreV1().Nodes().Patch(context.Background(), m.Name, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
			t.Fatalf("label %s on %s: %v", value, m.Name, err)
		}
	}
	t.Cleanup(func() { setLabel("null") })
	pod := func(name, value string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: sb.PodSpec(sandbox.NotReadyTolerations())}
		p.Spec.NodeName = m.Name
		p.Spec.NodeSelector = map[string]string{label: value}
		return p
	}

	// A watch on ns counts, per pod name, the pods (by UID) the kubelet
	// failed with reason NodeAffinity, and closes firstRefusal[name] at
	// the first.
	var mu sync.Mutex
	refused := map[string]map[types.UID]bool{}
	w, err := client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	firstRefusal := map[string]chan struct{}{"labelled-late": make(chan struct{}), "never-labelled": make(chan struct{})}
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted || p.Status.Phase != corev1.PodFailed || p.Status.Reason != "NodeAffinity" {
				continue
			}
			mu.Lock()
			if refused[p.Name] == nil {
				refused[p.Name] = map[types.UID]bool{}
				if ch := firstRefusal[p.Name]; ch != nil {
					close(ch)
				}
			}
			refused[p.Name][p.UID] = true
			mu.Unlock()
		}
	}()
	count := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return len(refused[name])
	}

	// Labelled after the first refusal: a pod created again runs.
	done := make(chan error, 1)
	go func() { done <- sandbox.CreateSelectingPod(ctx, client, pod("labelled-late", "yes"), 3*time.Minute) }()
	select {
	case <-firstRefusal["labelled-late"]:
	case err := <-done:
		t.Fatalf("CreateSelectingPod returned %v before the kubelet refused the pod", err)
	case <-ctx.Done():
		t.Fatal("the kubelet never refused the pod whose selector its node lacks")
	}
	setLabel(`"yes"`)
	if err := <-done; err != nil {
		t.Fatalf("after the label was set: %v", err)
	}
	got, err := client.CoreV1().Pods(ns).Get(ctx, "labelled-late", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodRunning || got.Spec.NodeName != m.Name {
		t.Errorf("pod labelled-late is %s on %q, want Running on %s", got.Status.Phase, got.Spec.NodeName, m.Name)
	}
	if n := count("labelled-late"); n < 1 {
		t.Errorf("pod labelled-late refused %d times, want at least once", n)
	}

	// Never labelled: refused at every try, and the error says so.
	err = sandbox.CreateSelectingPod(ctx, client, pod("never-labelled", "no"), 3*time.Minute)
	if err == nil || !strings.Contains(err.Error(), "refused by the kubelet on "+m.Name+" 5 times") {
		t.Fatalf("CreateSelectingPod of a pod its node never matches: %v, want refused 5 times", err)
	}
	// The watch may trail the API by a moment.
	waitFor(t, "5 refused never-labelled pods seen", func() (bool, error) { return count("never-labelled") == 5, nil })
}
