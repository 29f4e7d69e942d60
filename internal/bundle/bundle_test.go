package bundle

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubelift/kubelift/internal/bundletest"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/pkg/hashskip"
)

// fixture is the outside world (bundletest) plus the team's keys.
type fixture struct {
	*bundletest.World
	reg       string
	digests   map[string]string
	catalog   *catalog.Catalog
	key       *ecdsa.PrivateKey
	pub       *ecdsa.PublicKey
	dir       string
	installer string
	files     struct{ URL string }
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	w := bundletest.New(t)
	f := &fixture{World: w, reg: w.Registry, digests: w.Digests, catalog: w.Catalog, dir: t.TempDir()}
	f.files.URL = w.Files
	if _, err := GenerateKey(filepath.Join(f.dir, "team")); err != nil {
		t.Fatal(err)
	}
	f.key, _ = LoadPrivateKey(filepath.Join(f.dir, "team.key"))
	f.pub, _ = LoadPublicKey(filepath.Join(f.dir, "team.pub"))
	f.installer = filepath.Join(f.dir, "upgrade-program")
	os.WriteFile(f.installer, []byte("#!/bin/sh\necho installer \"$@\"\n"), 0o755)
	return f
}

func (f *fixture) options(out string) *CreateOptions {
	return &CreateOptions{
		Catalog: f.catalog, KubernetesVersion: "v1.31.4", Arches: []string{"amd64"},
		CacheDir: filepath.Join(f.dir, "cache"), SignKey: f.key, Output: out, Jobs: 3,
		ExtraFiles: []ExtraFile{{Name: "tool", URL: f.files.URL + "/extra/tool"}},
	}
}

func (f *fixture) create(t *testing.T, format Format) string {
	t.Helper()
	out := filepath.Join(f.dir, "bundle."+string(format))
	opts := f.options(out)
	opts.Format = format
	opts.Installer = f.installer
	if _, err := Create(context.Background(), opts); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return out
}

func TestCreateVerifyExtract(t *testing.T) {
	f := newFixture(t)
	out := f.create(t, FormatTar)

	m, err := VerifyFile(context.Background(), out, Trust{Key: f.pub})
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	if m.Signer != Fingerprint(f.pub) || m.KubernetesVersion != "v1.31.4" || m.Release.KubeletHashEra != "name-image" {
		t.Fatalf("manifest: signer %s version %s", m.Signer, m.KubernetesVersion)
	}
	// Upstream digests kept, the multi-arch index included.
	for _, img := range m.Images {
		if img.Digest != f.digests[img.Ref] {
			t.Errorf("%s: digest %s, upstream %s", img.Ref, img.Digest, f.digests[img.Ref])
		}
	}
	// The shared base layer is stored once.
	blobs := 0
	for _, e := range m.Entries {
		if strings.HasPrefix(e.Path, "images/blobs/") {
			blobs++
		}
	}
	// 3 images: apiserver+proxy = 2x(manifest, config, top) ; coredns = index + amd64 (manifest, config, top); + base once;
	// + the OCI index standing in for each of the two Docker schema 2 roots.
	if want := 2*3 + 1 + 3 + 1 + 2; blobs != want {
		t.Errorf("%d blobs, want %d (shared layer once)", blobs, want)
	}

	dir := filepath.Join(f.dir, "extracted")
	if _, err := Extract(context.Background(), out, dir, Trust{Key: f.pub}); err != nil {
		t.Fatalf("extract: %v", err)
	}
	// The layout is readable by go-containerregistry (what crane uses).
	lp, err := layout.FromPath(filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	ii, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, _ := ii.IndexManifest()
	if len(im.Manifests) != 3 {
		t.Fatalf("index.json has %d manifests", len(im.Manifests))
	}
	for _, d := range im.Manifests {
		ref := d.Annotations["org.opencontainers.image.ref.name"]
		// Every descriptor tells the truth: the blob's own media type is
		// the descriptor's.
		raw, err := lp.Bytes(d.Digest)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		var own struct{ MediaType types.MediaType }
		if err := json.Unmarshal(raw, &own); err != nil || own.MediaType != d.MediaType {
			t.Errorf("%s: index.json says %s, the blob says %s", ref, d.MediaType, own.MediaType)
		}
		img := v1.Image(nil)
		if d.Digest.String() == f.digests[ref] {
			// An OCI root (coredns' index) is named as it is.
			if d.MediaType != types.OCIImageIndex {
				t.Errorf("%s: upstream root named with %s", ref, d.MediaType)
			}
			continue
		}
		// A Docker schema 2 root is reached through a small OCI index
		// listing upstream's manifest, by its digest, type and platform.
		child, err := ii.ImageIndex(d.Digest)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		cm, _ := child.IndexManifest()
		if len(cm.Manifests) != 1 || cm.Manifests[0].Digest.String() != f.digests[ref] ||
			cm.Manifests[0].MediaType != types.DockerManifestSchema2 || cm.Manifests[0].Platform == nil || cm.Manifests[0].Platform.Architecture != "amd64" {
			t.Fatalf("%s: stand-in index %s, want upstream %s (docker schema 2, linux/amd64)", ref, raw, f.digests[ref])
		}
		if img, err = child.Image(cm.Manifests[0].Digest); err != nil {
			t.Fatal(err)
		}
		layers, _ := img.Layers()
		for _, l := range layers {
			rc, err := l.Compressed()
			if err != nil {
				t.Fatalf("%s layer: %v", ref, err)
			}
			io.Copy(io.Discard, rc)
			rc.Close()
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "bin/linux/amd64/kubelet")); string(b) != "kubelet amd64 binary" {
		t.Errorf("kubelet = %q", b)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "files/tool")); fi == nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("files/tool: %v", fi)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, ManifestName))
	sig, _ := os.ReadFile(filepath.Join(dir, SignatureName))
	if verifySignature(f.pub, raw, sig) != nil {
		t.Error("extracted bundle.json does not verify with its signature")
	}
	// Extracting again over a non-empty directory is refused.
	if _, err := Extract(context.Background(), out, dir, Trust{Key: f.pub}); !errors.Is(err, ErrDestinationExists) {
		t.Errorf("second extract: %v", err)
	}
}

