package drain

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubelift/kubelift/internal/agent"
)

// drainWorld is a fake API server holding node n1 and pods on it; an
// eviction deletes the pod unless refuse says a budget refuses it.
func drainWorld(t *testing.T, pods []corev1.Pod, refuse func(name string) bool) (*Drainer, *fake.Clientset) {
	t.Helper()
	objs := []runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}}
	for i := range pods {
		pods[i].Spec.NodeName = "n1"
		if pods[i].Namespace == "" {
			pods[i].Namespace = "default"
		}
		objs = append(objs, &pods[i])
	}
	c := fake.NewClientset(objs...)
	c.Resources = []*metav1.APIResourceList{{GroupVersion: "v1", APIResources: []metav1.APIResource{
		{Name: "pods/eviction", Kind: "Eviction", Group: "policy", Version: "v1"}}}}
	c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := a.(k8stesting.CreateAction)
		if !ok || a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := ca.GetObject().(*policyv1.Eviction)
		if refuse != nil && refuse(ev.Name) {
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		return true, nil, c.Tracker().Delete(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, ev.Namespace, ev.Name)
	})
	return &Drainer{Client: c, Log: slog.New(slog.DiscardHandler), Timeout: 3 * time.Second}, c
}

func owned(name string) corev1.Pod {
	yes := true
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: ktypes.UID("uid-" + name),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs", Controller: &yes}}}}
}

func drainedNode(t *testing.T, c *fake.Clientset) *corev1.Node {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDrainEvictsAndKeepsDaemonSetAndMirrorPods(t *testing.T) {
	ds := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ds", OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "ds"}}}}
	yes := true
	ds.OwnerReferences[0].Controller = &yes
	mirror := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "etcd-n1", Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "x"}}}
	done := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "job-done"}, Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}
	r, c := drainWorld(t, []corev1.Pod{owned("web"), owned("db"), ds, mirror, done}, nil)
	// The DaemonSet exists, as kubectl's filter asks for it.
	if _, err := c.AppsV1().DaemonSets("default").Create(context.Background(), &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "ds", Namespace: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r.Drain(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	left, err := c.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range left.Items {
		names = append(names, p.Name)
	}
	if got := strings.Join(names, ","); got != "ds,etcd-n1" {
		t.Errorf("pods left after the drain: %s, want ds,etcd-n1", got)
	}
	if n := drainedNode(t, c); !n.Spec.Unschedulable || n.Annotations[AnnotationCordoned] != "true" {
		t.Errorf("node after the drain: unschedulable %v, annotations %v", n.Spec.Unschedulable, n.Annotations)
	}
}

func TestDrainRefusesBarePodsBeforeCordoning(t *testing.T) {
	bare := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}
	r, c := drainWorld(t, []corev1.Pod{owned("web"), bare}, nil)
	err := r.Drain(context.Background(), "n1")
	if !errors.Is(err, ErrDrainBlocked) || !strings.Contains(err.Error(), "node n1") || !strings.Contains(err.Error(), "no controller would recreate") || !strings.Contains(err.Error(), "default/bare") {
		t.Fatalf("drain with a bare pod: %v", err)
	}
	if n := drainedNode(t, c); n.Spec.Unschedulable {
		t.Error("the node was cordoned")
	}
	if _, err := c.CoreV1().Pods("default").Get(context.Background(), "web", metav1.GetOptions{}); err != nil {
		t.Errorf("a pod was evicted before the refusal: %v", err)
	}
}

func TestDrainBlockedByBudgetUncordons(t *testing.T) {
	r, c := drainWorld(t, []corev1.Pod{owned("web"), owned("blocker")}, func(name string) bool { return name == "blocker" })
	err := r.Drain(context.Background(), "n1")
	if !errors.Is(err, ErrDrainBlocked) || !strings.Contains(err.Error(), "PodDisruptionBudget") || !strings.Contains(err.Error(), "default/blocker") || strings.Contains(err.Error(), "default/web") {
		t.Fatalf("drain refused by a budget: %v", err)
	}
	if n := drainedNode(t, c); n.Spec.Unschedulable || n.Annotations[AnnotationCordoned] != "" {
		t.Errorf("node after a blocked drain: unschedulable %v, annotations %v", n.Spec.Unschedulable, n.Annotations)
	}
}

