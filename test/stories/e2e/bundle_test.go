package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/test/env/internet"
)

const version = "v1.31.4"

// world is the outside world of one test: a source registry and file server.
type world struct {
	reg     *internet.Registry
	files   *internet.FileServer
	digests map[string]string
	release *catalog.Release
	dir     string
	flags   []string // mirror flags for bundle create
}

func startWorld(t *testing.T, shape internet.ImageShape) *world {
	t.Helper()
	dir := t.TempDir()
	reg, err := internet.StartRegistry(context.Background(), filepath.Join(dir, "source-registry"), internet.RegistryOptions{Proxy: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)
	cat, err := catalog.Default()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := cat.Lookup(version)
	if err != nil {
		t.Fatal(err)
	}
	digests, err := internet.Seed(context.Background(), reg.Backend, internet.ReleaseRepos(rel), shape)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := internet.StartFileServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fs.Close)
	w := &world{reg: reg, files: fs, digests: digests, release: rel, dir: dir}
	w.flags = []string{"--registry-mirror", "registry.k8s.io=" + reg.Host, "--insecure-registry", reg.Host}
	for _, m := range fs.AddRelease(rel, shape.Arches, 64<<10) {
		w.flags = append(w.flags, "--url-mirror", m)
	}
	return w
}

func (w *world) keygen(t *testing.T, name string) (key, pub string) {
	prefix := filepath.Join(w.dir, name)
	mustRun(t, "bundle", "keygen", "--out", prefix)
	return prefix + ".key", prefix + ".pub"
}

func (w *world) create(t *testing.T, key, out, cache string, extra ...string) result {
	args := append([]string{"create", "--kubernetes-version", version, "--sign-key", key, "-o", out,
		"--cache-dir", cache, "--quiet", "--installer", filepath.Join(binDir, "upgrade")}, w.flags...)
	return run(t, "bundle", append(args, extra...)...)
}

