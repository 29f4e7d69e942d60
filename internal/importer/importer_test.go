package importer

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/bundletest"
	"github.com/kubelift/kubelift/internal/catalog"
)

type env struct {
	world  *bundletest.World
	target string // host:port of the private registry
	pub    *ecdsa.PublicKey
	key    *ecdsa.PrivateKey
	dir    string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{world: bundletest.New(t), dir: t.TempDir()}
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	e.target = u.Host
	if _, err := bundle.GenerateKey(filepath.Join(e.dir, "team")); err != nil {
		t.Fatal(err)
	}
	e.key, _ = bundle.LoadPrivateKey(filepath.Join(e.dir, "team.key"))
	e.pub, _ = bundle.LoadPublicKey(filepath.Join(e.dir, "team.pub"))
	return e
}

func (e *env) bundle(t *testing.T, name string, mod func(*bundle.CreateOptions)) string {
	t.Helper()
	out := filepath.Join(e.dir, name)
	opts := &bundle.CreateOptions{Catalog: e.world.Catalog, KubernetesVersion: bundletest.Version, Arches: []string{"amd64"},
		CacheDir: filepath.Join(e.dir, "cache"), SignKey: e.key, Output: out}
	if mod != nil {
		mod(opts)
	}
	if _, err := bundle.Create(context.Background(), opts); err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return out
}

func (e *env) imp(t *testing.T, file string, mod func(*Options)) (*Result, error) {
	opts := Options{Bundle: file, Trust: bundle.Trust{Key: e.pub}, Domain: e.target, Namespace: "library", Jobs: 3}
	if mod != nil {
		mod(&opts)
	}
	return Import(context.Background(), opts)
}

func (e *env) resolve(t *testing.T, ref string) string {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	d, err := remote.Head(r)
	if err != nil {
		return ""
	}
	return d.Digest.String()
}

