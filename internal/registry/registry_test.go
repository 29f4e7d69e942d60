package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"k8s.io/apimachinery/pkg/util/wait"
)

// testRegistry is go-containerregistry's in-memory registry behind a thin
// handler that records every request and lets a test answer some of them
// itself (a failure, a cut connection).
//
// Two things are added to the real server so that pushes can be told
// apart: blobs are kept per repository (the stock in-memory store shares
// them registry-wide, so every blob would look present everywhere), and,
// with mounts set, cross-repository mounts are honoured as distribution
// does (the stock server declines them with 202, which the spec allows and
// which TestPushMountDeclined covers).
type testRegistry struct {
	srv   *httptest.Server
	host  string
	blobs *repoBlobs
	// mounts honours POST ?mount=&from= when the source repository has the blob.
	mounts bool

	mu    sync.Mutex
	calls []call
	// intercept, when set, sees every request first (after it is recorded)
	// and returns true when it has answered it.
	intercept func(w http.ResponseWriter, r *http.Request, c call) bool
}

// call is one request as the registry saw it.
type call struct {
	Method string
	// Kind is ping, blob (HEAD/GET of a blob), upload (POST, PATCH, PUT
	// under blobs/uploads), manifest, or other.
	Kind string
	Repo string
	// Digest is the blob or manifest digest the request is about, when it
	// names one (upload PUTs name it in ?digest=, mounts in ?mount=).
	Digest string
	Query  url.Values
	// N counts the calls with the same Method and Kind, from 1.
	N int
}

func (c call) String() string { return fmt.Sprintf("%s %s %s %s", c.Method, c.Kind, c.Repo, c.Digest) }

func newTestRegistry(t *testing.T) *testRegistry { return startTestRegistry(t, false) }

// startTestRegistry starts a registry, speaking TLS (httptest's own
// certificate, for 127.0.0.1) when tls is set.
func startTestRegistry(t *testing.T, tls bool) *testRegistry {
	t.Helper()
	tr := &testRegistry{blobs: &repoBlobs{m: map[string][]byte{}}, mounts: true}
	reg := ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)), ggcr.WithBlobHandler(tr.blobs))
	tr.srv = httptest.NewUnstartedServer(tr.handler(reg))
	tr.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	if tls {
		tr.srv.StartTLS()
	} else {
		tr.srv.Start()
	}
	t.Cleanup(tr.srv.Close)
	tr.host = tr.srv.Listener.Addr().String()
	return tr
}

func (tr *testRegistry) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := classify(r)
		tr.mu.Lock()
		for _, p := range tr.calls {
			if p.Method == c.Method && p.Kind == c.Kind {
				c.N++
			}
		}
		c.N++
		tr.calls = append(tr.calls, c)
		intercept := tr.intercept
		tr.mu.Unlock()
		if intercept != nil && intercept(w, r, c) {
			return
		}
		if tr.mounts && c.Kind == "upload" && r.Method == http.MethodPost && c.Query.Get("mount") != "" {
			d, err := v1.NewHash(c.Query.Get("mount"))
			if err == nil && tr.blobs.copy(c.Query.Get("from"), c.Repo, d) {
				w.Header().Set("Location", "/v2/"+c.Repo+"/blobs/"+d.String())
				w.Header().Set("Docker-Content-Digest", d.String())
				w.WriteHeader(http.StatusCreated)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// classify names what a request is about from its path.
func classify(r *http.Request) call {
	c := call{Method: r.Method, Kind: "other", Query: r.URL.Query()}
	p := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v2/"), "/")
	switch {
	case r.URL.Path == "/v2/" || r.URL.Path == "/v2":
		c.Kind = "ping"
	case strings.Contains(p, "/blobs/uploads"):
		c.Kind = "upload"
		c.Repo = p[:strings.Index(p, "/blobs/uploads")]
		c.Digest = c.Query.Get("digest")
		if m := c.Query.Get("mount"); m != "" {
			c.Digest = m
		}
	case strings.Contains(p, "/blobs/"):
		c.Kind = "blob"
		i := strings.LastIndex(p, "/blobs/")
		c.Repo, c.Digest = p[:i], p[i+len("/blobs/"):]
	case strings.Contains(p, "/manifests/"):
		c.Kind = "manifest"
		i := strings.LastIndex(p, "/manifests/")
		c.Repo, c.Digest = p[:i], p[i+len("/manifests/"):]
	}
	return c
}

// count returns how many requests match method ("" any) and kind.
func (tr *testRegistry) count(method, kind string) int {
	n := 0
	for _, c := range tr.recorded() {
		if (method == "" || c.Method == method) && c.Kind == kind {
			n++
		}
	}
	return n
}

func (tr *testRegistry) recorded() []call {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]call(nil), tr.calls...)
}

// writes lists the requests that could change the registry.
func (tr *testRegistry) writes() []call {
	var out []call
	for _, c := range tr.recorded() {
		if c.Method != http.MethodGet && c.Method != http.MethodHead {
			out = append(out, c)
		}
	}
	return out
}

