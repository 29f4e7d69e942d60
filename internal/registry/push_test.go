package registry

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// scenario is a registry that already holds lib/a:base, and four images to
// push that share layers with it and with each other:
//
//	lib/a:base  L0 L1   already there: everything present
//	lib/a:v1    L0 L2   L0 present, L2 and config uploaded
//	lib/b:v1    L0 L3   L0 mounted from lib/a, L3 and config uploaded
//	lib/c:v1    L2 L4   L2 mounted from lib/a (uploaded by this push)
type scenario struct {
	tr      *testRegistry
	src     *memSource
	imgs    []*PushImage // base, a, b, c
	l       [5]v1.Layer
	configs []v1.Hash // of a, b, c
}

func newScenario(t *testing.T) *scenario {
	t.Helper()
	s := &scenario{tr: newTestRegistry(t), src: newMemSource()}
	for i := range s.l {
		s.l[i] = randomLayer(t, int64(1000*(i+1)))
	}
	base := layered(t, s.l[0], s.l[1])
	s.tr.write(t, "lib/a:base", base)
	s.imgs = []*PushImage{
		s.src.image(t, base, s.tr.ref(t, "lib/a:base"), false),
		s.src.image(t, layered(t, s.l[0], s.l[2]), s.tr.ref(t, "lib/a:v1"), false),
		s.src.image(t, layered(t, s.l[0], s.l[3]), s.tr.ref(t, "lib/b:v1"), false),
		s.src.image(t, layered(t, s.l[2], s.l[4]), s.tr.ref(t, "lib/c:v1"), false),
	}
	for _, im := range s.imgs[1:] {
		s.configs = append(s.configs, im.Blobs[0].Digest)
	}
	s.tr.reset()
	return s
}

func (s *scenario) pusher() *Pusher {
	return &Pusher{Access: Access{}, Source: s.src, Jobs: 4, Retry: noWait}
}

// uploaded lists what the scenario must upload, sorted.
func (s *scenario) uploaded(t *testing.T) []string {
	out := []string{digestOf(t, s.l[2]).String(), digestOf(t, s.l[3]).String(), digestOf(t, s.l[4]).String()}
	for _, c := range s.configs {
		out = append(out, c.String())
	}
	sort.Strings(out)
	return out
}

func TestPlan(t *testing.T) {
	s := newScenario(t)
	plan, err := s.pusher().Plan(context.Background(), s.imgs)
	if err != nil {
		t.Fatal(err)
	}
	if w := s.tr.writes(); len(w) != 0 {
		t.Errorf("Plan changed the registry: %v", w)
	}
	// Every (repository, blob) pair is asked about once: lib/a has 5
	// distinct blobs between base and v1, lib/b and lib/c 3 each.
	if n := s.tr.count(http.MethodHead, "blob"); n != 11 {
		t.Errorf("%d blob HEADs, want 11", n)
	}

	size := func(i int) int64 { sz, _ := s.l[i].Size(); return sz }
	cfgSize := func(i int) int64 { return s.imgs[i].Blobs[0].Size }
	// A blob shared by images of one repository counts for the first of
	// them only (so upload bytes add up): L0 of lib/a:v1 was counted as
	// present for lib/a:base.
	want := []ImagePlan{
		{Present: 3, ManifestPresent: true},
		{Uploaded: 2, UploadBytes: cfgSize(1) + size(2)},
		{Mounted: 1, Uploaded: 2, UploadBytes: cfgSize(2) + size(3)},
		{Mounted: 1, Uploaded: 2, UploadBytes: cfgSize(3) + size(4)},
	}
	for i, ip := range plan.Images {
		got := *ip
		got.Image = nil
		if ip.Image != s.imgs[i] || got != want[i] {
			t.Errorf("%s: plan %+v, want %+v", s.imgs[i].Target, got, want[i])
		}
	}

	steps := map[string]string{}
	for _, st := range plan.steps {
		k := st.repo.RepositoryStr() + "@" + st.desc.Digest.String()
		steps[k] = st.action
		if st.action == ActionMount {
			steps[k] += " from " + st.from.RepositoryStr()
		}
	}
	for k, want := range map[string]string{
		"lib/b@" + digestOf(t, s.l[0]).String(): "mount from lib/a",
		"lib/c@" + digestOf(t, s.l[2]).String(): "mount from lib/a",
		"lib/a@" + digestOf(t, s.l[2]).String(): "upload",
		"lib/b@" + digestOf(t, s.l[3]).String(): "upload",
		"lib/c@" + digestOf(t, s.l[4]).String(): "upload",
	} {
		if steps[k] != want {
			t.Errorf("%s: %q, want %q", k, steps[k], want)
		}
	}
	if len(steps) != 8 { // the five above and three configs; nothing for present blobs
		t.Errorf("%d steps, want 8: %v", len(steps), steps)
	}
}