func TestImportPushesKeepingDigests(t *testing.T) {
	e := newEnv(t)
	file := e.bundle(t, "b.tar", nil)

	// A dry run contacts the registry and changes nothing.
	res, err := e.imp(t, file, func(o *Options) { o.DryRun = true })
	if err != nil {
		t.Fatal(err)
	}
	if res.UploadBytes == 0 || res.Images[0].Action != "would push" {
		t.Fatalf("dry run: %+v", res)
	}
	reg, _ := name.NewRegistry(e.target)
	if repos, _ := remote.Catalog(context.Background(), reg); len(repos) != 0 {
		t.Fatalf("dry run created %v", repos)
	}

	res, err = e.imp(t, file, nil)
	if err != nil {
		t.Fatal(err)
	}
	byRef := map[string]ImageResult{}
	mounted := 0
	for _, r := range res.Images {
		byRef[r.Ref] = r
		mounted += r.Mounted
	}
	api := byRef[e.world.Registry+"/kube-apiserver:v1.31.4"]
	if api.Target != e.target+"/library/kube-apiserver:v1.31.4" || !api.DigestKept || api.Action != "pushed" {
		t.Errorf("apiserver: %+v", api)
	}
	if got := e.resolve(t, api.Target); got != e.world.Digests[api.Ref] {
		t.Errorf("%s resolves to %s, upstream %s", api.Target, got, e.world.Digests[api.Ref])
	}
	// The shared base layer is uploaded once and mounted into the others.
	if mounted != 2 {
		t.Errorf("%d mounts, want 2 (the shared base into two more repositories)", mounted)
	}
	// coredns: the bundle holds 1 of 3 platforms, so its amd64 manifest is tagged.
	dns := byRef[e.world.Registry+"/coredns/coredns:v1.11.3"]
	if dns.DigestKept || !strings.Contains(dns.Note, "only linux/amd64 of the upstream multi-arch index") || dns.Target != e.target+"/library/coredns:v1.11.3" {
		t.Errorf("coredns: %+v", dns)
	}
	if got := e.resolve(t, dns.Target); got != dns.Digest {
		t.Errorf("coredns resolves to %s, want %s", got, dns.Digest)
	}

	// Importing again sends nothing.
	res, err = e.imp(t, file, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Images {
		if r.Action != "present" || r.Uploaded+r.Mounted != 0 {
			t.Errorf("re-import %s: %+v", r.Ref, r)
		}
	}
	if res.UploadBytes != 0 {
		t.Errorf("re-import uploads %d bytes", res.UploadBytes)
	}
}

func TestImportReportsEveryImage(t *testing.T) {
	e := newEnv(t)
	file := e.bundle(t, "b.tar", nil)
	var buf bytes.Buffer
	res, err := e.imp(t, file, func(o *Options) { o.Log = slog.New(slog.NewTextHandler(&buf, nil)) })
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Images {
		if n := strings.Count(buf.String(), "target="+r.Target+" "); n != 1 {
			t.Errorf("%s reported done %d times:\n%s", r.Target, n, buf.String())
		}
	}
}

func TestImportAllPlatformsKeepsIndexDigest(t *testing.T) {
	e := newEnv(t)
	file := e.bundle(t, "all.tar", func(o *bundle.CreateOptions) { o.AllPlatforms = true })
	res, err := e.imp(t, file, func(o *Options) { o.Namespace = "" })
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Images {
		if !r.DigestKept || r.Note != "" {
			t.Errorf("%s: %+v", r.Ref, r)
		}
	}
	dnsRef := e.world.Registry + "/coredns/coredns:v1.11.3"
	if got := e.resolve(t, e.target+"/coredns:v1.11.3"); got != e.world.Digests[dnsRef] {
		t.Errorf("index resolves to %s, upstream %s", got, e.world.Digests[dnsRef])
	}
}

func TestImportSubsetIndex(t *testing.T) {
	e := newEnv(t)
	cat := fmt.Sprintf("schemaVersion: 1\narches: [amd64, arm64]\nkubeletHashEras: [{era: name-image, from: v1.31.0}]\nversions:\n  - version: v1.31.4\n    kubeletHashEra: name-image\n    upgradeFrom: [v1.30]\n    downgradeTo: []\n    removedKubeletFlags: []\n    removedAPIs: []\n    files: []\n    images: [%s/coredns/coredns:v1.11.3]\n", e.world.Registry)
	c, err := catalog.Parse("dns.yaml", []byte(cat))
	if err != nil {
		t.Fatal(err)
	}
	file := e.bundle(t, "two.tar", func(o *bundle.CreateOptions) { o.Catalog = c; o.Arches = []string{"amd64", "arm64"} })
	res, err := e.imp(t, file, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := res.Images[0]
	if r.DigestKept || !strings.Contains(r.Note, "linux/amd64, linux/arm64") || !strings.Contains(r.Note, "a new digest") {
		t.Errorf("subset: %+v", r)
	}
	if got := e.resolve(t, r.Target); got != r.Digest {
		t.Errorf("subset index resolves to %s, want %s", got, r.Digest)
	}
}

func TestImportRejectsBeforePushing(t *testing.T) {
	e := newEnv(t)
	file := e.bundle(t, "b.tar", nil)
	_, otherPub, _ := otherKey(t, e.dir)
	_, err := e.imp(t, file, func(o *Options) { o.Trust = bundle.Trust{Key: otherPub} })
	if !errors.Is(err, bundle.ErrWrongKey) {
		t.Fatalf("wrong key: %v", err)
	}
	reg, _ := name.NewRegistry(e.target)
	if repos, _ := remote.Catalog(context.Background(), reg); len(repos) != 0 {
		t.Fatalf("a rejected bundle pushed %v", repos)
	}
}

func otherKey(t *testing.T, dir string) (*ecdsa.PrivateKey, *ecdsa.PublicKey, error) {
	if _, err := bundle.GenerateKey(filepath.Join(dir, "other")); err != nil {
		t.Fatal(err)
	}
	k, _ := bundle.LoadPrivateKey(filepath.Join(dir, "other.key"))
	p, _ := bundle.LoadPublicKey(filepath.Join(dir, "other.pub"))
	return k, p, nil
}

func TestImportNameConflict(t *testing.T) {
	e := newEnv(t)
	// Another repository whose last element is also kube-proxy.
	src, _ := name.ParseReference(e.world.Registry + "/kube-proxy:v1.31.4")
	img, err := remote.Image(src)
	if err != nil {
		t.Fatal(err)
	}
	dup, _ := name.ParseReference(e.world.Registry + "/team/kube-proxy:v1.31.4")
	if err := remote.Write(dup, img); err != nil {
		t.Fatal(err)
	}
	file := e.bundle(t, "b.tar", func(o *bundle.CreateOptions) { o.ExtraImages = []string{dup.String()} })
	if _, err := e.imp(t, file, nil); err == nil || !strings.Contains(err.Error(), "--keep-path") {
		t.Fatalf("conflict: %v", err)
	}
	res, err := e.imp(t, file, func(o *Options) { o.KeepPath = true })
	if err != nil {
		t.Fatal(err)
	}
	if res.Images[len(res.Images)-1].Target != e.target+"/library/team/kube-proxy:v1.31.4" {
		t.Errorf("keep-path target %s", res.Images[len(res.Images)-1].Target)
	}
}

func TestTargetFor(t *testing.T) {
	for _, tc := range []struct {
		ref, domain, ns string
		keep            bool
		want            string
	}{
		{"registry.k8s.io/coredns/coredns:v1.11.3", "registry.corp:5000", "library", false, "registry.corp:5000/library/coredns:v1.11.3"},
		{"registry.k8s.io/coredns/coredns:v1.11.3", "registry.corp:5000", "library", true, "registry.corp:5000/library/coredns/coredns:v1.11.3"},
		{"registry.k8s.io/pause:3.10", "registry.corp", "", false, "registry.corp/pause:3.10"},
		{"registry.k8s.io/pause:3.10", "registry.corp", "a/b/", false, "registry.corp/a/b/pause:3.10"},
		{"docker.io/library/nginx@sha256:" + strings.Repeat("a", 64), "r.corp", "apps", false, "r.corp/apps/nginx@sha256:" + strings.Repeat("a", 64)},
	} {
		got, err := TargetFor(tc.ref, tc.domain, tc.ns, tc.keep)
		if err != nil || got.String() != tc.want {
			t.Errorf("TargetFor(%s, %s, %s, %v) = %v, %v; want %s", tc.ref, tc.domain, tc.ns, tc.keep, got, err, tc.want)
		}
	}
}

// cancelOn is a slog handler that cancels a context when a message is logged.
type cancelOn struct {
	slog.Handler
	msg    string
	cancel context.CancelFunc
}

func (h cancelOn) Enabled(context.Context, slog.Level) bool { return true }

func (h cancelOn) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.cancel()
	}
	return nil
}

