package fleet

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/inplace/record"
)

func node(name, v string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: v}}}
}

// Every cluster has its row, sorted; one that cannot be reached, or
// whose Nodes say what does not parse, says why in its own.
func TestSurvey(t *testing.T) {
	ctx := context.Background()
	prod := fake.NewSimpleClientset(node("cp-1", "v1.31.14"), node("w-1", "v1.30.14"), node("w-2", "v1.31.14"))
	updated := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	if err := record.Write(ctx, prod, &record.Upgrade{From: "v1.30.14", To: "v1.31.14", State: record.StateUpgradingKubelets, Updated: updated}); err != nil {
		t.Fatal(err)
	}
	clusters := map[string]kubernetes.Interface{
		"prod":    prod,
		"staging": fake.NewSimpleClientset(node("cp-1", "v1.31.14")),
		"bad":     fake.NewSimpleClientset(node("cp-1", "1.31; rm -rf /")),
	}
	rows := Survey(ctx, []string{"staging", "prod", "gone", "bad"}, func(name string) (kubernetes.Interface, error) {
		if c, ok := clusters[name]; ok {
			return c, nil
		}
		return nil, errors.New("dial tcp 10.0.0.9:6443: connect: no route to host")
	})
	want := []Row{
		{Context: "bad", Nodes: 1, Error: `node cp-1: kubeletVersion "1.31; rm -rf /": "1.31; rm -rf /" is not a version (want vMAJOR.MINOR.PATCH)`},
		{Context: "gone", Error: "dial tcp 10.0.0.9:6443: connect: no route to host"},
		{Context: "prod", Kubelets: "v1.30.14 to v1.31.14", Nodes: 3, Target: "v1.31.14", State: record.StateUpgradingKubelets, LastRun: updated},
		{Context: "staging", Kubelets: "v1.31.14", Nodes: 1},
	}
	if len(rows) != len(want) {
		t.Fatalf("rows %+v", rows)
	}
	for i := range want {
		rows[i].APIServer = "" // the fake's discovery
		if rows[i] != want[i] {
			t.Errorf("row %d: %+v, want %+v", i, rows[i], want[i])
		}
	}
}