func TestPush(t *testing.T) {
	s := newScenario(t)
	sink := &sumSink{}
	var mu sync.Mutex
	var done []string
	p := s.pusher()
	p.Progress = sink
	p.ImageDone = func(ip *ImagePlan) { mu.Lock(); done = append(done, ip.Image.Target.String()); mu.Unlock() }
	plan, err := p.Plan(context.Background(), s.imgs)
	if err != nil {
		t.Fatal(err)
	}
	s.tr.reset()
	if err := p.Push(context.Background(), plan); err != nil {
		t.Fatal(err)
	}

	// Each blob is uploaded once, by PUT (the stock server's monolithic
	// upload), shared ones are mounted, and nothing is sent twice.
	var puts, mounts []string
	for _, c := range s.tr.recorded() {
		switch {
		case c.Kind == "upload" && c.Method == http.MethodPut:
			puts = append(puts, c.Digest)
		case c.Kind == "upload" && c.Method == http.MethodPost && c.Query.Get("mount") != "":
			mounts = append(mounts, c.Repo+"@"+c.Digest+" from "+c.Query.Get("from"))
		case c.Kind == "upload" && c.Method == http.MethodPatch:
			t.Errorf("unexpected chunked upload %s", c)
		}
	}
	sort.Strings(puts)
	sort.Strings(mounts)
	if strings.Join(puts, " ") != strings.Join(s.uploaded(t), " ") {
		t.Errorf("uploaded\n %v\nwant\n %v", puts, s.uploaded(t))
	}
	wantMounts := []string{
		"lib/b@" + digestOf(t, s.l[0]).String() + " from lib/a",
		"lib/c@" + digestOf(t, s.l[2]).String() + " from lib/a",
	}
	if strings.Join(mounts, "\n") != strings.Join(wantMounts, "\n") {
		t.Errorf("mounted\n %v\nwant\n %v", mounts, wantMounts)
	}
	for d, n := range s.src.opens {
		if n != 1 {
			t.Errorf("blob %s read %d times from the source", d, n)
		}
	}
	// lib/a:base was there already: its manifest is not sent again.
	if n := s.tr.count(http.MethodPut, "manifest"); n != 3 {
		t.Errorf("%d manifest PUTs, want 3", n)
	}
	for _, im := range s.imgs {
		desc := s.tr.readBack(t, strings.TrimPrefix(im.Target.String(), s.tr.host+"/"))
		if desc.Digest != im.Root().Digest {
			t.Errorf("%s: %s, want %s", im.Target, desc.Digest, im.Root().Digest)
		}
	}
	if len(done) != len(s.imgs) {
		t.Errorf("ImageDone for %v", done)
	}
	if sink.expect.Load() == 0 || sink.done.Load() != sink.expect.Load() {
		t.Errorf("progress: %d of %d bytes", sink.done.Load(), sink.expect.Load())
	}
}

