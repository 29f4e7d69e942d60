package stage

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/cas"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/codec"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/registry"
)

// pullRegistry is a real registry (go-containerregistry's, in process,
// plain HTTP) that asks for a password on every request, as a
// docker-registry with htpasswd does, and can spoil one blob's bytes or
// cut one blob's first download in half.
type pullRegistry struct {
	srv    *httptest.Server
	host   string
	mu     sync.Mutex
	spoil  map[string]bool // blob digest -> serve other bytes
	refuse map[string]bool // blob digest -> 403 to a GET
	cut    map[string]bool // blob digest -> cut the next download short
	// pad: blob digest -> serve this many bytes more than the blob, with
	// its length announced (padAnnounced) or not (chunked); padSent counts
	// the bytes of the padding the client took.
	pad          map[string]int64
	padAnnounced bool
	padSent      int64
	ranged       int // downloads that asked for a range (resumed)
}

const pullUser, pullPassword = "kubelift", "s3cret-pw"

func newPullRegistry(t *testing.T) *pullRegistry {
	r := &pullRegistry{spoil: map[string]bool{}, cut: map[string]bool{}, refuse: map[string]bool{}, pad: map[string]int64{}}
	reg := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(pullUser+":"+pullPassword))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Authorization") != want {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		d := req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:]
		r.mu.Lock()
		spoil, cut, refuse, pad, announced := r.spoil[d], r.cut[d], r.refuse[d], r.pad[d], r.padAnnounced
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/") {
			delete(r.cut, d)
			if req.Header.Get("Range") != "" {
				r.ranged++
			}
		}
		r.mu.Unlock()
		if refuse && req.Method == http.MethodGet {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		ranged := req.Header.Get("Range") != ""
		if req.Method != http.MethodGet || !strings.Contains(req.URL.Path, "/blobs/") || (!spoil && !cut && !ranged && pad == 0) {
			reg.ServeHTTP(w, req)
			return
		}
		rec := httptest.NewRecorder()
		whole := req.Clone(req.Context())
		whole.Header.Del("Range")
		reg.ServeHTTP(rec, whole)
		body := rec.Body.Bytes()
		if ranged {
			// go-containerregistry's registry takes closed ranges only;
			// distribution's, like this, open ones ("bytes=N-") too.
			http.ServeContent(w, req, "", time.Time{}, bytes.NewReader(body))
			return
		}
		if spoil {
			body = append([]byte{}, body...)
			body[len(body)/2] ^= 0xff
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		if pad > 0 {
			w.Header().Del("Content-Length")
			if announced {
				w.Header().Set("Content-Length", strconv.FormatInt(int64(len(body))+pad, 10))
			}
			w.WriteHeader(rec.Code)
			w.Write(body)
			chunk := make([]byte, 64<<10)
			for left := pad; left > 0; left -= int64(len(chunk)) {
				n, err := w.Write(chunk[:min(left, int64(len(chunk)))])
				r.mu.Lock()
				r.padSent += int64(n)
				r.mu.Unlock()
				if err != nil {
					return
				}
			}
			return
		}
		w.WriteHeader(rec.Code)
		if cut {
			// Half the bytes, then the connection drops.
			w.Write(body[:len(body)/2])
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
				}
			}
			return
		}
		w.Write(body)
	}))
	t.Cleanup(r.srv.Close)
	u, _ := url.Parse(r.srv.URL)
	r.host = u.Host
	return r
}

