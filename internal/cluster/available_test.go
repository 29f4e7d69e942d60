package cluster

import (
	"context"
	"errors"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
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
