package registry

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// A file pushed as an artifact comes back whole: its manifest names the
// artifact's type and the layer's, its one layer is the file as is (the
// digest its sha256), with the annotations given; a sum the file does not
// have is refused by the registry.
func TestPushFile(t *testing.T) {
	tr := newTestRegistry(t)
	path := filepath.Join(t.TempDir(), "etcd-snapshot.db")
	data := []byte(strings.Repeat("etcd page\n", 4096))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := fmt.Sprintf("%x", sha256.Sum256(data))
	art := Artifact{Type: "application/vnd.kubelift.etcd-snapshot.v1", LayerType: "application/vnd.etcd.snapshot.v1",
		Annotations: map[string]string{"org.opencontainers.image.title": "etcd-snapshot.db"}}
	ref := tr.host + "/lib/kubelift-etcd-snapshot:cp-1-20261202"
	a := Access{Insecure: []string{tr.host}}
	d, err := a.PushFile(context.Background(), ref, path, sum, art)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := img.Digest(); got.String() != d {
		t.Errorf("the tag is %s, PushFile said %s", got, d)
	}
	if string(m.Config.MediaType) != art.Type || len(m.Layers) != 1 || string(m.Layers[0].MediaType) != art.LayerType ||
		m.Layers[0].Digest.Hex != sum || m.Layers[0].Size != int64(len(data)) || m.Annotations["org.opencontainers.image.title"] != "etcd-snapshot.db" ||
		m.Layers[0].Annotations["org.opencontainers.image.title"] != "etcd-snapshot.db" {
		t.Errorf("manifest %+v", m)
	}
	l, err := img.LayerByDigest(m.Layers[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(got) != string(data) {
		t.Errorf("the layer: %d bytes (%v), want the file's %d", len(got), err, len(data))
	}

	if _, err := a.PushFile(context.Background(), tr.host+"/lib/kubelift-etcd-snapshot:changed", path, strings.Repeat("0", 64), art); err == nil {
		t.Error("a sum the file does not have was pushed")
	}
	if _, err := a.PushFile(context.Background(), tr.host+"/lib/kubelift-etcd-snapshot:bad", path, "not-hex", art); err == nil || !strings.Contains(err.Error(), "not-hex") {
		t.Errorf("a sum that is no sha256: %v", err)
	}
}