func (r *pullRegistry) access(t *testing.T) registry.Access {
	a, err := registry.Credentials{Domain: r.host, Username: pullUser, Password: pullPassword, PlainHTTP: true}.Access()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// pullWorld is stageWorld with every file pushed to a registry as a blob
// and recorded as an artifact, as import does; with zst, its zstd copy
// too.
func pullWorld(t *testing.T, zst bool) (*release.Release, *memSource, *pullRegistry, Options) {
	target, src, nodes, tgts := stageWorld(t)
	r := newPullRegistry(t)
	a := r.access(t)
	for _, f := range target.Manifest.Files {
		repo, err := name.NewRepository(r.host+"/library/kubelift-files/"+f.Name, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		l := static.NewLayer(src.content[f.Name], types.MediaType("application/octet-stream"))
		if err := remote.WriteLayer(repo, l, remote.WithAuthFromKeychain(a.Keychain)); err != nil {
			t.Fatal(err)
		}
		rec := cluster.BinaryRecord{Name: f.Name, Arch: f.Arch, Path: f.Path, SHA256: f.SHA256, Size: f.Size,
			Artifact: repo.String() + "@sha256:" + strings.Repeat("0", 64)}
		if zst {
			// The copy, tagged beside the file as import tags it.
			var b bytes.Buffer
			if err := codec.Encode(&b, bytes.NewReader(src.content[f.Name]), codec.Zstd); err != nil {
				t.Fatal(err)
			}
			img, err := mutate.Append(empty.Image, mutate.Addendum{Layer: static.NewLayer(b.Bytes(), codec.ZstdMediaType), MediaType: codec.ZstdMediaType,
				Annotations: map[string]string{codec.AnnotationDecodedSHA256: f.SHA256}})
			if err != nil {
				t.Fatal(err)
			}
			if err := remote.Write(repo.Tag(codec.ZstdTag(f.SHA256)), img, remote.WithAuthFromKeychain(a.Keychain)); err != nil {
				t.Fatal(err)
			}
		}
		target.Record.Files = append(target.Record.Files, rec)
	}
	// The registry takes a password: the nodes may be handed it.
	opts := Options{Release: target, Source: pullSource{RegistrySource{Access: a}, src}, Nodes: nodes, Addresses: tgts, Parallel: 3, CacheDir: t.TempDir(),
		NodeCredentials: NodePasswords}
	return target, src, r, opts
}

// pullSource is a RegistrySource whose files, when this machine sends
// them, come from memory (counted).
type pullSource struct {
	RegistrySource
	mem *memSource
}

func (s pullSource) Open(ctx context.Context, f bundle.File, artifact string) (io.ReadCloser, error) {
	return s.mem.Open(ctx, f, artifact)
}

// Nodes that reach the registry pull their files themselves (the zstd
// copies, decoded and checked on the node): this machine sends none of
// the bytes, the password reaches no command line, a second
// stage moves nothing, and a node whose registry is out of reach is sent
// its files over SSH, chosen for it alone.
func TestStagePullsFromTheRegistry(t *testing.T) {
	_, src, _, opts := pullWorld(t, true)
	dirs := t.TempDir()
	conn := &shellNodes{cmds: map[string]int{}, env: map[string][]string{
		// worker-2's curl goes through a proxy that is not there.
		"worker-2": {"http_proxy=http://127.0.0.1:9", "HTTP_PROXY=http://127.0.0.1:9"},
	}}
	opts.Connector = conn
	// Without leave to hand nodes the password this registry takes, they
	// are sent their files over SSH, and the password goes nowhere.
	o := opts
	o.NodeCredentials, o.Addresses, o.StageDir = "", opts.Addresses[1:2], filepath.Join(dirs, "no-password")
	if res, err := Run(context.Background(), o); err != nil || res.Nodes[0].Path != ViaSSH || !strings.Contains(res.Nodes[0].PathReason, "--node-credentials password") {
		t.Fatalf("a password registry, no leave: %+v, %v", res, err)
	}
	for _, c := range conn.ran {
		if strings.Contains(c, "kubelift-pull-file") {
			t.Fatalf("a pull ran without leave: %.100s", c)
		}
	}
	stage := func() *Result {
		t.Helper()
		var res Result
		for _, tg := range opts.Addresses {
			o := opts
			o.Addresses, o.StageDir = []nodeaccess.Address{tg}, filepath.Join(dirs, tg.Name)
			r, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			res.Nodes = append(res.Nodes, r.Nodes...)
		}
		return &res
	}
	res := stage()
	for _, n := range res.Nodes {
		switch n.Node {
		case "worker-2":
			if n.Path != ViaSSH || !strings.Contains(n.PathReason, "cannot be reached") || n.BytesSent == 0 || n.BytesPulled != 0 || n.Codec != CodecZstd {
				t.Errorf("worker-2, its registry out of reach: %+v", n)
			}
		default:
			// The zstd copies: a tenth of the bytes, or less.
			if n.Path != ViaRegistry || n.BytesSent != 0 || n.BytesPulled == 0 || n.BytesPulled*10 > n.Bytes || len(n.Sent) == 0 {
				t.Errorf("%s pulled: %+v", n.Node, n)
			}
		}
		for _, name := range append(n.Sent, n.Present...) {
			got, err := os.ReadFile(filepath.Join(dirs, n.Node, "v1.31.4", name))
			if err != nil || !bytes.Equal(got, src.content[name]) {
				t.Errorf("%s: %s staged wrong (%v)", n.Node, name, err)
			}
		}
	}
	for _, c := range conn.ran {
		if strings.Contains(c, pullPassword) || strings.Contains(c, base64.StdEncoding.EncodeToString([]byte(pullUser+":"+pullPassword))) {
			t.Fatalf("the registry password is on a node's command line: %.200s", c)
		}
	}
	// Again: nothing moves, on either path.
	for _, n := range stage().Nodes {
		if n.BytesSent != 0 || n.BytesPulled != 0 || len(n.Sent) != 0 {
			t.Errorf("second stage on %s moved bytes: %+v", n.Node, n)
		}
	}
	// --via registry: a node that cannot pull is an error naming it.
	opts.Via, opts.Addresses, opts.StageDir = ViaRegistry, opts.Addresses[2:3], filepath.Join(dirs, "forced")
	if _, err := Run(context.Background(), opts); !errors.Is(err, ErrStage) || !strings.Contains(err.Error(), "worker-2: cannot pull from the registry") {
		t.Errorf("--via registry on a node out of reach: %v", err)
	}
}

// A blob whose bytes are not the signed sha256 is refused on the node:
// nothing is renamed into place and nothing half-written is left.
func TestStagePullRefusesWrongBytes(t *testing.T) {
	target, _, r, opts := pullWorld(t, false)
	kubelet, _, _ := target.File("kubelet", "amd64")
	r.spoil["sha256:"+kubelet.SHA256] = true
	dir := t.TempDir()
	opts.Connector, opts.Addresses, opts.StageDir = &shellNodes{cmds: map[string]int{}}, opts.Addresses[1:2], dir
	res, err := Run(context.Background(), opts)
	if !errors.Is(err, ErrStage) || !strings.Contains(err.Error(), "pull kubelet") || !strings.Contains(err.Error(), "signed "+kubelet.SHA256) {
		t.Fatalf("a spoilt blob: %v", err)
	}
	if res.Nodes[0].Path != ViaRegistry {
		t.Errorf("%+v", res.Nodes[0])
	}
	if _, err := os.Stat(filepath.Join(dir, "v1.31.4", "kubelet")); err == nil {
		t.Error("the spoilt kubelet was renamed into place")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "v1.31.4", ".*")); len(left) != 0 {
		t.Errorf("left on the node: %v", left)
	}
}

// A registry that serves more than the recorded size never fills the
// node's disk: curl refuses a longer announced length, and the file size
// limit stops a body whose length was not announced, a little past the
// recorded size; the blob is refused and removed either way.
func TestStagePullRefusesMoreThanRecorded(t *testing.T) {
	for _, announced := range []bool{true, false} {
		t.Run(fmt.Sprintf("announced %v", announced), func(t *testing.T) {
			target, _, r, opts := pullWorld(t, false)
			kubelet, _, _ := target.File("kubelet", "amd64")
			const pad = 256 << 20
			r.pad["sha256:"+kubelet.SHA256], r.padAnnounced = pad, announced
			dir := t.TempDir()
			opts.Connector, opts.Addresses, opts.StageDir = &shellNodes{cmds: map[string]int{}}, opts.Addresses[1:2], dir
			_, err := Run(context.Background(), opts)
			if !errors.Is(err, ErrStage) || !strings.Contains(err.Error(), "pull kubelet") || !strings.Contains(err.Error(), "bytes recorded") {
				t.Fatalf("a blob served with %d bytes more: %v", pad, err)
			}
			r.mu.Lock()
			sent := r.padSent
			r.mu.Unlock()
			// Loopback's socket buffers hold a few MB beyond what curl took.
			if sent > 32<<20 {
				t.Errorf("the node took %d bytes of the padding: no limit held", sent)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "v1.31.4", "*")); len(left) != 0 {
				t.Errorf("staged: %v", left)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "v1.31.4", ".*")); len(left) != 0 {
				t.Errorf("left on the node: %v", left)
			}
		})
	}
}