func TestDrainLeavesAnOperatorsCordon(t *testing.T) {
	r, c := drainWorld(t, []corev1.Pod{owned("blocker")}, func(string) bool { return true })
	n := drainedNode(t, c)
	n.Spec.Unschedulable = true
	if _, err := c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r.Drain(context.Background(), "n1"); !errors.Is(err, ErrDrainBlocked) {
		t.Fatalf("drain: %v", err)
	}
	if n := drainedNode(t, c); !n.Spec.Unschedulable {
		t.Error("the operator's cordon was undone")
	}
}

func TestDrainRefusesPodsOfADaemonSetThatIsGone(t *testing.T) {
	yes := true
	orphan := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent", OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "gone", UID: "gone", Controller: &yes}}}}
	r, c := drainWorld(t, []corev1.Pod{owned("web"), orphan}, nil)
	err := r.Drain(context.Background(), "n1")
	if !errors.Is(err, ErrDrainBlocked) || !strings.Contains(err.Error(), "DaemonSet that is gone") || !strings.Contains(err.Error(), "default/agent") {
		t.Fatalf("drain with a gone DaemonSet's pod: %v", err)
	}
	if n := drainedNode(t, c); n.Spec.Unschedulable {
		t.Error("the node was cordoned")
	}
}

func TestDrainNamesPodsStillTerminating(t *testing.T) {
	r, c := drainWorld(t, []corev1.Pod{owned("slow")}, nil)
	// The eviction is accepted but the pod only starts terminating.
	c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		p, err := c.Tracker().Get(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, "default", "slow")
		if err != nil {
			return true, nil, err
		}
		pod := p.(*corev1.Pod).DeepCopy()
		now := metav1.Now()
		pod.DeletionTimestamp = &now
		return true, nil, c.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, pod, "default")
	})
	err := r.Drain(context.Background(), "n1")
	if err == nil || errors.Is(err, ErrDrainBlocked) || !strings.Contains(err.Error(), "default/slow still terminating") {
		t.Fatalf("drain of a pod that does not go: %v", err)
	}
	if n := drainedNode(t, c); n.Spec.Unschedulable {
		t.Error("the node was left cordoned")
	}
}

func TestDrainCancelledSaysSo(t *testing.T) {
	r, _ := drainWorld(t, []corev1.Pod{owned("blocker")}, func(string) bool { return true })
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	if err := r.Drain(ctx, "n1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled drain: %v", err)
	}
}

// A cordon and an uncordon made while an HA control plane's etcd changes
// leaders are made again (each is conditional on the Node as read), not
// left half done: an uncordon that failed so left the node cordoned.
func TestCordonAndUncordonThroughALeaderChange(t *testing.T) {
	r, c := drainWorld(t, nil, nil)
	leaderChanges := 0
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if leaderChanges > 0 {
			leaderChanges--
			return true, nil, apierrors.NewInternalError(errors.New("etcdserver: leader changed"))
		}
		return false, nil, nil
	})
	ctx := context.Background()
	leaderChanges = 1
	if err := r.Cordon(ctx, "n1"); err != nil {
		t.Fatalf("cordon: %v", err)
	}
	if n := drainedNode(t, c); !n.Spec.Unschedulable || n.Annotations[AnnotationCordoned] != "true" {
		t.Fatalf("after cordon: unschedulable %v, annotations %v", n.Spec.Unschedulable, n.Annotations)
	}
	leaderChanges = 2
	if err := r.Uncordon(ctx, "n1"); err != nil {
		t.Fatalf("uncordon: %v", err)
	}
	if n := drainedNode(t, c); n.Spec.Unschedulable {
		t.Error("left cordoned")
	}
}

// Agent mode's agent, a pod no controller makes, neither refuses the
// drain nor is evicted: it runs the node's steps, and goes at the run's
// end.
func TestDrainLeavesTheAgent(t *testing.T) {
	a := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kubelift-agent-1", Namespace: agent.Namespace}}
	r, c := drainWorld(t, []corev1.Pod{owned("web"), a}, nil)
	if err := r.Drain(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Pods(agent.Namespace).Get(context.Background(), a.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the agent after the drain: %v", err)
	}
	if _, err := c.CoreV1().Pods("default").Get(context.Background(), "web", metav1.GetOptions{}); err == nil {
		t.Error("web was not evicted")
	}
}
