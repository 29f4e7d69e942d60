package workloads

import (
	"context"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
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