func TestCreateUsesCache(t *testing.T) {
	f := newFixture(t)
	f.create(t, FormatTar)
	hits := f.Hits("/v1.31.4/amd64/kubelet")
	f.create(t, FormatTar)
	if f.Hits("/v1.31.4/amd64/kubelet") != hits {
		t.Errorf("kubelet downloaded again: %d -> %d", hits, f.Hits("/v1.31.4/amd64/kubelet"))
	}
}

func TestPlanMirrors(t *testing.T) {
	f := newFixture(t)
	opts := f.options("unused")
	opts.RegistryMirrors = []Mirror{{From: f.reg, To: "mirror.corp:5000/k8s"}, {From: f.reg + "/coredns", To: "dns.corp"}}
	opts.URLMirrors = []Mirror{{From: f.files.URL + "/v1.31.4", To: "https://files.corp/k8s"}}
	opts.ExtraImages = []string{"nginx:1.25"}
	p, err := MakePlan(opts)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, im := range p.Images {
		got[im.Ref] = im.PullFrom
	}
	want := map[string]string{
		f.reg + "/kube-apiserver:v1.31.4":  "mirror.corp:5000/k8s/kube-apiserver:v1.31.4",
		f.reg + "/coredns/coredns:v1.11.3": "dns.corp/coredns:v1.11.3",
		"docker.io/library/nginx:1.25":     "docker.io/library/nginx:1.25",
	}
	for ref, pull := range want {
		if got[ref] != pull {
			t.Errorf("%s pulled from %q, want %q", ref, got[ref], pull)
		}
	}
	for _, fl := range p.Files {
		if fl.Name == "kubelet" && fl.URL != "https://files.corp/k8s/amd64/kubelet" {
			t.Errorf("kubelet url %s", fl.URL)
		}
	}
}

func TestNodeStackTravelsWithItsVersions(t *testing.T) {
	f := newFixture(t)
	out := filepath.Join(f.dir, "stack.tar")
	opts := f.options(out)
	opts.NodeStack = true
	if _, err := Create(context.Background(), opts); err != nil {
		t.Fatalf("Create --node-stack: %v", err)
	}
	m, err := VerifyFile(context.Background(), out, Trust{Key: f.pub})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct{ version, path, content string }{
		"containerd": {"v2.3.7", "bin/linux/amd64/containerd-2.3.7-linux-amd64.tar.gz", "containerd v2.3.7 amd64 archive"},
		"runc":       {"v1.5.2", "bin/linux/amd64/runc.amd64", "runc v1.5.2 amd64"},
	}
	for _, fl := range m.Files {
		w, ok := want[fl.Name]
		if !ok {
			if fl.Version != "" {
				t.Errorf("%s carries version %q: only node-stack parts do", fl.Name, fl.Version)
			}
			continue
		}
		delete(want, fl.Name)
		if fl.Version != w.version || fl.Path != w.path || fl.Arch != "amd64" || fl.SHA256 != fmt.Sprintf("%x", sha256.Sum256([]byte(w.content))) {
			t.Errorf("%s: %+v, want version %s at %s", fl.Name, fl, w.version, w.path)
		}
	}
	for name := range want {
		t.Errorf("the bundle lacks %s", name)
	}

	// Without the flag, none of it.
	plain := f.create(t, FormatTar)
	m, err = VerifyFile(context.Background(), plain, Trust{Key: f.pub})
	if err != nil {
		t.Fatal(err)
	}
	for _, fl := range m.Files {
		if fl.Name == "containerd" || fl.Name == "runc" {
			t.Errorf("a bundle made without --node-stack carries %s", fl.Path)
		}
	}

	// A release the catalog pairs no node stack with.
	opts = f.options(filepath.Join(f.dir, "none.tar"))
	opts.NodeStack, opts.KubernetesVersion = true, bundletest.HopVersion
	if _, err := MakePlan(opts); err == nil || !strings.Contains(err.Error(), "--node-stack: test-catalog.yaml pairs no runtime with v1.30.14") {
		t.Errorf("--node-stack for v1.30.14: %v", err)
	}
}