// An import whose check is cut short has not checked its images: it must
// fail, naming them, never report success. Before the fix the check's
// worker pool error was dropped and an unchecked image counted as good
// (about half the runs of each iteration here passed as a success).
func TestImportFailsWhenCheckIsCutShort(t *testing.T) {
	e := newEnv(t)
	file := e.bundle(t, "b.tar", nil)
	if _, err := e.imp(t, file, nil); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		opts := Options{Bundle: file, Trust: bundle.Trust{Key: e.pub}, Domain: e.target, Namespace: "library", Jobs: 3,
			Log: slog.New(cancelOn{Handler: slog.DiscardHandler, msg: "checking every image resolves by digest", cancel: cancel})}
		_, err := Import(ctx, opts)
		cancel()
		if !errors.Is(err, ErrUnresolved) || !errors.Is(err, context.Canceled) {
			t.Fatalf("run %d: import with its check cancelled returned %v, want ErrUnresolved and context.Canceled", i, err)
		}
		if !strings.Contains(err.Error(), e.target+"/library/kube-apiserver:v1.31.4") {
			t.Fatalf("run %d: the error does not name the unchecked image: %v", i, err)
		}
	}
}

// Every binary lands in the registry as an OCI artifact whose one layer is
// the file, by its signed sha256, so nodes can be staged from there.
func TestImportPushesBinariesAsArtifacts(t *testing.T) {
	e := newEnv(t)
	file := e.bundle(t, "b.tar", nil)
	res, err := e.imp(t, file, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Files) != 2 { // the catalog's kubelet and kubeadm (amd64)
		t.Fatalf("%d files pushed: %+v", len(res.Files), res.Files)
	}
	for _, f := range res.Files {
		want := e.target + "/library/" + FileRepository + "/" + f.Name + ":" + bundletest.Version
		if f.Arch != "" {
			want += "-linux-" + f.Arch
		}
		if f.Target != want || f.Action != "pushed" {
			t.Errorf("%s: %+v, want target %s", f.Name, f, want)
		}
		art, err := name.NewDigest(f.Artifact)
		if err != nil {
			t.Fatalf("%s: artifact %q: %v", f.Name, f.Artifact, err)
		}
		layer, err := remote.Layer(art.Context().Digest("sha256:" + f.SHA256))
		if err != nil {
			t.Fatal(err)
		}
		rc, err := layer.Compressed()
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		h := sha256.New()
		n, _ := io.Copy(h, rc)
		rc.Close()
		if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 || n != f.Size {
			t.Errorf("%s: the registry serves %d bytes, sha256 %s; signed %d bytes, %s", f.Name, n, got, f.Size, f.SHA256)
		}
		m, err := remote.Get(art)
		if err != nil || !strings.Contains(string(m.Manifest), `"artifactType":"`+FileArtifactType+`"`) {
			t.Errorf("%s: artifact manifest %s (%v)", f.Name, m.Manifest, err)
		}
	}
	// Again: nothing is sent; without binaries: none are pushed.
	if res, err = e.imp(t, file, nil); err != nil || res.UploadBytes != 0 || res.Files[0].Action != "present" {
		t.Fatalf("re-import: %v, %+v", err, res)
	}
	if res, err = e.imp(t, file, func(o *Options) { o.SkipFiles = true }); err != nil || len(res.Files) != 0 {
		t.Fatalf("SkipFiles: %v, %+v", err, res)
	}
	// With a cache directory, an artifact also holds the file's zstd copy
	// when it saves a tenth or more: not these test files of 20 bytes
	// (test/stories/engine's import of real binaries pushes them, and its nodes
	// pull them).
	cache := t.TempDir()
	if res, err = e.imp(t, file, func(o *Options) { o.CacheDir = cache }); err != nil {
		t.Fatal(err)
	}
	for _, f := range res.Files {
		if f.Zstd != "" {
			t.Errorf("%s, %d bytes, has a zstd copy of %d", f.Name, f.Size, f.ZstdSize)
		}
		if _, err := os.Stat(filepath.Join(cache, "zstd", f.SHA256+".zstd")); err != nil {
			t.Errorf("%s: no zstd copy in the cache: %v", f.Name, err)
		}
	}
	again, err := e.imp(t, file, func(o *Options) { o.CacheDir = cache })
	if err != nil || again.UploadBytes != 0 {
		t.Fatalf("re-import with the zstd copies: %v, %+v", err, again)
	}
}