// A pull cut off mid-file leaves its bytes; the next stage goes on from
// them, by the registry (a ranged request) or over SSH (only the rest is
// sent).
func TestStageResumesACutOffFile(t *testing.T) {
	target, src, r, opts := pullWorld(t, false)
	kubelet, _, _ := target.File("kubelet", "amd64")
	dir := t.TempDir()
	opts.Connector, opts.Addresses, opts.StageDir = &shellNodes{cmds: map[string]int{}}, opts.Addresses[1:2], dir
	r.cut["sha256:"+kubelet.SHA256] = true
	if res0, err := Run(context.Background(), opts); !errors.Is(err, ErrStage) || !strings.Contains(err.Error(), "kubelet") {
		t.Fatalf("a cut-off pull: %v %+v", err, res0)
	}
	partial := filepath.Join(dir, "v1.31.4", ".kubelet."+kubelet.SHA256+".kubelift-partial")
	fi, err := os.Stat(partial)
	if err != nil || fi.Size() == 0 || fi.Size() >= kubelet.Size {
		t.Fatalf("the cut-off pull left %v, %v", fi, err)
	}
	res, err := Run(context.Background(), opts)
	// (kubelet is the first: the files after it are pulled whole now.)
	if err != nil || r.ranged != 1 || len(res.Nodes[0].Present) != 0 || res.Nodes[0].BytesPulled != res.Nodes[0].Bytes-fi.Size() {
		t.Fatalf("resumed pull: %+v, %v; %d ranged requests", res.Nodes[0], err, r.ranged)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "v1.31.4", "kubelet")); !bytes.Equal(got, src.content["kubelet"]) {
		t.Error("the resumed kubelet is not the signed one")
	}
	// Over SSH: a cut-off file's rest only.
	if err := os.WriteFile(partial, src.content["kubelet"][:kubelet.Size/3], 0o644); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, "v1.31.4", "kubelet"))
	opts.Via = ViaSSH
	res, err = Run(context.Background(), opts)
	if err != nil || res.Nodes[0].BytesSent == 0 || res.Nodes[0].BytesSent*10 > kubelet.Size-kubelet.Size/3 || res.Nodes[0].Codec != CodecZstd {
		t.Fatalf("resumed over SSH: %+v, %v (the rest is %d bytes, zstd-encoded as it goes)", res.Nodes[0], err, kubelet.Size-kubelet.Size/3)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "v1.31.4", "kubelet")); !bytes.Equal(got, src.content["kubelet"]) {
		t.Error("the kubelet resumed over SSH is not the signed one")
	}
}