func TestRunFormat(t *testing.T) {
	f := newFixture(t)
	out := f.create(t, FormatRun)
	data, _ := os.ReadFile(out)
	if !bytes.HasPrefix(data, []byte("#!/bin/sh\n")) {
		t.Fatal("no shell stub")
	}
	m, err := VerifyFile(context.Background(), out, Trust{Key: f.pub})
	if err != nil {
		t.Fatalf("verify .run: %v", err)
	}
	if m.InstallerSize == 0 {
		t.Fatal("no installer recorded")
	}
	// The installer is the last thing in the file; damage it.
	bad := append([]byte{}, data...)
	bad[len(bad)-3] ^= 1
	if err := verifyBytes(bad, f.pub); !errors.Is(err, ErrModified) || !strings.Contains(err.Error(), "installer") {
		t.Errorf("damaged installer: %v", err)
	}
	if err := verifyBytes(append(append([]byte{}, data...), 'x'), f.pub); !errors.Is(err, ErrTrailingData) {
		t.Errorf("trailing byte: %v", err)
	}
	if err := verifyBytes(data[:len(data)-100], f.pub); !errors.Is(err, ErrTruncated) {
		t.Errorf("truncated run: %v", err)
	}
}

// verifyBytes verifies b twice, as a stream and as a file (entries hashed
// in parallel), and fails the test unless both give the same verdict,
// naming the same entry.
func verifyBytes(b []byte, pub *ecdsa.PublicKey) error {
	_, streamErr := Verify(context.Background(), "test", bytes.NewReader(b), Trust{Key: pub}, nil, nil)
	dir, err := os.MkdirTemp("", "verify-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, "b")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		panic(err)
	}
	f, err := os.Open(p)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	_, fileErr := Verify(context.Background(), "test", f, Trust{Key: pub}, nil, nil)
	var se, fe *VerifyError
	errors.As(streamErr, &se)
	errors.As(fileErr, &fe)
	if (streamErr == nil) != (fileErr == nil) || (se != nil && (fe == nil || se.Entry != fe.Entry || !errors.Is(fileErr, errors.Unwrap(se.Err)) && se.Err.Error() != fe.Err.Error())) {
		return fmt.Errorf("stream and file verification disagree: stream %v; file %v", streamErr, fileErr)
	}
	return streamErr
}

// entries reads every tar entry of a plain bundle.
type tarEntry struct {
	hdr  tar.Header
	data []byte
}

func readEntries(t *testing.T, b []byte) []tarEntry {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var out []tarEntry
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		d, _ := io.ReadAll(tr)
		out = append(out, tarEntry{*h, d})
	}
}

func writeEntries(t *testing.T, es []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := e.hdr
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.data)
	}
	tw.Close()
	return buf.Bytes()
}