func TestBundleEndToEnd(t *testing.T) {
	w := startWorld(t, internet.ImageShape{Arches: []string{"amd64", "arm64"}, BaseBytes: 256 << 10, UniqueBytes: 64 << 10})
	key, pub := w.keygen(t, "team")
	cache := filepath.Join(w.dir, "cache")
	out := filepath.Join(w.dir, "k8s-"+version+"-linux-amd64.run")

	r := w.create(t, key, out, cache, "--format", "run")
	if r.code != 0 {
		t.Fatalf("create: exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "7 images, 9 files") {
		t.Errorf("summary: %s", r.stdout)
	}

	t.Run("verify", func(t *testing.T) {
		r := mustRun(t, "bundle", "verify", "--key", pub, out)
		if !strings.Contains(r.stdout, "OK, Kubernetes v1.31.4") {
			t.Errorf("verify output: %s", r.stdout)
		}
		// The upgrade program inside the air gap verifies too.
		mustRun(t, "upgrade", "verify", "--key", pub, out)
	})

	t.Run("inspect keeps upstream digests", func(t *testing.T) {
		r := mustRun(t, "bundle", "inspect", "-o", "json", out)
		var s struct {
			Signer string
			Images []struct{ Ref, Digest string }
			Files  []struct{ Name, SHA256 string }
		}
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			t.Fatal(err)
		}
		if len(s.Images) != 7 || len(s.Files) != 9 {
			t.Fatalf("%d images, %d files", len(s.Images), len(s.Files))
		}
		for _, im := range s.Images {
			repo := strings.TrimPrefix(im.Ref, "registry.k8s.io/")
			if im.Digest != w.digests[repo] {
				t.Errorf("%s: bundle digest %s, upstream %s", im.Ref, im.Digest, w.digests[repo])
			}
		}
	})

	t.Run("run stub verifies and extracts", func(t *testing.T) {
		r := mustRun(t, out, "--help")
		if !strings.Contains(r.stdout, "--upgrade --key PUB") {
			t.Errorf("stub help: %s", r.stdout)
		}
		mustRun(t, out, "--verify", "--key", pub)
		dir := filepath.Join(w.dir, "extracted")
		mustRun(t, out, "--extract", dir, "--key", pub)

		// openssl verifies the signature with the team's public key.
		r = mustRun(t, "openssl", "dgst", "-sha256", "-verify", pub, "-signature", filepath.Join(dir, "bundle.json.sig"), filepath.Join(dir, "bundle.json"))
		if !strings.Contains(r.stdout, "Verified OK") {
			t.Errorf("openssl: %s", r.stdout)
		}
		// The fingerprint recipe in the README matches.
		der := mustRun(t, "openssl", "pkey", "-pubin", "-in", pub, "-outform", "DER")
		fp := fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(der.stdout)))
		raw, _ := os.ReadFile(filepath.Join(dir, "bundle.json"))
		if !strings.Contains(string(raw), `"signer": "`+fp+`"`) {
			t.Errorf("signer in bundle.json is not openssl's fingerprint %s", fp)
		}

		// skopeo reads the layout of this single-platform bundle (issue:
		// index.json once named Docker manifests by OCI types, which skopeo
		// refused): inspect and copy every image, as a user would, with no
		// overrides.
		for _, repo := range internet.ReleaseRepos(w.release) {
			ref := "oci:" + filepath.Join(dir, "images") + ":registry.k8s.io/" + repo
			r = mustRun(t, "skopeo", "inspect", ref)
			if !strings.Contains(r.stdout, `"Architecture": "amd64"`) {
				t.Errorf("skopeo inspect %s: %s", repo, r.stdout)
			}
			out := filepath.Join(w.dir, "skopeo-copy", strings.NewReplacer("/", "_", ":", "_").Replace(repo))
			if err := os.MkdirAll(out, 0o755); err != nil {
				t.Fatal(err)
			}
			mustRun(t, "skopeo", "copy", ref, "dir:"+out)
			// What skopeo copied is upstream's amd64 manifest, byte for byte:
			// the raw index.json entry is an OCI index listing it.
			raw := mustRun(t, "skopeo", "inspect", "--raw", ref).stdout
			var idx struct {
				MediaType string
				Manifests []struct {
					MediaType, Digest string
					Platform          struct{ Architecture string }
				}
			}
			if err := json.Unmarshal([]byte(raw), &idx); err != nil || idx.MediaType != "application/vnd.oci.image.index.v1+json" ||
				len(idx.Manifests) != 1 || idx.Manifests[0].Platform.Architecture != "amd64" ||
				idx.Manifests[0].MediaType != "application/vnd.docker.distribution.manifest.v2+json" {
				t.Fatalf("%s: index.json points at %s", repo, raw)
			}
			copied, err := os.ReadFile(filepath.Join(out, "manifest.json"))
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprintf("sha256:%x", sha256.Sum256(copied)); got != idx.Manifests[0].Digest {
				t.Errorf("%s: skopeo copied manifest %s, upstream's amd64 manifest is %s", repo, got, idx.Manifests[0].Digest)
			}
		}
	})

	t.Run("tampering is rejected with the entry named", func(t *testing.T) {
		data, _ := os.ReadFile(out)
		// A byte in the middle of the payload (a blob) changes.
		bad := append([]byte{}, data...)
		bad[len(bad)/3] ^= 0x01
		badFile := filepath.Join(w.dir, "tampered.run")
		os.WriteFile(badFile, bad, 0o755)
		r := run(t, "bundle", "verify", "--key", pub, badFile)
		if r.code != 3 || !strings.Contains(r.stderr, "entry ") {
			t.Errorf("tampered blob: exit %d: %s", r.code, r.stderr)
		}
		// The stub refuses to extract it; nothing is left behind.
		dir := filepath.Join(w.dir, "never")
		r = run(t, badFile, "--extract", dir, "--key", pub)
		if r.code == 0 || fileExists(dir) {
			t.Errorf("stub extracted a tampered bundle: exit %d", r.code)
		}
		// A damaged embedded program is caught by the stub before it runs.
		bad = append([]byte{}, data...)
		bad[len(bad)-1000] ^= 0x01
		os.WriteFile(badFile, bad, 0o755)
		r = run(t, badFile, "--verify", "--key", pub)
		if r.code == 0 || !strings.Contains(r.stderr, "embedded upgrade program is damaged") {
			t.Errorf("damaged installer: exit %d: %s", r.code, r.stderr)
		}
		// Wrong key.
		_, otherPub := w.keygen(t, "other")
		r = run(t, "bundle", "verify", "--key", otherPub, out)
		if r.code != 3 || !strings.Contains(r.stderr, "signed by a different key") {
			t.Errorf("wrong key: exit %d: %s", r.code, r.stderr)
		}
		r = run(t, out, "--verify", "--key", otherPub)
		if r.code == 0 || !strings.Contains(r.stderr, "does not verify") {
			t.Errorf("stub with wrong key: exit %d: %s", r.code, r.stderr)
		}
	})

	t.Run("a re-run is served from the cache", func(t *testing.T) {
		before := w.reg.BlobGETs.Load()
		hits := w.files.Hits(w.release.Files[0].URLFor("amd64"))
		r := w.create(t, key, filepath.Join(w.dir, "again.tar"), cache)
		if r.code != 0 {
			t.Fatalf("create: %s", r.stderr)
		}
		if got := w.reg.BlobGETs.Load() - before; got != 0 {
			t.Errorf("re-run downloaded %d blobs", got)
		}
		if w.files.Hits(w.release.Files[0].URLFor("amd64")) != hits {
			t.Error("re-run downloaded a binary again")
		}
	})
}