// A node the registry refuses mid-stage is sent the rest over SSH, the
// reason said; a zstd copy that does not decode to the file is not used:
// the node pulls the file itself.
func TestStagePullFallsBack(t *testing.T) {
	target, src, r, opts := pullWorld(t, true)
	kubelet, _, _ := target.File("kubelet", "amd64")
	proxy, _, _ := target.File("kube-proxy", "amd64")
	z, _, err := opts.Source.(NodePuller).ZstdCopy(context.Background(), artifactOf(target, "kubelet"), kubelet.SHA256)
	if err != nil || z == "" {
		t.Fatalf("kubelet's zstd copy: %q %v", z, err)
	}
	r.spoil[z] = true
	dir := t.TempDir()
	opts.Connector, opts.Addresses, opts.StageDir = &shellNodes{cmds: map[string]int{}}, opts.Addresses[1:2], dir
	res, err := Run(context.Background(), opts)
	if err != nil || res.Nodes[0].Path != ViaRegistry {
		t.Fatalf("a spoilt zstd copy: %+v, %v", res.Nodes[0], err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "v1.31.4", "kubelet")); !bytes.Equal(got, src.content["kubelet"]) {
		t.Error("the kubelet is not the signed one")
	}
	// kube-proxy's copy and file both refused mid-stage: SSH for it.
	pz, _, _ := opts.Source.(NodePuller).ZstdCopy(context.Background(), artifactOf(target, "kube-proxy"), proxy.SHA256)
	r.refuse[pz], r.refuse["sha256:"+proxy.SHA256] = true, true
	opts.StageDir = t.TempDir()
	res, err = Run(context.Background(), opts)
	n := res.Nodes[0]
	if err != nil || n.Path != ViaSSH || !strings.Contains(n.PathReason, "the registry refused the node's pull") || n.BytesSent == 0 || n.BytesPulled == 0 {
		t.Fatalf("refused mid-stage: %+v, %v", n, err)
	}
	for _, name := range n.Sent {
		if got, _ := os.ReadFile(filepath.Join(opts.StageDir, "v1.31.4", name)); !bytes.Equal(got, src.content[name]) {
			t.Errorf("%s is not the signed one", name)
		}
	}
}

func artifactOf(t *release.Release, name string) string {
	_, a, _ := t.File(name, "amd64")
	return a
}