// A bundle made --from an older minor: its hops' files are pushed under
// the hop's version, and recorded beside the target's.
func TestImportPushesHopFiles(t *testing.T) {
	e := newEnv(t)
	file := e.bundle(t, "hops.tar", func(o *bundle.CreateOptions) { o.From = "v1.29" })
	res, err := e.imp(t, file, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]FileResult{}
	for _, f := range res.Files {
		got[f.Name+":"+f.Target[strings.LastIndex(f.Target, ":")+1:]] = f
	}
	for _, k := range []string{"kubeadm:" + bundletest.HopVersion + "-linux-amd64", "kube-apiserver:" + bundletest.HopVersion + "-linux-amd64", "kubeadm:" + bundletest.Version + "-linux-amd64"} {
		f, ok := got[k]
		if !ok || f.Action != "pushed" {
			t.Errorf("no pushed file %s in %+v", k, res.Files)
		}
	}
	if len(res.Files) != 4 { // the target's kubelet and kubeadm, the hop's kubeadm and kube-apiserver
		t.Errorf("%d files: %+v", len(res.Files), res.Files)
	}
	v, err := bundle.Open(context.Background(), file, bundle.Trust{Key: e.pub})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	rec := availableRecord(res, v.Manifest)
	paths := map[string]string{}
	for _, f := range rec.Files {
		paths[f.Path] = f.Artifact
	}
	if a := paths["hops/"+bundletest.HopVersion+"/bin/linux/amd64/kube-apiserver"]; !strings.Contains(a, "@sha256:") {
		t.Errorf("record files %+v: the hop's kube-apiserver has no artifact", rec.Files)
	}
}