func TestBundleResumesAfterNetworkDrop(t *testing.T) {
	w := startWorld(t, internet.ImageShape{Arches: []string{"amd64"}, BaseBytes: 128 << 10, UniqueBytes: 32 << 10})
	key, _ := w.keygen(t, "team")
	cache := filepath.Join(w.dir, "cache")
	out := filepath.Join(w.dir, "b.tar")

	// Let 6 blob downloads through, then drop every connection.
	w.reg.FailBlobsAfter(6)
	r := w.create(t, key, out, cache, "--jobs", "1")
	if r.code == 0 {
		t.Fatal("create succeeded through a dead link")
	}
	if fileExists(out) {
		t.Fatal("failed create left an output file")
	}
	if left, _ := filepath.Glob(filepath.Join(w.dir, ".b.tar*")); len(left) > 0 {
		t.Fatalf("failed create left %v", left)
	}
	cached := map[string]bool{}
	entries, _ := os.ReadDir(filepath.Join(cache, "blobs", "sha256"))
	for _, e := range entries {
		cached[e.Name()] = true
	}
	w.reg.Heal()
	before := w.reg.BlobGETs.Load()
	if r := w.create(t, key, out, cache); r.code != 0 {
		t.Fatalf("re-run: %s", r.stderr)
	}
	// Every blob the bundle needs, minus what the cache already had.
	pub := strings.TrimSuffix(key, ".key") + ".pub"
	dir := filepath.Join(w.dir, "x")
	mustRun(t, "bundle", "extract", "--key", pub, out, dir)
	var m struct{ Entries []struct{ Path string } }
	raw, _ := os.ReadFile(filepath.Join(dir, "bundle.json"))
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	// The small OCI indexes index.json points at are made, not fetched.
	var layout struct{ Manifests []struct{ Digest string } }
	raw, _ = os.ReadFile(filepath.Join(dir, "images", "index.json"))
	if err := json.Unmarshal(raw, &layout); err != nil {
		t.Fatal(err)
	}
	made := map[string]bool{}
	for _, d := range layout.Manifests {
		if !slices.Contains(slices.Collect(maps.Values(w.digests)), d.Digest) {
			made[strings.TrimPrefix(d.Digest, "sha256:")] = true
		}
	}
	// Every fetched blob of the bundle that the failed run did not cache, and no other.
	want, blobs, partly := int64(0), 0, 0
	for _, e := range m.Entries {
		if hex, ok := strings.CutPrefix(e.Path, "images/blobs/sha256/"); ok && !made[hex] {
			blobs++
			if !cached[hex] {
				want++
			} else {
				partly++
			}
		}
	}
	if got := w.reg.BlobGETs.Load() - before; got != want || partly == 0 || want == 0 {
		t.Errorf("re-run fetched %d blobs; the bundle has %d, %d were cached by the failed run: want %d", got, blobs, partly, want)
	}
	for name := range cached {
		if strings.HasPrefix(name, ".") {
			t.Errorf("failed run left a partial download %s in the cache", name)
		}
	}
}

func TestCreateDryRunJSON(t *testing.T) {
	r := mustRun(t, "bundle", "create", "--kubernetes-version", version, "--dry-run", "-o", "json",
		"--registry-mirror", "registry.k8s.io=mirror.corp:5000/k8s", "--url-mirror", "https://dl.k8s.io=https://files.corp/k8s",
		"--image", "nginx:1.27", "--file", "helm=https://get.example/helm.tgz#sha256:"+strings.Repeat("ab", 32))
	var plan struct {
		Images []struct{ Ref, PullFrom string }
		Files  []struct{ Name, URL, SHA256 string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &plan); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if len(plan.Images) != 8 || len(plan.Files) != 10 {
		t.Fatalf("%d images, %d files", len(plan.Images), len(plan.Files))
	}
	if plan.Images[0].PullFrom != "mirror.corp:5000/k8s/kube-apiserver:v1.31.4" {
		t.Errorf("pullFrom %s", plan.Images[0].PullFrom)
	}
	for _, f := range plan.Files {
		if f.Name == "kubelet" && f.URL != "https://files.corp/k8s/release/v1.31.4/bin/linux/amd64/kubelet" {
			t.Errorf("kubelet url %s", f.URL)
		}
		if f.Name == "helm" && f.SHA256 != strings.Repeat("ab", 32) {
			t.Errorf("helm sha %s", f.SHA256)
		}
	}
}

func TestVersionAndCompletion(t *testing.T) {
	for _, prog := range []string{"bundle", "upgrade"} {
		r := mustRun(t, prog, "--version")
		if !strings.HasPrefix(r.stdout, prog+" version ") {
			t.Errorf("%s --version: %q", prog, r.stdout)
		}
		r = mustRun(t, prog, "completion", "bash")
		if !strings.Contains(r.stdout, "__start_"+prog) {
			t.Errorf("%s completion bash: no completion function", prog)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"create", "--kubernetes-version", "v1.31.4", "-o", "x.tar"}, 2, "--sign-key KEY is required"},
		{[]string{"create", "--kubernetes-version", "v1.99.0", "--dry-run"}, 1, "v1.99.0: version not in catalog"},
		{[]string{"create", "--kubernetes-version", "v1.31.4", "--dry-run", "--file", "x=ftp://a/b"}, 2, "not an http(s) URL"},
		{[]string{"verify", "some.tar"}, 2, "--key is required"},
		{[]string{"catalog", "--catalog", "/nonexistent.yaml"}, 1, "/nonexistent.yaml"},
		{[]string{"create", "--bogus"}, 2, "unknown flag"},
	} {
		r := run(t, "bundle", tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("bundle %v: exit %d, stderr %q; want exit %d and %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
}