func (tr *testRegistry) reset() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.calls = nil
}

func (tr *testRegistry) setIntercept(f func(w http.ResponseWriter, r *http.Request, c call) bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.intercept = f
}

// ref parses a reference on this registry ("lib/a:v1").
func (tr *testRegistry) ref(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(tr.host+"/"+s, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// write puts an image in the registry with go-containerregistry's own client.
func (tr *testRegistry) write(t *testing.T, ref string, img v1.Image) {
	t.Helper()
	if err := remote.Write(tr.ref(t, ref), img); err != nil {
		t.Fatalf("seed %s: %v", ref, err)
	}
}

// readBack pulls ref with go-containerregistry's client, checks every blob
// of it is in that repository with the right digest, and returns the
// manifest bytes the registry serves.
func (tr *testRegistry) readBack(t *testing.T, ref string, opts ...remote.Option) *remote.Descriptor {
	t.Helper()
	desc, err := remote.Get(tr.ref(t, ref), opts...)
	if err != nil {
		t.Fatalf("read back %s: %v", ref, err)
	}
	if IsIndex(desc.MediaType) {
		idx, err := desc.ImageIndex()
		if err == nil {
			err = validate.Index(idx)
		}
		if err != nil {
			t.Errorf("%s: %v", ref, err)
		}
		return desc
	}
	img, err := desc.Image()
	if err == nil {
		err = validate.Image(img)
	}
	if err != nil {
		t.Errorf("%s: %v", ref, err)
	}
	return desc
}

// repoBlobs is a blob store for ggcr.WithBlobHandler that keeps blobs per
// repository, as real registries do for access control.
type repoBlobs struct {
	mu sync.Mutex
	m  map[string][]byte // repo + "@" + digest
}

// repoKey undoes a quirk of the stock server: for requests under
// blobs/uploads/ID it names the repository "REPO/blobs".
func repoKey(repo string, h v1.Hash) string {
	return strings.TrimSuffix(repo, "/blobs") + "@" + h.String()
}

func (b *repoBlobs) Stat(_ context.Context, repo string, h v1.Hash) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	blob, ok := b.m[repoKey(repo, h)]
	if !ok {
		return 0, ggcr.ErrNotFound
	}
	return int64(len(blob)), nil
}

func (b *repoBlobs) Get(_ context.Context, repo string, h v1.Hash) (io.ReadCloser, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	blob, ok := b.m[repoKey(repo, h)]
	if !ok {
		return nil, ggcr.ErrNotFound
	}
	return io.NopCloser(bytes.NewReader(blob)), nil
}

func (b *repoBlobs) Put(_ context.Context, repo string, h v1.Hash, rc io.ReadCloser) error {
	defer rc.Close()
	blob, err := io.ReadAll(rc) // verifies size and digest as it reads
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.m[repoKey(repo, h)] = blob
	return nil
}

func (b *repoBlobs) has(repo string, h v1.Hash) bool {
	_, err := b.Stat(context.Background(), repo, h)
	return err == nil
}

func (b *repoBlobs) copy(from, to string, h v1.Hash) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	blob, ok := b.m[repoKey(from, h)]
	if ok {
		b.m[repoKey(to, h)] = blob
	}
	return ok
}

// memSource is a BlobSource in memory that counts what is read from it.
type memSource struct {
	mu    sync.Mutex
	blobs map[v1.Hash][]byte
	opens map[v1.Hash]int
}

func newMemSource() *memSource {
	return &memSource{blobs: map[v1.Hash][]byte{}, opens: map[v1.Hash]int{}}
}

func (s *memSource) OpenBlob(d v1.Hash) (io.Reader, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.blobs[d]
	if !ok {
		return nil, fmt.Errorf("no blob %s", d)
	}
	s.opens[d]++
	return bytes.NewReader(b), nil
}

// image adds img's config and layers to the source and returns it as a
// PushImage for target. With reformat, the manifest is re-indented first:
// bytes (and so a digest) no client would produce by re-encoding it, to
// show manifests travel byte for byte.
func (s *memSource) image(t *testing.T, img v1.Image, target name.Reference, reformat bool) *PushImage {
	t.Helper()
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	if reformat {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "\t"); err != nil {
			t.Fatal(err)
		}
		raw = buf.Bytes()
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	blobs := s.addImage(t, img)
	d, _, _ := v1.SHA256(bytes.NewReader(raw))
	mt := m.MediaType
	if mt == "" {
		mt = types.OCIManifestSchema1
	}
	return &PushImage{Ref: "upstream.example/" + target.Context().RepositoryStr() + ":" + target.Identifier(), Target: target,
		Manifests: []RawManifest{{Digest: d, MediaType: mt, Raw: raw}}, Blobs: blobs}
}