// TestPushMountDeclined: a registry may answer a mount with 202 and an
// upload location (the stock in-memory one always does); the blob is then
// uploaded there.
func TestPushMountDeclined(t *testing.T) {
	s := newScenario(t)
	s.tr.mounts = false
	p := s.pusher()
	plan, err := p.Plan(context.Background(), s.imgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Push(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	for _, im := range s.imgs {
		s.tr.readBack(t, strings.TrimPrefix(im.Target.String(), s.tr.host+"/"))
	}
	if n := s.tr.count(http.MethodPut, "upload"); n != len(s.uploaded(t))+2 {
		t.Errorf("%d uploads, want %d (the two declined mounts uploaded)", n, len(s.uploaded(t))+2)
	}
}

// TestPushSharedBlobOnce pushes many images sharing one layer, in parallel,
// into two repositories: the layer is uploaded once and mounted once.
func TestPushSharedBlobOnce(t *testing.T) {
	tr := newTestRegistry(t)
	src := newMemSource()
	shared := randomLayer(t, 50_000)
	var imgs []*PushImage
	for i := 0; i < 8; i++ {
		repo := "lib/x"
		if i%2 == 1 {
			repo = "lib/y"
		}
		target := tr.ref(t, repo+":"+string(rune('a'+i)))
		imgs = append(imgs, src.image(t, layered(t, shared, randomLayer(t, 100)), target, false))
	}
	p := &Pusher{Source: src, Jobs: 8, Retry: noWait}
	plan, err := p.Plan(context.Background(), imgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Push(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	d := digestOf(t, shared).String()
	var puts, mounts int
	for _, c := range tr.recorded() {
		if c.Kind == "upload" && c.Digest == d {
			if c.Method == http.MethodPut {
				puts++
			}
			if c.Query.Get("mount") != "" {
				mounts++
			}
		}
	}
	if puts != 1 || mounts != 1 || src.opens[digestOf(t, shared)] != 1 {
		t.Errorf("shared layer: %d uploads, %d mounts, read %d times; want 1 each", puts, mounts, src.opens[digestOf(t, shared)])
	}
	for _, repo := range []string{"lib/x", "lib/y"} {
		h, _ := v1.NewHash(d)
		if !tr.blobs.has(repo, h) {
			t.Errorf("%s lacks the shared layer", repo)
		}
	}
}

func TestPushManifestsByteForByte(t *testing.T) {
	tr := newTestRegistry(t)
	src := newMemSource()
	img, err := random.Image(2000, 2)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := random.Index(1000, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	byDigest, err := random.Image(500, 1)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := byDigest.Digest()
	imgs := []*PushImage{
		src.image(t, img, tr.ref(t, "lib/re-indented:v1"), true),
		src.index(t, idx, tr.ref(t, "lib/multi-arch:v1")),
		src.image(t, byDigest, tr.ref(t, "lib/pinned@"+d.String()), false),
	}
	if raw, _ := img.RawManifest(); bytes.Equal(raw, imgs[0].Root().Raw) {
		t.Fatal("the re-indented manifest is not re-indented")
	}
	p := &Pusher{Source: src, Jobs: 2, Retry: noWait}
	plan, err := p.Plan(context.Background(), imgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Push(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	for _, im := range imgs {
		for _, m := range im.Manifests {
			desc := tr.readBack(t, im.Target.Context().RepositoryStr()+"@"+m.Digest.String())
			if desc.Digest != m.Digest || !bytes.Equal(desc.Manifest, m.Raw) || desc.MediaType != m.MediaType {
				t.Errorf("%s@%s: registry has %s (%s), %d bytes; want %d bytes", im.Target.Context(), m.Digest, desc.Digest, desc.MediaType, len(desc.Manifest), len(m.Raw))
			}
		}
		if desc := tr.readBack(t, strings.TrimPrefix(im.Target.String(), tr.host+"/")); desc.Digest != im.Root().Digest {
			t.Errorf("%s resolves to %s, want %s", im.Target, desc.Digest, im.Root().Digest)
		}
	}
}

// TestPushAgain: a second import of what is complete sends nothing.
func TestPushAgain(t *testing.T) {
	s := newScenario(t)
	p := s.pusher()
	plan, err := p.Plan(context.Background(), s.imgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Push(context.Background(), plan); err != nil {
		t.Fatal(err)
	}

	s.tr.reset()
	p = s.pusher()
	sink := &sumSink{}
	p.Progress = sink
	plan, err = p.Plan(context.Background(), s.imgs)
	if err != nil {
		t.Fatal(err)
	}
	present := 0
	for _, ip := range plan.Images {
		present += ip.Present
		if ip.Uploaded+ip.Mounted != 0 || !ip.ManifestPresent || ip.UploadBytes != 0 {
			t.Errorf("%s: %+v", ip.Image.Target, *ip)
		}
	}
	if present != 11 { // distinct (repository, blob) pairs
		t.Errorf("%d blobs present, want 11", present)
	}
	if err := p.Push(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	if w := s.tr.writes(); len(w) != 0 {
		t.Errorf("second push sent %v", w)
	}
	if n := s.tr.count("", "upload"); n != 0 {
		t.Errorf("%d upload requests", n)
	}
	if sink.expect.Load() != 0 {
		t.Errorf("expects %d bytes", sink.expect.Load())
	}
}

// TestPushRetries breaks uploads the ways a network and a busy registry do;
// each is retried and the push completes.
func TestPushRetries(t *testing.T) {
	fail := func(status int) func(w http.ResponseWriter, r *http.Request) {
		return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body) // the whole blob was sent, then refused
			http.Error(w, `{"errors":[{"code":"UNKNOWN","message":"try again"}]}`, status)
		}
	}
	cut := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.CopyN(io.Discard, r.Body, 1000) // part of the blob, then the connection drops
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		conn.Close()
	}
	for _, tc := range []struct {
		name   string
		method string
		nth    []int // which calls of method to blobs/uploads fail
		answer func(w http.ResponseWriter, r *http.Request)
		// extra upload PUTs the failures cost
		extraPuts int
	}{
		{"500 on the second PUT", http.MethodPut, []int{2}, fail(http.StatusInternalServerError), 1},
		{"502 twice on the same blob", http.MethodPut, []int{1, 2}, fail(http.StatusBadGateway), 2},
		{"503 on starting an upload", http.MethodPost, []int{1}, fail(http.StatusServiceUnavailable), 0},
		{"429 on a PUT", http.MethodPut, []int{3}, fail(http.StatusTooManyRequests), 1},
		{"connection cut mid-PUT", http.MethodPut, []int{1}, cut, 1},
		{"connection cut on POST", http.MethodPost, []int{2}, cut, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScenario(t)
			s.tr.setIntercept(func(w http.ResponseWriter, r *http.Request, c call) bool {
				if c.Kind != "upload" || c.Method != tc.method {
					return false
				}
				for _, n := range tc.nth {
					if c.N == n {
						tc.answer(w, r)
						return true
					}
				}
				return false
			})
			p := s.pusher()
			p.Jobs = 1 // the Nth request is a known one
			sink := &sumSink{}
			p.Progress = sink
			plan, err := p.Plan(context.Background(), s.imgs)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Push(context.Background(), plan); err != nil {
				t.Fatal(err)
			}
			for _, im := range s.imgs {
				s.tr.readBack(t, strings.TrimPrefix(im.Target.String(), s.tr.host+"/"))
			}
			if n := s.tr.count(http.MethodPut, "upload"); n != len(s.uploaded(t))+tc.extraPuts {
				t.Errorf("%d upload PUTs, want %d", n, len(s.uploaded(t))+tc.extraPuts)
			}
			// Bytes of a broken attempt are taken back: progress ends at 100%.
			if sink.done.Load() != sink.expect.Load() {
				t.Errorf("progress: %d of %d bytes", sink.done.Load(), sink.expect.Load())
			}
		})
	}
}

// TestPushGivesUp: a blob that fails every attempt ends the push with an
// error naming it, after Retry.Attempts tries.
func TestPushGivesUp(t *testing.T) {
	s := newScenario(t)
	s.tr.setIntercept(func(w http.ResponseWriter, r *http.Request, c call) bool {
		if c.Kind == "upload" && c.Method == http.MethodPut {
			_, _ = io.Copy(io.Discard, r.Body)
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	p := s.pusher()
	p.Jobs = 1
	sink := &sumSink{}
	p.Progress = sink
	plan, err := p.Plan(context.Background(), s.imgs)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Push(context.Background(), plan)
	if err == nil || !strings.Contains(err.Error(), s.tr.host+"/lib/") || !strings.Contains(err.Error(), "@sha256:") || !strings.Contains(err.Error(), "503") {
		t.Fatalf("err %v; want a 503 naming the blob", err)
	}
	if n := s.tr.count(http.MethodPut, "upload"); n != noWait.Backoff.Steps {
		t.Errorf("%d PUTs, want %d", n, noWait.Backoff.Steps)
	}
	if n := s.tr.count(http.MethodPut, "manifest"); n != 0 {
		t.Errorf("%d manifests pushed after a failed upload", n)
	}
	if sink.done.Load() != 0 {
		t.Errorf("progress counts %d bytes that did not arrive", sink.done.Load())
	}
}

// TestPushFinalErrors: answers that trying again cannot cure end the push
// at once, naming the image or repository.
func TestPushFinalErrors(t *testing.T) {
	answer := func(status int, code string) func(w http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, `{"errors":[{"code":"`+code+`","message":"refused by the test"}]}`)
		}
	}
	for _, tc := range []struct {
		name         string
		method, kind string
		answer       func(w http.ResponseWriter)
		want         []string
	}{
		{"401 on starting an upload", http.MethodPost, "upload", answer(http.StatusUnauthorized, "UNAUTHORIZED"),
			[]string{"/lib/", "@sha256:", "UNAUTHORIZED", "check the credentials"}},
		{"403 on a PUT", http.MethodPut, "upload", answer(http.StatusForbidden, "DENIED"),
			[]string{"/lib/", "@sha256:", "DENIED", "check the credentials"}},
		{"404: no such repository", http.MethodPost, "upload", answer(http.StatusNotFound, "NAME_UNKNOWN"),
			[]string{"/lib/", "@sha256:", "NAME_UNKNOWN", "not found"}},
		{"manifest refused", http.MethodPut, "manifest", answer(http.StatusBadRequest, "MANIFEST_INVALID"),
			[]string{"image upstream.example/lib/", "/lib/", "MANIFEST_INVALID"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScenario(t)
			s.tr.setIntercept(func(w http.ResponseWriter, r *http.Request, c call) bool {
				if c.Method == tc.method && c.Kind == tc.kind {
					_, _ = io.Copy(io.Discard, r.Body)
					tc.answer(w)
					return true
				}
				return false
			})
			p := s.pusher()
			p.Jobs = 1
			plan, err := p.Plan(context.Background(), s.imgs)
			if err != nil {
				t.Fatal(err)
			}
			err = p.Push(context.Background(), plan)
			if err == nil {
				t.Fatal("push succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v\nlacks %q", err, w)
				}
			}
			if n := s.tr.count(tc.method, tc.kind); n != 1 {
				t.Errorf("%d %s requests: a final error was retried", n, tc.method)
			}
		})
	}
}

// TestPlanAuth runs against a registry that demands basic auth on every
// request, as a private registry does.
func TestPlanAuth(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir()) // no credentials from the machine
	s := newScenario(t)
	s.tr.setIntercept(func(w http.ResponseWriter, r *http.Request, _ call) bool {
		if u, p, ok := r.BasicAuth(); ok && u == "admin" && p == "s3cret" {
			return false
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="kubelift-test"`)
		http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
		return true
	})
	access := func(user, password string) Access {
		a, err := Credentials{Domain: s.tr.host, Username: user, Password: password}.Access()
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for _, tc := range []struct {
		name   string
		access Access
	}{
		{"anonymous", access("", "")},
		{"wrong password", access("admin", "wrong")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := s.pusher()
			p.Access = tc.access
			_, err := p.Plan(context.Background(), s.imgs)
			if err == nil || !strings.Contains(err.Error(), s.tr.host+"/lib/") || !strings.Contains(err.Error(), "check the credentials") {
				t.Errorf("err %v; want 401 naming the repository", err)
			}
			if strings.Contains(err.Error(), "wrong") {
				t.Errorf("the password is in %v", err)
			}
		})
	}
	t.Run("right password", func(t *testing.T) {
		p := s.pusher()
		p.Access = access("admin", "s3cret")
		plan, err := p.Plan(context.Background(), s.imgs)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Push(context.Background(), plan); err != nil {
			t.Fatal(err)
		}
		if err := p.Check(context.Background(), s.imgs); err != nil {
			t.Error(err)
		}
		for _, im := range s.imgs {
			s.tr.readBack(t, strings.TrimPrefix(im.Target.String(), s.tr.host+"/"), remote.WithAuth(&authn.Basic{Username: "admin", Password: "s3cret"}))
		}
	})
}

// TestPushPlainHTTPByName pushes to a plain-HTTP registry known by a name
// (not localhost or a private address, which go-containerregistry already
// tries over HTTP): listing it in Access.Insecure (--plain-http) must be
// enough.
func TestPushPlainHTTPByName(t *testing.T) {
	tr := newTestRegistry(t)
	const host = "registry.test:5000"
	dial := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, tr.host)
	}}
	src := newMemSource()
	img, err := random.Image(1000, 2)
	if err != nil {
		t.Fatal(err)
	}
	target, err := name.ParseReference(host + "/lib/a:v1") // as importer.TargetFor makes it: no name.Insecure
	if err != nil {
		t.Fatal(err)
	}
	imgs := []*PushImage{src.image(t, img, target, false)}
	p := &Pusher{Access: Access{Insecure: []string{host}, Transport: dial}, Source: src, Retry: noWait}
	plan, err := p.Plan(context.Background(), imgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Push(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	if err := p.Check(context.Background(), imgs); err != nil {
		t.Fatal(err)
	}
	tr.readBack(t, "lib/a:v1")
}

// TestPushCancelled: a cancelled context stops the push with its error.
func TestPushCancelled(t *testing.T) {
	s := newScenario(t)
	p := s.pusher()
	plan, err := p.Plan(context.Background(), s.imgs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Push(ctx, plan); !errors.Is(err, context.Canceled) {
		t.Errorf("err %v", err)
	}
	if n := s.tr.count(http.MethodPut, "manifest"); n != 0 {
		t.Errorf("%d manifests pushed", n)
	}
}
