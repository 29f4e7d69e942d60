package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/test/env/internet"
	"github.com/kubelift/kubelift/test/env/kube"
)

// TestImportRecordsVersionInCluster imports with a kubeconfig and reads the
// record back from a real kube-apiserver (etcd from Debian).
func TestImportRecordsVersionInCluster(t *testing.T) {
	ctx := context.Background()
	bin, err := kube.Binaries(ctx, "v1.31.4", "kube-apiserver")
	if err != nil {
		t.Fatal(err)
	}
	w := startWorld(t, internet.ImageShape{Arches: []string{"amd64"}, BaseBytes: 64 << 10, UniqueBytes: 16 << 10})
	api, err := kube.StartAPIServer(ctx, filepath.Join(w.dir, "apiserver"), bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Stop)
	key, pub := w.keygen(t, "team")
	out := filepath.Join(w.dir, "b.tar")
	if r := w.create(t, key, out, filepath.Join(w.dir, "cache")); r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	priv, err := internet.StartRegistry(ctx, filepath.Join(w.dir, "private"), internet.RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(priv.Stop)
	args := []string{"import", out, "--key", pub, "--domain", priv.Host, "--namespace", "library", "--plain-http", "-q", "--kubeconfig", api.Kubeconfig, "-o", "json"}
	r := mustRun(t, "upgrade", args...)
	var res struct {
		Recorded string
		Images   []struct{ Target, Digest string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Recorded, "kubelift-available-v1.31.4-") {
		t.Fatalf("recorded %q", res.Recorded)
	}

	client, err := cluster.Client(api.Kubeconfig, "")
	if err != nil {
		t.Fatal(err)
	}
	cm, err := client.CoreV1().ConfigMaps("kube-system").Get(ctx, res.Recorded, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Immutable == nil || !*cm.Immutable || cm.Labels[cluster.LabelVersion] != "v1.31.4" {
		t.Errorf("configmap: immutable %v labels %v", cm.Immutable, cm.Labels)
	}
	list, err := cluster.ListAvailable(ctx, client)
	if err != nil || len(list) != 1 {
		t.Fatalf("ListAvailable: %v, %d", err, len(list))
	}
	a := list[0]
	if len(a.Images) != 7 || len(a.Files) != 9 || len(a.Signature) == 0 || !strings.Contains(string(a.Manifest), `"kubernetesVersion": "v1.31.4"`) {
		t.Errorf("record: %d images, %d files, sig %d bytes", len(a.Images), len(a.Files), len(a.Signature))
	}
	for i, im := range a.Images {
		if im.Target != res.Images[i].Target || im.Digest != res.Images[i].Digest {
			t.Errorf("record image %d: %+v", i, im)
		}
	}
	for _, f := range a.Files {
		if len(f.SHA256) != 64 || f.Size == 0 {
			t.Errorf("record file %+v", f)
		}
	}
	// Importing again is idempotent: same record, no error.
	r = mustRun(t, "upgrade", args...)
	if !strings.Contains(r.stdout, res.Recorded) {
		t.Errorf("re-import: %s", r.stdout)
	}
	// A different record under the same name is refused, never overwritten.
	changed := *a
	changed.Registry = "elsewhere.corp"
	if _, err := cluster.RecordAvailable(ctx, client, &changed); !errors.Is(err, cluster.ErrRecordConflict) {
		t.Errorf("conflicting record: %v", err)
	}
	// A wrong kubeconfig is a clear error naming it, before anything is pushed.
	r = run(t, "upgrade", "import", out, "--key", pub, "--domain", priv.Host, "--plain-http", "-q", "--kubeconfig", "/nonexistent/kubeconfig")
	if r.code == 0 || !strings.Contains(r.stderr, "/nonexistent/kubeconfig") {
		t.Errorf("bad kubeconfig: exit %d: %s", r.code, r.stderr)
	}
}
