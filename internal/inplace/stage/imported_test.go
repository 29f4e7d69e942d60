package stage

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/bundletest"
	"github.com/kubelift/kubelift/internal/importer"
	"github.com/kubelift/kubelift/internal/registry"
)

// Staging right after import: the pushed binaries are the release's
// record (each file at its bundle path, the hops' too), nodes may pull
// them and this machine reads the file; with nothing pushed, the file
// alone.
func TestImported(t *testing.T) {
	world, dir := bundletest.New(t), t.TempDir()
	if _, err := bundle.GenerateKey(filepath.Join(dir, "team")); err != nil {
		t.Fatal(err)
	}
	key, err := bundle.LoadPrivateKey(filepath.Join(dir, "team.key"))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := bundle.LoadPublicKey(filepath.Join(dir, "team.pub"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "b.tar")
	if _, err := bundle.Create(context.Background(), &bundle.CreateOptions{Catalog: world.Catalog, KubernetesVersion: bundletest.Version, Arches: []string{"amd64"},
		CacheDir: filepath.Join(dir, "cache"), SignKey: key, Output: out, From: "v1.29"}); err != nil {
		t.Fatal(err)
	}
	v, err := bundle.Open(context.Background(), out, bundle.Trust{Key: pub})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if len(v.Manifest.Hops) == 0 {
		t.Fatal("the bundle has no hops to check")
	}
	hop := v.Manifest.Hops[0].Files[0]
	kubelet := v.Manifest.Files[0]
	files := []importer.FileResult{
		{Name: kubelet.Name, Arch: kubelet.Arch, SHA256: kubelet.SHA256, Size: kubelet.Size, Artifact: "r.local/library/files/" + kubelet.Name + "@sha256:" + kubelet.SHA256},
		{Name: hop.Name, Arch: hop.Arch, SHA256: hop.SHA256, Size: hop.Size, Artifact: "r.local/library/files/" + hop.Name + "@sha256:" + hop.SHA256},
	}
	rel, src, err := Imported(v, bundletest.Version, files, registry.Access{})
	if err != nil {
		t.Fatal(err)
	}
	if _, pulls := src.(NodePuller); !pulls {
		t.Errorf("source %T: nodes cannot pull what import pushed", src)
	}
	if rel.Record == nil || len(rel.Record.Files) != 2 || rel.Record.Files[0].Path != kubelet.Path || rel.Record.Files[1].Path != hop.Path {
		t.Fatalf("record %+v, want %s and %s at their bundle paths", rel.Record, kubelet.Path, hop.Path)
	}
	if _, artifact, ok := rel.File(kubelet.Name, kubelet.Arch); !ok || artifact != files[0].Artifact {
		t.Errorf("%s's artifact %q, want %q", kubelet.Name, artifact, files[0].Artifact)
	}
	for _, h := range rel.Hops {
		if h.Record != rel.Record {
			t.Errorf("hop %s has its own record", h.Version)
		}
	}
	rel, src, err = Imported(v, bundletest.Version, nil, registry.Access{})
	if err != nil || rel.Record != nil {
		t.Fatalf("nothing pushed: %+v, %v", rel.Record, err)
	}
	if _, ok := src.(BundleSource); !ok {
		t.Errorf("nothing pushed: source %T, want the bundle file", src)
	}
}