// index adds idx's images to the source and returns it as a PushImage
// (children first, the index last).
func (s *memSource) index(t *testing.T, idx v1.ImageIndex, target name.Reference) *PushImage {
	t.Helper()
	im := &PushImage{Ref: "upstream.example/index", Target: target}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, child := range m.Manifests {
		img, err := idx.Image(child.Digest)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := img.RawManifest()
		im.Manifests = append(im.Manifests, RawManifest{Digest: child.Digest, MediaType: child.MediaType, Raw: raw})
		im.Blobs = append(im.Blobs, s.addImage(t, img)...)
	}
	raw, _ := idx.RawManifest()
	d, _ := idx.Digest()
	mt, _ := idx.MediaType()
	im.Manifests = append(im.Manifests, RawManifest{Digest: d, MediaType: mt, Raw: raw})
	return im
}

func (s *memSource) addImage(t *testing.T, img v1.Image) []v1.Descriptor {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.blobs[m.Config.Digest] = cfg
	for _, l := range m.Layers {
		layer, err := img.LayerByDigest(l.Digest)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := layer.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		s.blobs[l.Digest] = b
	}
	return append([]v1.Descriptor{m.Config}, m.Layers...)
}

// layered returns an image of the given layers (its config is its own).
func layered(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func randomLayer(t *testing.T, size int64) v1.Layer {
	t.Helper()
	l, err := random.Layer(size, types.DockerLayer)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func digestOf(t *testing.T, l v1.Layer) v1.Hash {
	t.Helper()
	d, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// noWait retries at once: tests never sleep.
var noWait = Retry{Backoff: wait.Backoff{Steps: 3}}

// sumSink adds up what a transfer says it expects and has done.
type sumSink struct{ expect, done atomic.Int64 }

func (s *sumSink) Expect(n int64) { s.expect.Add(n) }
func (s *sumSink) Done(n int64)   { s.done.Add(n) }

func TestRetryRun(t *testing.T) {
	errFinal := errors.New("final")
	errAgain := errors.New("again")
	final := func(err error) bool { return errors.Is(err, errFinal) }
	for _, tc := range []struct {
		name     string
		retry    Retry
		errs     []error // what each try returns; nil after the list
		want     error
		wantRuns int
	}{
		{"first try", noWait, nil, nil, 1},
		{"cured on the third", noWait, []error{errAgain, errAgain}, nil, 3},
		{"attempts used up", noWait, []error{errAgain, errAgain, errAgain, errAgain}, errAgain, 3},
		{"final error is not retried", noWait, []error{errFinal}, errFinal, 1},
		{"five attempts", Retry{Backoff: wait.Backoff{Steps: 5}}, []error{errAgain, errAgain, errAgain, errAgain}, nil, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := 0
			err := tc.retry.run(context.Background(), func() error {
				runs++
				if runs <= len(tc.errs) {
					return tc.errs[runs-1]
				}
				return nil
			}, final)
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) || runs != tc.wantRuns {
				t.Errorf("err %v after %d runs; want %v after %d", err, runs, tc.want, tc.wantRuns)
			}
		})
	}

	t.Run("cancelled while waiting", func(t *testing.T) {
		// An hour between tries: only the cancel ends the wait.
		ctx, cancel := context.WithCancel(context.Background())
		r := Retry{Backoff: wait.Backoff{Duration: time.Hour, Steps: 3}}
		runs := 0
		err := r.run(ctx, func() error {
			runs++
			time.AfterFunc(time.Second, cancel) // long after this try has returned
			return errAgain
		}, final)
		if !errors.Is(err, context.Canceled) || runs != 1 {
			t.Errorf("err %v after %d runs", err, runs)
		}
	})
	t.Run("cancelled during a try", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		runs := 0
		err := noWait.run(ctx, func() error { runs++; cancel(); return errAgain }, final)
		if !errors.Is(err, errAgain) || runs != 1 {
			t.Errorf("err %v after %d runs; want the try's error, not tried again", err, runs)
		}
	})
}

func TestExplain(t *testing.T) {
	status := func(code int) error { return &transport.Error{StatusCode: code} }
	for _, tc := range []struct {
		err  error
		want string
	}{
		{status(http.StatusUnauthorized), "check the credentials"},
		{status(http.StatusForbidden), "check the credentials"},
		{status(http.StatusNotFound), "not found"},
		{errors.New("tls: failed to verify certificate: x509: certificate signed by unknown authority"), "--ca-file"},
		{errors.New("http: server gave HTTP response to HTTPS client"), "--plain-http"},
		{errors.New("dial tcp 10.0.0.1:5000: connect: connection refused"), "unreachable"},
		{status(http.StatusInternalServerError), ""},
	} {
		err := Explain("registry.corp/lib/a:v1", fmt.Errorf("wrapped: %w", tc.err))
		if !strings.HasPrefix(err.Error(), "registry.corp/lib/a:v1: wrapped: ") || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.err) {
			t.Errorf("%v: %v; want %q in it", tc.err, err, tc.want)
		}
		if tc.want == "" && strings.Contains(err.Error(), "(") {
			t.Errorf("%v: unexpected hint: %v", tc.err, err)
		}
	}
	if Explain("x", nil) != nil {
		t.Error("Explain(nil) is not nil")
	}
}
