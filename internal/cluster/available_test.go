package cluster

import (
	"context"
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestListAvailableOrdersVersionsNumerically(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	for _, v := range []string{"v1.31.10", "v1.31.4", "v1.30.14", "v1.31.9"} {
		if _, err := RecordAvailable(ctx, c, &Available{KubernetesVersion: v, BundleDigest: "sha256:" + v, Manifest: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ListAvailable(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, a := range got {
		order = append(order, a.KubernetesVersion)
	}
	want := []string{"v1.30.14", "v1.31.4", "v1.31.9", "v1.31.10"}
	if len(order) != len(want) {
		t.Fatalf("got %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("got %v, want %v", order, want)
		}
	}
}

func TestRecordAvailableIsImmutable(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	a := &Available{KubernetesVersion: "v1.31.4", BundleDigest: "sha256:abc", Manifest: []byte("{}")}
	if _, err := RecordAvailable(ctx, c, a); err != nil {
		t.Fatal(err)
	}
	if _, err := RecordAvailable(ctx, c, a); err != nil {
		t.Fatalf("the same record again: %v", err)
	}
	b := *a
	b.Registry = "elsewhere:5000"
	if _, err := RecordAvailable(ctx, c, &b); !errors.Is(err, ErrRecordConflict) {
		t.Fatalf("other content under the same name: %v, want ErrRecordConflict", err)
	}
}

// The available-release record is written through etcd changing leader:
// a create whose answer was lost had applied, and the one made again
// finds the same record there (no ErrRecordConflict); a read that failed
// is made again.
func TestRecordAvailableThroughALeaderChange(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	leaderChanged := apierrors.NewInternalError(errors.New("etcdserver: leader changed"))
	fail := map[string]int{"create": 1, "get": 1}
	c.PrependReactor("*", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if fail[a.GetVerb()] == 0 {
			return false, nil, nil
		}
		fail[a.GetVerb()]--
		if a.GetVerb() == "create" {
			// Applied, and the answer lost on the way back.
			if _, _, err := k8stesting.ObjectReaction(c.Tracker())(a); err != nil {
				t.Fatalf("create: %v", err)
			}
		}
		return true, nil, leaderChanged
	})
	a := &Available{KubernetesVersion: "v1.31.4", BundleDigest: "sha256:abc", Manifest: []byte("{}")}
	cm, err := RecordAvailable(ctx, c, a)
	if err != nil || cm.Name != RecordName("v1.31.4", "sha256:abc") {
		t.Fatalf("record through a leader change: %v, %v", cm, err)
	}
	if fail["create"]+fail["get"] != 0 {
		t.Errorf("failures not reached: %v", fail)
	}
}