// A blob changed in the bundle after it was signed: the signature and the
// entries' sizes check, so pushing starts; the blob's upload is cut
// before its last bytes (it never lands in the registry, retried or not)
// and no manifest is pushed, so no image resolves. The error names the
// entry.
func TestImportRefusesATamperedBlobAsItPushes(t *testing.T) {
	e := newEnv(t)
	file := e.bundle(t, "b.tar", nil)
	v, err := bundle.Open(context.Background(), file, bundle.Trust{Key: e.pub})
	if err != nil {
		t.Fatal(err)
	}
	// The biggest image blob: a layer.
	var layer bundle.Entry
	for _, me := range v.Manifest.Entries {
		if strings.HasPrefix(me.Path, bundle.LayoutDir+"/blobs/") && me.Size > layer.Size {
			layer, _ = v.Entry(me.Path)
		}
	}
	v.Close()
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	f.ReadAt(b, layer.Offset+layer.Size/2)
	b[0] ^= 1
	if _, err := f.WriteAt(b, layer.Offset+layer.Size/2); err != nil {
		t.Fatal(err)
	}
	f.Close()

	res, err := e.imp(t, file, nil)
	var ve *bundle.VerifyError
	if !errors.Is(err, bundle.ErrModified) || !errors.As(err, &ve) || ve.Entry != layer.Path || !strings.Contains(err.Error(), layer.Path) {
		t.Fatalf("tampered blob: %v", err)
	}
	for _, im := range res.Images {
		if got := e.resolve(t, im.Target); got != "" {
			t.Errorf("%s resolves to %s after a refused import", im.Target, got)
		}
		if im.Action == "pushed" {
			t.Errorf("%s: the result says pushed", im.Target)
		}
	}
	sum := "sha256:" + layer.SHA256
	for _, im := range res.Images {
		ref, _ := name.ParseReference(im.Target)
		if l, err := remote.Layer(ref.Context().Digest(sum)); err == nil {
			if _, err := l.Size(); err == nil {
				if rc, err := l.Compressed(); err == nil {
					rc.Close()
					t.Errorf("the tampered blob %s is in %s", sum, ref.Context())
				}
			}
		}
	}
	// Verified in full, as a dry run does, it is refused before anything.
	if _, err := e.imp(t, file, func(o *Options) { o.DryRun = true }); !errors.Is(err, bundle.ErrModified) {
		t.Errorf("dry run: %v", err)
	}
}
