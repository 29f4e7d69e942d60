package record

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubelift/kubelift/internal/inplace/release"
)

func verbs(c *fake.Clientset) []string {
	var out []string
	for _, a := range c.Actions() {
		out = append(out, a.GetVerb())
	}
	return out
}

func TestStateWriterPutsWithoutReading(t *testing.T) {
	ctx := context.Background()
	c := fake.NewSimpleClientset()
	w := &Writer{Client: c}
	for i, status := range []string{NodePending, NodeDone, NodeDone} {
		s := &Upgrade{From: "v1.30.14", To: "v1.31.4", State: StateUpgradingKubelets}
		s.Node("worker-1", release.RoleWorker).Status = status
		if err := w.Write(ctx, func() ([]byte, error) { return json.Marshal(s) }); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	// The first write finds nothing and creates; the others only update.
	if got, want := verbs(c), []string{"get", "create", "update", "update"}; !slices.Equal(got, want) {
		t.Errorf("requests %v, want %v", got, want)
	}
	st, err := Read(ctx, c)
	if err != nil || st == nil || st.Nodes[0].Status != NodeDone {
		t.Fatalf("read back %+v, %v", st, err)
	}

	// Someone else wrote in between: one conflict, then a read and a write.
	c.ClearActions()
	conflicts := 1
	c.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, Name, nil)
		}
		return false, nil, nil
	})
	if err := w.Write(ctx, func() ([]byte, error) { return json.Marshal(&Upgrade{State: StateComplete}) }); err != nil {
		t.Fatal(err)
	}
	if got, want := verbs(c), []string{"update", "get", "update"}; !slices.Equal(got, want) {
		t.Errorf("after a conflict: requests %v, want %v", got, want)
	}
	if st, _ := Read(ctx, c); st.State != StateComplete {
		t.Errorf("state %s after the retried write", st.State)
	}
}
