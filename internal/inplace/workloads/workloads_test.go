package workloads

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func pod(name, node string, selector map[string]string) corev1.Pod {
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: corev1.PodSpec{NodeName: node, NodeSelector: selector}}
}

// The labels a node lacks for its pods' nodeSelectors are wanted back;
// two pods wanting one label with two values are refused, naming the
// node, the label and both values; a dry run says the patch and makes
// none.
func TestLabelsWanted(t *testing.T) {
	nodes := []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Labels: map[string]string{"zone": "a"}}}}
	want, err := LabelsWanted(nodes, []corev1.Pod{
		pod("web", "worker-1", map[string]string{"zone": "a", "disk": "ssd"}),
		pod("db", "worker-1", map[string]string{"disk": "ssd"}),
		pod("elsewhere", "worker-9", map[string]string{"gpu": "yes"}),
	})
	if err != nil || !reflect.DeepEqual(want, map[string]map[string]string{"worker-1": {"disk": "ssd"}}) {
		t.Fatalf("wanted %v, %v", want, err)
	}
	_, err = LabelsWanted(nodes, []corev1.Pod{pod("web", "worker-1", map[string]string{"disk": "ssd"}), pod("db", "worker-1", map[string]string{"disk": "hdd"})})
	if err == nil || !strings.Contains(err.Error(), "node worker-1: pods need label disk both as") {
		t.Errorf("a clash: %v", err)
	}
	client := fake.NewClientset(&nodes[0])
	var said []string
	p := Patcher{Client: client, Log: slog.New(slog.DiscardHandler), Would: func(node, what, command string) { said = append(said, node+": "+what+" "+command) }}
	restored, err := p.RestoreLabels(context.Background(), want)
	if err != nil || len(restored) != 1 || restored[0] != "worker-1: disk=ssd" || len(said) != 1 || !strings.Contains(said[0], `{"metadata":{"labels":{"disk":"ssd"}}}`) {
		t.Errorf("dry run: restored %v, said %v, %v", restored, said, err)
	}
	for _, a := range client.Actions() {
		if a.GetVerb() == "patch" {
			t.Errorf("a dry run patched: %v", a)
		}
	}
}

// The tolerations and the labels are added through etcd changing leader
// (the API server's 500 "etcdserver: leader changed"), once each: a
// tolerations patch whose answer was lost had applied, and the one made
// again adds only what the pod still lacks.
func TestTolerationsAndLabelsAddedThroughALeaderChange(t *testing.T) {
	ctx := context.Background()
	web := pod("web", "worker-1", nil)
	web.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
	bare := pod("bare", "worker-1", nil)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}}
	client := fake.NewClientset(&web, &bare, node)
	leaderChanged := apierrors.NewInternalError(errors.New("etcdserver: leader changed"))
	answered := map[string]bool{}
	client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		name := a.(k8stesting.PatchAction).GetName()
		if answered[name] {
			return false, nil, nil
		}
		answered[name] = true
		// Applied, and the answer lost on the way back.
		if _, _, err := k8stesting.ObjectReaction(client.Tracker())(a); err != nil {
			t.Fatalf("patch %s: %v", name, err)
		}
		return true, nil, leaderChanged
	})
	nodePatches := 0
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if nodePatches++; nodePatches == 1 {
			return true, nil, leaderChanged
		}
		return false, nil, nil
	})
	p := Patcher{Client: client, Log: slog.New(slog.DiscardHandler), Event: func(context.Context, string, string, string) {}}
	patched, err := p.AddTolerations(ctx, []corev1.Pod{web, bare})
	if err != nil || len(patched) != 2 {
		t.Fatalf("tolerations: patched %v, %v", patched, err)
	}
	for _, name := range []string{"web", "bare"} {
		got, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		count := map[string]int{}
		for _, tol := range got.Spec.Tolerations {
			count[tol.Key]++
		}
		if count[corev1.TaintNodeNotReady] != 1 || count[corev1.TaintNodeUnreachable] != 1 {
			t.Errorf("pod %s tolerations %v: want one not-ready and one unreachable", name, got.Spec.Tolerations)
		}
	}
	if _, err := p.RestoreLabels(ctx, map[string]map[string]string{"worker-1": {"disk": "ssd"}}); err != nil {
		t.Fatalf("labels: %v", err)
	}
	if got, err := client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{}); err != nil || got.Labels["disk"] != "ssd" {
		t.Errorf("node labels after the restore: %v, %v", got.Labels, err)
	}
}
