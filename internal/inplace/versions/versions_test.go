package versions

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/preflight/preflighttest"
)

func TestVersions(t *testing.T) {
	cat, err := catalog.Default()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n1, n2 := preflighttest.Node("cp-1", "control-plane"), preflighttest.Node("worker-1", "worker")
	c := fake.NewClientset(&n1, &n2)
	c.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: "v1.30.14"}
	for _, v := range []string{"v1.31.4", "v1.32.4", "v1.30.2"} {
		if _, err := cluster.RecordAvailable(ctx, c, &cluster.Available{KubernetesVersion: v, BundleDigest: "sha256:" + v, Manifest: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	states := func() map[string]State {
		list, err := List(ctx, c, cat)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]State{}
		for _, s := range list {
			m[s.Version] = s
		}
		return m
	}
	got := states()
	for v, want := range map[string]string{"v1.30.14": StateActive, "v1.31.4": StateAvailable, "v1.32.4": StateImported,
		"v1.28.15": StateUnavailable, "v1.30.2": StateAvailable /* a patch downgrade the catalog allows */} {
		if got[v].State != want {
			t.Errorf("%s: %s, want %s", v, got[v].State, want)
		}
	}
	if !got["v1.30.14"].Target || got["v1.30.14"].Nodes != 2 || got["v1.31.4"].Imported == "" {
		t.Errorf("states %+v", got)
	}
	// Mid-upgrade: the API server and one kubelet at v1.31.4.
	c.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: "v1.31.4"}
	n2.Status.NodeInfo.KubeletVersion = "v1.31.4"
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, &n2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got = states()
	if got["v1.30.14"].State != StatePartial || got["v1.31.4"].State != StatePartial || !got["v1.31.4"].Target || got["v1.30.14"].Target {
		t.Errorf("mid-upgrade: %+v", got)
	}
}