// A node that takes its files over SSH is sent the zstd copies import
// pushed beside them, as they are: nothing is fetched whole or compressed
// here. A copy that does not decode to the file on the node is dropped
// and the file sent again, encoded here; so is one whose bytes are not
// the copy's digest when fetched.
func TestStageRelaysTheRegistryCopies(t *testing.T) {
	target, src, r, opts := pullWorld(t, true)
	opts.Connector, opts.Addresses, opts.StageDir, opts.Via = &shellNodes{cmds: map[string]int{}}, opts.Addresses[1:2], t.TempDir(), ViaSSH
	res, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	n := res.Nodes[0]
	var copies int64
	for _, file := range n.Sent {
		f, _, _ := target.File(file, "amd64")
		_, size, err := opts.Source.(NodePuller).ZstdCopy(context.Background(), artifactOf(target, file), f.SHA256)
		if err != nil || size == 0 {
			t.Fatalf("%s's copy: %d bytes, %v", file, size, err)
		}
		copies += size
		if got, _ := os.ReadFile(filepath.Join(opts.StageDir, "v1.31.4", file)); !bytes.Equal(got, src.content[file]) {
			t.Errorf("%s is not the signed one", file)
		}
	}
	if n.Path != ViaSSH || n.Codec != CodecZstd || !strings.Contains(n.CodecReason, "relayed") || len(n.Sent) == 0 || n.BytesSent != copies || src.opens.Load() != 0 {
		t.Fatalf("relayed: %+v; the copies are %d bytes; %d files opened here", n, copies, src.opens.Load())
	}

	// kubelet's copy decodes to kube-proxy (under kubelet's tag and sum:
	// exit 65 on the node), kube-proxy's is cut short (zstd fails: exit
	// 75), kubectl's is spoilt on the way here.
	kubelet, _, _ := target.File("kubelet", "amd64")
	proxy, _, _ := target.File("kube-proxy", "amd64")
	kubectl, _, _ := target.File("kubectl", "amd64")
	pushCopy := func(file string, sum string, content []byte, cut bool) {
		t.Helper()
		var b bytes.Buffer
		if err := codec.Encode(&b, bytes.NewReader(content), codec.Zstd); err != nil {
			t.Fatal(err)
		}
		layer := b.Bytes()
		if cut {
			layer = layer[:len(layer)/2]
		}
		img, err := mutate.Append(empty.Image, mutate.Addendum{Layer: static.NewLayer(layer, codec.ZstdMediaType), MediaType: codec.ZstdMediaType,
			Annotations: map[string]string{codec.AnnotationDecodedSHA256: sum}})
		if err != nil {
			t.Fatal(err)
		}
		repo, _, _ := strings.Cut(artifactOf(target, file), "@")
		tag, err := name.NewTag(repo+":"+codec.ZstdTag(sum), name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(tag, img, remote.WithAuthFromKeychain(r.access(t).Keychain)); err != nil {
			t.Fatal(err)
		}
	}
	pushCopy("kubelet", kubelet.SHA256, src.content["kube-proxy"], false)
	pushCopy("kube-proxy", proxy.SHA256, src.content["kube-proxy"], true)
	kz, _, _ := opts.Source.(NodePuller).ZstdCopy(context.Background(), artifactOf(target, "kubectl"), kubectl.SHA256)
	r.spoil[kz] = true
	var logged bytes.Buffer
	opts.StageDir, opts.CacheDir, opts.Log = t.TempDir(), t.TempDir(), slog.New(slog.NewTextHandler(&logged, nil))
	res, err = Run(context.Background(), opts)
	if err != nil {
		t.Fatalf("a wrong copy, a cut one and a spoilt one: %v", err)
	}
	for _, file := range []string{"kubelet", "kubectl", "kube-proxy"} {
		if got, _ := os.ReadFile(filepath.Join(opts.StageDir, "v1.31.4", file)); !bytes.Equal(got, src.content[file]) {
			t.Errorf("%s is not the signed one", file)
		}
	}
	log := logged.String()
	if src.opens.Load() != 3 || strings.Count(log, "refused or cut off on the node") != 2 || strings.Count(log, "could not be fetched") != 1 {
		t.Errorf("%d files encoded here (want all 3); logged:\n%s", src.opens.Load(), log)
	}
	// The refused copies are not kept here.
	for _, file := range []string{"kubelet", "kube-proxy"} {
		f, _, _ := target.File(file, "amd64")
		z, size, _ := opts.Source.(NodePuller).ZstdCopy(context.Background(), artifactOf(target, file), f.SHA256)
		if st := (&cas.Store{Dir: filepath.Join(opts.CacheDir, "files")}); st.Has(digest.Digest(z), size) {
			t.Errorf("%s's refused copy is still in the cache", file)
		}
	}

	// What a cut-off relay of a wrong copy left on the node is not the
	// file's start: going on from it fails the check, and the file is
	// sent again from its first byte.
	opts.StageDir = t.TempDir()
	vdir := filepath.Join(opts.StageDir, "v1.31.4")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vdir, ".kubelet."+kubelet.SHA256+".kubelift-partial"), bytes.Repeat([]byte("wrong "), 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err = Run(context.Background(), opts)
	if err != nil {
		t.Fatalf("resumed from wrong bytes: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(vdir, "kubelet")); !bytes.Equal(got, src.content["kubelet"]) {
		t.Error("the kubelet is not the signed one")
	}
}