func TestTamperRejected(t *testing.T) {
	f := newFixture(t)
	out := f.create(t, FormatTar)
	orig, _ := os.ReadFile(out)
	es := readEntries(t, orig)
	blob := -1
	for i, e := range es {
		if strings.HasPrefix(e.hdr.Name, "images/blobs/") && e.hdr.Size > 1000 {
			blob = i
			break
		}
	}
	blobName := es[blob].hdr.Name
	other, _ := GenerateKey(filepath.Join(f.dir, "other"))
	_ = other
	otherPub, _ := LoadPublicKey(filepath.Join(f.dir, "other.pub"))

	mutate := func(fn func([]tarEntry) []tarEntry) []byte {
		cp := make([]tarEntry, len(es))
		for i, e := range es {
			cp[i] = tarEntry{e.hdr, append([]byte{}, e.data...)}
		}
		return writeEntries(t, fn(cp))
	}
	cases := []struct {
		name  string
		data  []byte
		key   *ecdsa.PublicKey
		want  error
		entry string
	}{
		{"modified blob", mutate(func(e []tarEntry) []tarEntry { e[blob].data[10] ^= 0xff; return e }), f.pub, ErrModified, blobName},
		{"modified manifest", mutate(func(e []tarEntry) []tarEntry {
			e[0].data = bytes.Replace(e[0].data, []byte("v1.31.4"), []byte("v1.31.5"), 1)
			return e
		}), f.pub, ErrBadSignature, SignatureName},
		{"wrong key", orig, otherPub, ErrWrongKey, SignatureName},
		{"missing entry", mutate(func(e []tarEntry) []tarEntry { return append(e[:blob], e[blob+1:]...) }), f.pub, ErrMissingEntry, blobName},
		{"extra entry", mutate(func(e []tarEntry) []tarEntry {
			return append(e, tarEntry{tar.Header{Name: "images/blobs/sha256/evil", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("x")})
		}), f.pub, ErrExtraEntry, "images/blobs/sha256/evil"},
		{"duplicate entry", mutate(func(e []tarEntry) []tarEntry { return append(e, e[blob]) }), f.pub, ErrDuplicateEntry, blobName},
		{"size mismatch", mutate(func(e []tarEntry) []tarEntry { e[blob].data = e[blob].data[:100]; return e }), f.pub, ErrSizeMismatch, blobName},
		{"truncated", orig[:len(orig)/2], f.pub, ErrTruncated, ""},
		// Cut where an entry ends: tar.Reader alone sees a quiet end.
		{"no end marker", orig[:len(orig)-1024], f.pub, ErrTruncated, ""},
		{"absolute path", mutate(func(e []tarEntry) []tarEntry { e[blob].hdr.Name = "/etc/passwd"; return e }), f.pub, ErrUnsafePath, "/etc/passwd"},
		{"dot-dot path", mutate(func(e []tarEntry) []tarEntry { e[blob].hdr.Name = "../../root/.ssh/authorized_keys"; return e }), f.pub, ErrUnsafePath, "../../root/.ssh/authorized_keys"},
		{"symlink", mutate(func(e []tarEntry) []tarEntry {
			e[blob] = tarEntry{tar.Header{Name: blobName, Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"}, nil}
			return e
		}), f.pub, ErrNotRegular, blobName},
		{"device", mutate(func(e []tarEntry) []tarEntry {
			e[blob] = tarEntry{tar.Header{Name: blobName, Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}, nil}
			return e
		}), f.pub, ErrNotRegular, blobName},
		{"unsigned", mutate(func(e []tarEntry) []tarEntry { return append(e[:1], e[2:]...) }), f.pub, ErrUnsigned, SignatureName},
		{"not a bundle", mutate(func(e []tarEntry) []tarEntry { return e[2:] }), f.pub, ErrNotBundle, ""},
		{"trailing data", append(append([]byte{}, orig...), bytes.Repeat([]byte("x"), 600)...), f.pub, ErrTrailingData, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := verifyBytes(tc.data, tc.key)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			var ve *VerifyError
			if !errors.As(err, &ve) || (tc.entry != "" && ve.Entry != tc.entry) {
				t.Fatalf("error %q does not name entry %q", err, tc.entry)
			}
			// Extraction of the same bytes leaves nothing behind.
			src := filepath.Join(t.TempDir(), "b.tar")
			os.WriteFile(src, tc.data, 0o644)
			parent := t.TempDir()
			if _, err := Extract(context.Background(), src, filepath.Join(parent, "out"), Trust{Key: tc.key}); err == nil {
				t.Fatal("extract accepted it")
			}
			if left, _ := os.ReadDir(parent); len(left) != 0 {
				t.Fatalf("extract left %d entries behind", len(left))
			}
		})
	}
	// Cut inside a header: the entry before it is complete and not blamed.
	v, err := Open(context.Background(), out, Trust{Key: f.pub})
	if err != nil {
		t.Fatal(err)
	}
	e, _ := v.Entry(blobName)
	v.Close()
	cut := orig[:e.Offset-512+100]
	err = verifyBytes(cut, f.pub)
	var ve *VerifyError
	if !errors.Is(err, ErrTruncated) || !errors.As(err, &ve) || ve.Entry == blobName {
		t.Errorf("cut in %s's header: %v", blobName, err)
	}
	// An unsigned bundle passes only when the operator allows it.
	unsigned := mutate(func(e []tarEntry) []tarEntry { return append(e[:1], e[2:]...) })
	if _, err := Verify(context.Background(), "u", bytes.NewReader(unsigned), Trust{AllowUnsigned: true}, nil, nil); err != nil {
		t.Errorf("unsigned with AllowUnsigned: %v", err)
	}
}

func TestCreateErrors(t *testing.T) {
	f := newFixture(t)
	opts := f.options(filepath.Join(f.dir, "x.tar"))
	opts.ExtraImages = []string{f.reg + "/missing:v1"}
	_, err := Create(context.Background(), opts)
	if err == nil || !strings.Contains(err.Error(), f.reg+"/missing:v1") || !strings.Contains(err.Error(), "not found") {
		t.Errorf("missing image: %v", err)
	}
	opts = f.options(filepath.Join(f.dir, "x.tar"))
	opts.Arches = []string{"arm64"}
	_, err = Create(context.Background(), opts)
	if err == nil || !strings.Contains(err.Error(), ":v1.31.4 has no linux/arm64 variant (it is a single linux/amd64 image)") {
		t.Errorf("missing arch: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "x.tar")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed create left the output: %v", err)
	}
	opts = f.options(filepath.Join(f.dir, "x.run"))
	opts.Format = FormatRun
	opts.Arches = []string{"amd64", "arm64"}
	if _, err := Create(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "single --arch") {
		t.Errorf("multi-arch run: %v", err)
	}
}

func TestKeysOpenSSLFingerprintShape(t *testing.T) {
	dir := t.TempDir()
	fp, err := GenerateKey(filepath.Join(dir, "k"))
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(dir, "k.key"))
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("private key mode %v", fi.Mode())
	}
	pub, err := LoadPublicKey(filepath.Join(dir, "k.pub"))
	if err != nil || Fingerprint(pub) != fp || !strings.HasPrefix(fp, "sha256:") || len(fp) != 71 {
		t.Errorf("fingerprint %s / %v", fp, err)
	}
	if _, err := GenerateKey(filepath.Join(dir, "k")); err == nil {
		t.Error("overwrote an existing key")
	}
	if _, err := LoadPublicKey(filepath.Join(dir, "k.key")); err == nil || !strings.Contains(err.Error(), "not a public key") {
		t.Errorf("private key as public: %v", err)
	}
	_ = hex.EncodeToString
}

