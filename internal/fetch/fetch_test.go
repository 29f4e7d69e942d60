package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/kubelift/kubelift/internal/cas"
	"k8s.io/apimachinery/pkg/util/wait"
)

func sum(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

type server struct {
	files    map[string]string
	hits     map[string]*atomic.Int32
	failures atomic.Int32 // respond 503 this many times first
}

func newServer(t *testing.T, files map[string]string) (*server, *httptest.Server) {
	s := &server{files: files, hits: map[string]*atomic.Int32{}}
	for k := range files {
		s.hits[k] = &atomic.Int32{}
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.failures.Load() > 0 {
			s.failures.Add(-1)
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		body, ok := s.files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		s.hits[r.URL.Path].Add(1)
		w.Write([]byte(body))
	}))
	t.Cleanup(ts.Close)
	return s, ts
}

func TestFetchChecksumFileAndCache(t *testing.T) {
	srv, ts := newServer(t, map[string]string{
		"/kubelet":            "kubelet-binary",
		"/kubelet.sha256":     sum("kubelet-binary"),
		"/crictl.tgz":         "crictl-archive",
		"/crictl.tgz.sha256":  sum("crictl-archive") + "  crictl.tgz\n",
		"/pinned":             "pinned-content",
		"/bad":                "evil",
		"/bad.sha256":         sum("good"),
		"/garbage":            "x",
		"/garbage.sha256":     "<html>not found</html>",
		"/kubelet.sha256.bak": "",
	})
	store := &cas.Store{Dir: t.TempDir()}
	f := &Fetcher{Store: store, Jobs: 2, Backoff: wait.Backoff{Steps: 3}}
	files := []*File{
		{URL: ts.URL + "/kubelet"},
		{URL: ts.URL + "/crictl.tgz"},
		{URL: ts.URL + "/pinned", SHA256: sum("pinned-content")},
	}
	if err := f.Fetch(context.Background(), files); err != nil {
		t.Fatal(err)
	}
	if files[0].SHA256 != sum("kubelet-binary") || files[1].SHA256 != sum("crictl-archive") || files[0].Size != int64(len("kubelet-binary")) {
		t.Fatalf("files = %+v %+v", files[0], files[1])
	}
	// A re-run downloads nothing but the small checksum files.
	again := []*File{{URL: ts.URL + "/kubelet"}, {URL: ts.URL + "/crictl.tgz"}, {URL: ts.URL + "/pinned", SHA256: sum("pinned-content")}}
	if err := f.Fetch(context.Background(), again); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/kubelet", "/crictl.tgz", "/pinned"} {
		if n := srv.hits[p].Load(); n != 1 {
			t.Errorf("%s downloaded %d times", p, n)
		}
	}
	if again[2].Size != int64(len("pinned-content")) {
		t.Errorf("cached size = %d", again[2].Size)
	}

	err := f.Fetch(context.Background(), []*File{{URL: ts.URL + "/bad"}})
	if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), "/bad") {
		t.Errorf("tampered download: %v", err)
	}
	if store.Has(digestOf("evil"), -1) {
		t.Error("tampered content cached")
	}
	err = f.Fetch(context.Background(), []*File{{URL: ts.URL + "/garbage"}})
	if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), "/garbage.sha256") {
		t.Errorf("garbage checksum file: %v", err)
	}
	err = f.Fetch(context.Background(), []*File{{URL: ts.URL + "/missing", SHA256: sum("x")}})
	if err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), "/missing") {
		t.Errorf("missing file: %v", err)
	}
}

func TestFetchRetriesTransientErrors(t *testing.T) {
	srv, ts := newServer(t, map[string]string{"/a": "aaa"})
	srv.failures.Store(2)
	f := &Fetcher{Store: &cas.Store{Dir: t.TempDir()}, Backoff: wait.Backoff{Steps: 3}}
	if err := f.Fetch(context.Background(), []*File{{URL: ts.URL + "/a", SHA256: sum("aaa")}}); err != nil {
		t.Fatalf("after two 503s: %v", err)
	}
	srv.failures.Store(5)
	f.Store = &cas.Store{Dir: t.TempDir()}
	err := f.Fetch(context.Background(), []*File{{URL: ts.URL + "/a", SHA256: sum("aaa")}})
	if err == nil || !strings.Contains(err.Error(), "after 3 attempts") || !strings.Contains(err.Error(), "503") {
		t.Fatalf("persistent 503: %v", err)
	}
}

func digestOf(s string) digest.Digest { return digest.FromString(s) }

// A download whose size nobody states (no size in the File, no
// Content-Length) is bounded: an endless one stops at MaxSize, is not
// retried, and leaves nothing; one whose size the File states is read no
// further than that.
func TestFetchBoundsTheSize(t *testing.T) {
	var sent atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := make([]byte, 32<<10)
		for i := 0; i < 64<<20/len(chunk); i++ { // 64 MiB, chunked, at most
			n, err := w.Write(chunk)
			sent.Add(int64(n))
			if err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(ts.Close)
	store := &cas.Store{Dir: t.TempDir()}
	f := &Fetcher{Store: store, MaxSize: 1 << 20, Backoff: wait.Backoff{Steps: 3}}
	want := sum(strings.Repeat("\x00", 1<<20))
	err := f.Fetch(context.Background(), []*File{{URL: ts.URL + "/endless", SHA256: want}})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "/endless") || strings.Contains(err.Error(), "attempts") {
		t.Fatalf("an endless download: %v", err)
	}
	if store.Has(digestOf(strings.Repeat("\x00", 1<<20)), -1) {
		t.Error("stored")
	}
	sent.Store(0)
	err = f.Fetch(context.Background(), []*File{{URL: ts.URL + "/sized", SHA256: want, Size: 1000}})
	if !errors.Is(err, ErrChecksum) {
		t.Fatalf("a download longer than its stated size: %v", err)
	}
}