func TestOpenReadsEntriesInPlace(t *testing.T) {
	f := newFixture(t)
	for _, format := range []Format{FormatTar, FormatRun} {
		out := f.create(t, format)
		v, err := Open(context.Background(), out, Trust{Key: f.pub})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range v.Manifest.Entries {
			r, err := v.OpenEntry(e.Path)
			if err != nil {
				t.Fatal(err)
			}
			h := sha256.New()
			io.Copy(h, r)
			if got := hex.EncodeToString(h.Sum(nil)); got != e.SHA256 {
				t.Fatalf("%s %s: read in place gives sha256 %s, want %s", format, e.Path, got, e.SHA256)
			}
		}
		v.Close()
	}
}

func TestKubeletBinaryReplacesUpstream(t *testing.T) {
	f := newFixture(t)
	kubelet := filepath.Join(f.dir, "kubelet-hashskip")
	// A kubelet built by make kubelet links pkg/hashskip: its PathEnv is in it.
	content := "patched kubelet " + hashskip.PathEnv
	os.WriteFile(kubelet, []byte(content), 0o755)
	opts := f.options(filepath.Join(f.dir, "k.tar"))
	opts.KubeletBinary = kubelet
	m, err := Create(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if !m.KubeletHashSkip("amd64") {
		t.Error("the bundle does not record that its kubelet honours the hash-skip file")
	}
	sum := sha256.Sum256([]byte(content))
	found := false
	for _, fl := range m.Files {
		if fl.Name == "kubelet" {
			found = true
			if fl.SHA256 != hex.EncodeToString(sum[:]) || fl.URL != "file://"+kubelet || fl.Path != "bin/linux/amd64/kubelet" {
				t.Errorf("kubelet entry %+v", fl)
			}
		}
	}
	if !found || f.Hits("/v1.31.4/amd64/kubelet") != 0 {
		t.Errorf("upstream kubelet fetched (%d) or missing (%v)", f.Hits("/v1.31.4/amd64/kubelet"), found)
	}
	opts.Arches = []string{"amd64", "arm64"}
	if _, err := Create(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "single --arch") {
		t.Errorf("two arches: %v", err)
	}
	up, err := Create(context.Background(), f.options(filepath.Join(f.dir, "upstream.tar")))
	if err != nil {
		t.Fatal(err)
	}
	if up.KubeletHashSkip("amd64") {
		t.Error("the bundle says upstream's kubelet honours the hash-skip file")
	}
}

func TestVerifyManifestApart(t *testing.T) {
	f := newFixture(t)
	v, err := Open(context.Background(), f.create(t, FormatTar), Trust{Key: f.pub})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	raw, sig := v.Manifest.Raw, v.Manifest.Signature
	m, err := VerifyManifest(raw, sig, Trust{Key: f.pub})
	if err != nil || m.KubernetesVersion != "v1.31.4" {
		t.Fatalf("genuine manifest: %v", err)
	}
	if _, err := GenerateKey(filepath.Join(f.dir, "other")); err != nil {
		t.Fatal(err)
	}
	otherPub, _ := LoadPublicKey(filepath.Join(f.dir, "other.pub"))
	tampered := bytes.Replace(raw, []byte(`"v1.31.4"`), []byte(`"v1.31.5"`), 1)
	for name, tc := range map[string]struct {
		raw, sig []byte
		trust    Trust
		want     error
	}{
		"tampered":     {tampered, sig, Trust{Key: f.pub}, ErrBadSignature},
		"other key":    {raw, sig, Trust{Key: otherPub}, ErrWrongKey},
		"no signature": {raw, nil, Trust{Key: f.pub}, ErrUnsigned},
	} {
		var ve *VerifyError
		if _, err := VerifyManifest(tc.raw, tc.sig, tc.trust); !errors.Is(err, tc.want) || !errors.As(err, &ve) {
			t.Errorf("%s: %v, want %v as a VerifyError", name, err, tc.want)
		}
	}
}

func TestCreateWithHops(t *testing.T) {
	f := newFixture(t)
	out := filepath.Join(f.dir, "hops.tar")
	opts := f.options(out)
	opts.From = "v1.29"
	if _, err := Create(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	m, err := VerifyFile(context.Background(), out, Trust{Key: f.pub})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Hops) != 1 || m.Hops[0].Release.Version != bundletest.HopVersion {
		t.Fatalf("hops %+v, want one: %s", m.Hops, bundletest.HopVersion)
	}
	entries := map[string]string{}
	for _, e := range m.Entries {
		entries[e.Path] = e.SHA256
	}
	var names []string
	for _, hf := range m.Hops[0].Files {
		names = append(names, hf.Name)
		content := map[string]string{"kubeadm": "kubeadm v1.30.14 amd64", "kube-apiserver": "kube-apiserver v1.30.14 amd64"}[hf.Name]
		want := fmt.Sprintf("%x", sha256.Sum256([]byte(content)))
		if hf.Path != "hops/v1.30.14/bin/linux/amd64/"+hf.Name || hf.SHA256 != want || entries[hf.Path] != want {
			t.Errorf("hop file %+v: want path hops/v1.30.14/bin/linux/amd64/%s, sha256 %s, entry %s", hf, hf.Name, want, entries[hf.Path])
		}
	}
	if strings.Join(names, " ") != "kubeadm kube-apiserver" {
		t.Errorf("hop files %v: want the control plane's and kubeadm, not the kubelet", names)
	}
	if n := f.Hits("/v1.30.14/amd64/kubelet"); n != 0 {
		t.Errorf("the hop's kubelet was downloaded %d times: kubelets go straight to the target", n)
	}
	for _, bf := range m.Files {
		if strings.HasPrefix(bf.Path, "hops/") {
			t.Errorf("hop file %s among the target's files", bf.Path)
		}
	}
	hopImage := f.reg + "/kube-apiserver:" + bundletest.HopVersion
	found := false
	for _, img := range m.Images {
		if img.Ref == hopImage {
			found = img.Digest == f.digests[hopImage]
		}
	}
	if !found {
		t.Errorf("images %+v lack %s at its upstream digest", m.Images, hopImage)
	}

	// A manifest whose hop file is not the entry it names, or whose hop is
	// not older than the target, is refused when read.
	for _, tc := range []struct{ from, to, want string }{
		{`"path": "hops/v1.30.14/bin/linux/amd64/kubeadm"`, `"path": "bin/linux/amd64/kubeadm"`, `hops[0]: file "bin/linux/amd64/kubeadm": not an entry`},
		{`"kubernetesVersion": "v1.31.4"`, `"kubernetesVersion": "v1.30.14"`, "hops[0]: v1.30.14: hops must be listed oldest first, each older than v1.30.14"},
	} {
		bad := strings.Replace(string(m.Raw), tc.from, tc.to, 1)
		if bad == string(m.Raw) {
			t.Fatalf("%q not in the manifest", tc.from)
		}
		if _, err := parseManifest([]byte(bad)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("manifest with %s: %v, want %q", tc.to, err, tc.want)
		}
	}

	opts.From = "v1.27"
	if _, err := MakePlan(opts); err == nil || !strings.Contains(err.Error(), "kubelets at v1.27 would be 4 minors older than the API server at v1.31.4") {
		t.Errorf("--from v1.27: %v", err)
	}
	opts.From = "v1.29.x"
	if _, err := MakePlan(opts); err == nil || !strings.Contains(err.Error(), "--from") {
		t.Errorf("--from v1.29.x: %v", err)
	}
}

// OpenIndex checks what it can without reading content (a wrong size, a
// wrong key are refused at once); OpenChecked checks each entry as it is
// read, handing on its last bytes only when the whole entry matched, and
// Open refuses the same bundle outright.
func TestOpenIndexChecksAsEntriesAreRead(t *testing.T) {
	f := newFixture(t)
	out := f.create(t, FormatTar)
	v, err := Open(context.Background(), out, Trust{Key: f.pub})
	if err != nil {
		t.Fatal(err)
	}
	var big Entry
	for _, me := range v.Manifest.Entries {
		if me.Size > big.Size {
			big, _ = v.Entry(me.Path)
		}
	}
	want, _ := io.ReadAll(io.NewSectionReader(v.file, big.Offset, big.Size))
	v.Close()
	if _, err := GenerateKey(filepath.Join(f.dir, "other")); err != nil {
		t.Fatal(err)
	}
	other, _ := LoadPublicKey(filepath.Join(f.dir, "other.pub"))
	if _, err := OpenIndex(context.Background(), out, Trust{Key: other}); !errors.Is(err, ErrWrongKey) {
		t.Errorf("OpenIndex with another key: %v", err)
	}

	// Whole, the entry reads as it is.
	v, err = OpenIndex(context.Background(), out, Trust{Key: f.pub})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.OpenEntry(big.Path); err == nil {
		t.Error("OpenEntry handed out unchecked content of a bundle opened with OpenIndex")
	}
	r, err := v.OpenChecked(big.Path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(r); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d of %d bytes: %v", len(got), len(want), err)
	}
	v.Close()

	// One byte changed: OpenIndex takes it, the reader refuses it before
	// its last bytes, and Open refuses the file.
	file, err := os.OpenFile(out, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := []byte{want[len(want)/2] ^ 1}
	if _, err := file.WriteAt(b, big.Offset+big.Size/2); err != nil {
		t.Fatal(err)
	}
	file.Close()
	v, err = OpenIndex(context.Background(), out, Trust{Key: f.pub})
	if err != nil {
		t.Fatalf("OpenIndex reads no content: %v", err)
	}
	defer v.Close()
	r, _ = v.OpenChecked(big.Path)
	got, err := io.ReadAll(r)
	var ve *VerifyError
	if !errors.Is(err, ErrModified) || !errors.As(err, &ve) || ve.Entry != big.Path || ve.Bundle != out || !ve.Final() {
		t.Fatalf("changed entry: %v", err)
	}
	if int64(len(got)) >= big.Size {
		t.Fatalf("all %d bytes of a changed entry were handed on", len(got))
	}
	if _, err := Open(context.Background(), out, Trust{Key: f.pub}); !errors.Is(err, ErrModified) {
		t.Fatalf("Open: %v", err)
	}
}

// A manifest's sha256 fields are 64 lowercase hex digits, and each file
// it names is an entry of the same sha256: anything else is refused when
// read, naming the field (a node compares the file's sha256 to the
// staged file's, so it must be the one the entry was verified by).
func TestManifestSumsAreChecked(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	other := strings.Repeat("cd", 32)
	manifest := func(entrySum, fileSum, installer string) []byte {
		m := Manifest{Kind: Kind, SchemaVersion: SchemaVersion, KubernetesVersion: "v1.31.4", InstallerSHA256: installer,
			Entries: []Entry{{Path: "bin/linux/amd64/kubelet", Size: 1, SHA256: entrySum}},
			Files:   []File{{Name: "kubelet", Arch: "amd64", Path: "bin/linux/amd64/kubelet", SHA256: fileSum, Size: 1}}}
		b, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := parseManifest(manifest(sum, sum, "")); err != nil {
		t.Fatalf("a good manifest: %v", err)
	}
	for _, tc := range []struct {
		name                   string
		entry, file, installer string
		want                   string
	}{
		{"an entry's sum in upper case", strings.ToUpper(sum), strings.ToUpper(sum), "", `entry "bin/linux/amd64/kubelet": sha256 "ABAB`},
		{"an entry's sum not hex", strings.Repeat("zz", 32), strings.Repeat("zz", 32), "", "is not 64 lowercase hex digits"},
		{"a file of another sum than its entry", sum, other, "", `files[0] (kubelet): "bin/linux/amd64/kubelet" of sha256 "cdcd`},
		{"the installer's sum not hex", sum, sum, strings.Repeat("g", 64), "installerSha256"},
	} {
		if _, err := parseManifest(manifest(tc.entry, tc.file, tc.installer)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// A signed bundle gets a detached signature beside it that tools the
// operator already trusts check without running anything of the file:
// openssl verifies FILE.sha256.sig over FILE.sha256 with the team's
// public key, and sha256sum -c FILE.sha256 refuses a tampered copy. The
// .run's --help says so.
func TestDetachedSignature(t *testing.T) {
	f := newFixture(t)
	out := f.create(t, FormatRun)
	pub := filepath.Join(f.dir, "team.pub")
	run := func(dir string, name string, args ...string) (string, error) {
		c := exec.Command(name, args...)
		c.Dir = dir
		b, err := c.CombinedOutput()
		return string(b), err
	}
	dir, base := filepath.Dir(out), filepath.Base(out)
	if o, err := run(dir, "openssl", "dgst", "-sha256", "-verify", pub, "-signature", base+DetachedSigSuffix, base+DetachedSumSuffix); err != nil || !strings.Contains(o, "Verified OK") {
		t.Fatalf("openssl on the detached signature: %v: %s", err, o)
	}
	if o, err := run(dir, "sha256sum", "-c", base+DetachedSumSuffix); err != nil || !strings.Contains(o, base+": OK") {
		t.Fatalf("sha256sum -c: %v: %s", err, o)
	}
	// A tampered copy (its stub changed to run something else) fails the
	// sum; a sum file changed to match it fails the signature.
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	data = bytes.Replace(data, []byte("set -eu"), []byte("id;true"), 1)
	if err := os.WriteFile(out, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if o, err := run(dir, "sha256sum", "-c", base+DetachedSumSuffix); err == nil {
		t.Fatalf("sha256sum -c passed a tampered copy: %s", o)
	}
	sum := sha256.Sum256(data)
	if err := os.WriteFile(out+DetachedSumSuffix, []byte(hex.EncodeToString(sum[:])+"  "+base+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := run(dir, "openssl", "dgst", "-sha256", "-verify", pub, "-signature", base+DetachedSigSuffix, base+DetachedSumSuffix); err == nil {
		t.Fatalf("openssl passed a sum file made to match the tampered copy: %s", o)
	}
	stub, err := renderStub("v1.31.4", "amd64", base, "dev", stubInfo{})
	if err != nil || !strings.Contains(string(stub), "cannot vouch for itself") ||
		!strings.Contains(string(stub), "openssl dgst -sha256 -verify PUB -signature "+base+".sha256.sig "+base+".sha256") || !strings.Contains(string(stub), "bundle verify "+base) {
		t.Errorf("the .run's --help does not say how to check it from outside (%v)", err)
	}
}

// etcd travels only when asked (--etcd): the catalog's pairing, or a
// newer version from the same release page, its download checked against
// the sum published beside it or the one pinned; never an older etcd.
func TestEtcdTravelsWhenAsked(t *testing.T) {
	f := newFixture(t)
	etcdOf := func(t *testing.T, etcd string) (File, error) {
		t.Helper()
		out := filepath.Join(f.dir, "etcd.tar")
		opts := f.options(out)
		opts.NodeStack, opts.Etcd = true, etcd
		if _, err := Create(context.Background(), opts); err != nil {
			return File{}, err
		}
		m, err := VerifyFile(context.Background(), out, Trust{Key: f.pub})
		if err != nil {
			t.Fatal(err)
		}
		for _, fl := range m.Files {
			if fl.Name == "etcd" {
				return fl, nil
			}
		}
		return File{}, nil
	}
	if fl, err := etcdOf(t, ""); err != nil || fl.Name != "" {
		t.Fatalf("--node-stack alone carries etcd: %+v, %v", fl, err)
	}
	if fl, err := etcdOf(t, "paired"); err != nil || fl.Version != "v3.5.15" || fl.Path != "bin/linux/amd64/etcd-v3.5.15-linux-amd64.tar.gz" {
		t.Fatalf("--etcd paired: %+v, %v", fl, err)
	}
	sum := fmt.Sprintf("%x", sha256.Sum256([]byte("etcd v3.6.16 amd64 archive")))
	for _, e := range []string{"v3.6.16", "v3.6.16#sha256:" + sum} {
		if fl, err := etcdOf(t, e); err != nil || fl.Version != "v3.6.16" || fl.SHA256 != sum || fl.Path != "bin/linux/amd64/etcd-v3.6.16-linux-amd64.tar.gz" {
			t.Fatalf("--etcd %s: %+v, %v", e, fl, err)
		}
	}
	for e, want := range map[string]string{
		"v3.6.16#sha256:" + strings.Repeat("0", 64): "checksum",
		"v3.4.30":       "--etcd v3.4.30: etcd v3.4.30 is older than the v3.5.15 the catalog pairs with v1.31.4",
		"3.6":           `--etcd 3.6: etcd "3.6": want v3.MINOR.PATCH`,
		"v3.6.16#md5:1": `--etcd v3.6.16#md5:1: checksum "md5:1": want sha256:`,
	} {
		if _, err := etcdOf(t, e); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--etcd %s: %v, want %q", e, err, want)
		}
	}
}

// The agent's image travels as the bundle's other images do: signed,
// verified, and readable from the extracted layout with the program in
// its one layer.
func TestAgentImageTravels(t *testing.T) {
	f := newFixture(t)
	prog, err := exec.LookPath("gofmt") // a static linux program
	if err != nil {
		t.Fatal(err)
	}
	opts := f.options(filepath.Join(f.dir, "a.tar"))
	opts.AgentProgram = prog
	if _, err := Create(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	m, err := VerifyFile(context.Background(), opts.Output, Trust{Key: f.pub})
	if err != nil {
		t.Fatal(err)
	}
	var agent *Image
	for i, img := range m.Images {
		if strings.HasPrefix(img.Ref, "kubelift.dev/kubelift-agent:sha256-") {
			agent = &m.Images[i]
		}
	}
	if agent == nil || strings.Join(agent.Platforms, ",") != "linux/amd64" || agent.Blobs != 3 {
		t.Fatalf("agent image %+v among %d images", agent, len(m.Images))
	}
	dir := filepath.Join(f.dir, "extracted")
	if _, err := Extract(context.Background(), opts.Output, dir, Trust{Key: f.pub}); err != nil {
		t.Fatal(err)
	}
	lp, err := layout.FromPath(filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	h, _ := v1.NewHash(agent.Digest)
	img, err := lp.Image(h)
	if err != nil {
		t.Fatalf("the agent's image from the layout: %v", err)
	}
	if cf, err := img.ConfigFile(); err != nil || cf.Config.Entrypoint[0] != "/kubelift/upgrade" {
		t.Errorf("config %v %v", cf, err)
	}

	opts.Arches = []string{"amd64", "arm64"}
	if _, err := Create(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "one arch") {
		t.Errorf("two arches: %v", err)
	}
	opts.Arches, opts.AgentProgram = []string{"amd64"}, f.installer // a script
	if _, err := Create(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "not a linux program") {
		t.Errorf("a script as the agent: %v", err)
	}
}
