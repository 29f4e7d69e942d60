package stage

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/cas"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// shellNodes are nodes whose commands run in /bin/sh on this machine (the
// stage directory is the test's), so Stage's node-side script runs for
// real; nodeaccess and the engine tests cover SSH itself. A node named in
// down cannot be reached.
type shellNodes struct {
	down map[string]bool
	// env adds to a node's environment (a proxy that goes nowhere keeps
	// its curl from the registry).
	env  map[string][]string
	mu   sync.Mutex
	cmds map[string]int
	// ran holds every command, for what must not be in them.
	ran []string
}

func (c *shellNodes) Dial(_ context.Context, t nodeaccess.Address) (nodeaccess.Node, error) {
	if c.down[t.Name] {
		return nil, &nodeaccess.Error{Node: t.Name, Address: t.Addr(), Op: "dial", Err: errors.New("connection refused")}
	}
	return &shellNode{c: c, name: t.Name}, nil
}

type shellNode struct {
	c    *shellNodes
	name string
}

func (n *shellNode) Run(ctx context.Context, cmd string, stdin io.Reader) ([]byte, error) {
	n.c.mu.Lock()
	n.c.cmds[n.name]++
	n.c.ran = append(n.c.ran, cmd)
	env := n.c.env[n.name]
	n.c.mu.Unlock()
	c := exec.CommandContext(ctx, "/bin/sh", "-c", cmd)
	c.Env = append(os.Environ(), env...)
	c.Stdin = stdin
	var errb bytes.Buffer
	c.Stderr = &errb
	out, err := c.Output()
	if err != nil {
		return out, &nodeaccess.ExitError{Code: c.ProcessState.ExitCode(), Stderr: errb.String()}
	}
	return out, nil
}

func (n *shellNode) Upload(context.Context, string, os.FileMode, io.Reader) (int64, error) {
	return 0, errors.New("not used")
}
func (n *shellNode) Stream(context.Context, string, io.Writer) (int64, error) {
	return 0, errors.New("not used")
}
func (n *shellNode) Close() error { return nil }

// memSource serves files from memory, counting opens.
type memSource struct {
	content map[string][]byte
	opens   atomic.Int64
}

func (s *memSource) Open(_ context.Context, f bundle.File, _ string) (io.ReadCloser, error) {
	s.opens.Add(1)
	if c, ok := s.content[f.Path]; ok {
		return io.NopCloser(bytes.NewReader(c)), nil
	}
	return io.NopCloser(bytes.NewReader(s.content[f.Name])), nil
}

func stageWorld(t *testing.T) (*release.Release, *memSource, []corev1.Node, []nodeaccess.Address) {
	t.Helper()
	cat, err := catalog.Default()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := cat.Lookup("v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	m := &bundle.Manifest{KubernetesVersion: "v1.31.4", Arches: []string{"amd64"}, Release: *rel}
	src := &memSource{content: map[string][]byte{}}
	for _, name := range release.FilesFor(release.RoleControlPlane) {
		content := bytes.Repeat([]byte(name+" binary "), 20000)
		sum := sha256.Sum256(content)
		m.Files = append(m.Files, bundle.File{Name: name, Arch: "amd64", Path: "bin/linux/amd64/" + name, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(content))})
		src.content[name] = content
	}
	target := &release.Release{Version: rel.Parsed(), Manifest: m, Catalog: rel, Record: &cluster.Available{KubernetesVersion: "v1.31.4", BundleDigest: "sha256:abc"}}
	var nodes []corev1.Node
	var addrs []nodeaccess.Address
	for _, name := range []string{"cp-1", "worker-1", "worker-2"} {
		role := release.RoleWorker
		if name == "cp-1" {
			role = release.RoleControlPlane
		}
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"node-role.kubernetes.io/" + role: ""}}}
		n.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "v1.30.14", Architecture: "amd64"}
		nodes = append(nodes, n)
		addrs = append(addrs, nodeaccess.Address{Name: name, Role: role, Address: "10.0.0.1"})
	}
	return target, src, nodes, addrs
}

func TestStageSendsOnceChecksAndSkips(t *testing.T) {
	target, src, nodes, tgts := stageWorld(t)
	dirs := t.TempDir()
	// Each node's stage directory is its own below dirs: the same path for
	// every node would be one directory here.
	conn := &shellNodes{cmds: map[string]int{}}
	opts := Options{Release: target, Source: src, Nodes: nodes, Addresses: tgts[:1], Connector: conn, Parallel: 2,
		StageDir: filepath.Join(dirs, "cp-1"), CacheDir: t.TempDir()}
	res, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	n := res.Nodes[0]
	if strings.Join(n.Sent, ",") != "kube-apiserver,kube-controller-manager,kube-proxy,kube-scheduler,kubectl,kubelet" || n.BytesSent == 0 || n.BytesSent*10 > n.Bytes {
		t.Errorf("first stage: %+v (sent compressed)", n)
	}
	for name, content := range src.content {
		got, err := os.ReadFile(filepath.Join(dirs, "cp-1", "v1.31.4", name))
		if err != nil || !bytes.Equal(got, content) {
			t.Errorf("%s staged wrong (%v)", name, err)
		}
		if fi, _ := os.Stat(filepath.Join(dirs, "cp-1", "v1.31.4", name)); fi == nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s mode %v", name, fi)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dirs, "cp-1", "v1.31.4", ".*.kubelift-partial*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	// Beside each file, the sum the node checked, for list-staged.
	if sums, _ := filepath.Glob(filepath.Join(dirs, "cp-1", "v1.31.4", ".*.kubelift-sum")); len(sums) != 6 {
		t.Errorf("checked sums beside the files: %v", sums)
	}
	opens := src.opens.Load()
	// Again: nothing is sent, nothing fetched.
	res, err = Run(context.Background(), opts)
	if err != nil || res.Nodes[0].BytesSent != 0 || len(res.Nodes[0].Sent) != 0 || len(res.Nodes[0].Present) != 6 || src.opens.Load() != opens {
		t.Errorf("second stage: %+v, %v; opened %d more", res.Nodes[0], err, src.opens.Load()-opens)
	}
	// A staged file changed after its sum was written is hashed again,
	// found wrong and sent again; one whose recorded sum is not a sum is
	// hashed (and found right).
	kubectl := filepath.Join(dirs, "cp-1", "v1.31.4", "kubectl")
	future := time.Now().Add(time.Minute)
	if err := os.WriteFile(kubectl, []byte("changed on the node"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(kubectl, future, future); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirs, "cp-1", "v1.31.4", ".kubelet.kubelift-sum"), []byte("not a sum\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err = Run(context.Background(), opts)
	if err != nil || strings.Join(res.Nodes[0].Sent, ",") != "kubectl" || len(res.Nodes[0].Present) != 5 {
		t.Errorf("stage after a change on the node: %+v, %v", res.Nodes[0], err)
	}
	if got, _ := os.ReadFile(kubectl); !bytes.Equal(got, src.content["kubectl"]) {
		t.Error("kubectl not staged again")
	}
	opens = src.opens.Load()
	// A worker gets its role's files; each file is fetched once, however
	// many nodes need it.
	opts.Addresses, opts.StageDir = tgts[1:2], filepath.Join(dirs, "worker-1")
	res, err = Run(context.Background(), opts)
	if err != nil || strings.Join(res.Nodes[0].Sent, ",") != "kube-proxy,kubectl,kubelet" || src.opens.Load() != opens {
		t.Errorf("worker: %+v, %v; fetched %d more", res.Nodes[0], err, src.opens.Load()-opens)
	}
}

// Content that does not match the signed sha256 never reaches a node, and
// a file corrupted on the way is refused by the node's own check.
func TestStageRefusesWrongContent(t *testing.T) {
	target, src, nodes, tgts := stageWorld(t)
	src.content["kubelet"] = []byte("tampered")
	dir := t.TempDir()
	_, err := Run(context.Background(), Options{Release: target, Source: src, Nodes: nodes, Addresses: tgts[1:2],
		Connector: &shellNodes{cmds: map[string]int{}}, StageDir: dir, CacheDir: t.TempDir()})
	if !errors.Is(err, ErrStage) || !strings.Contains(err.Error(), "bin/linux/amd64/kubelet") {
		t.Fatalf("tampered source: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "v1.31.4", "kubelet")); err == nil {
		t.Error("a tampered kubelet was staged")
	}
	// The node-side check: a compressed file whose content is not the
	// signed one is refused, and nothing is left.
	f := target.Manifest.Files[0]
	other := bytes.Repeat([]byte("o"), int(f.Size))
	_, err = (&shellNode{c: &shellNodes{cmds: map[string]int{}}}).Run(context.Background(),
		nodescript.StageFile.Command(dir+"/v1.31.4", f.Name, f.SHA256, strconv.FormatInt(f.Size, 10), "gzip", "0"), bytes.NewReader(gzipped(t, other)))
	var ee *nodeaccess.ExitError
	if !errors.As(err, &ee) || ee.Code != 65 || !strings.Contains(ee.Stderr, "signed "+f.SHA256) {
		t.Fatalf("node-side check: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "v1.31.4", "*")); len(left) != 0 {
		t.Errorf("left on the node: %v", left)
	}
	hidden, _ := filepath.Glob(filepath.Join(dir, "v1.31.4", ".*"))
	if len(hidden) != 0 {
		t.Errorf("temporary file left on the node: %v", hidden)
	}
}

// One unreachable node is named; the others are staged.
func TestStageUnreachableNode(t *testing.T) {
	target, src, nodes, tgts := stageWorld(t)
	res, err := Run(context.Background(), Options{Release: target, Source: src, Nodes: nodes, Addresses: tgts[1:],
		Connector: &shellNodes{cmds: map[string]int{}, down: map[string]bool{"worker-2": true}}, StageDir: t.TempDir(), CacheDir: t.TempDir()})
	if !errors.Is(err, ErrStage) || !strings.Contains(err.Error(), "worker-2") || !strings.Contains(err.Error(), "1 of 2 nodes") {
		t.Fatalf("err %v", err)
	}
	for _, n := range res.Nodes {
		if (n.Node == "worker-2") != (n.Error != "") || (n.Node == "worker-1" && len(n.Sent) != 3) {
			t.Errorf("%+v", n)
		}
	}
}

func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// A bundle with hops: control-plane nodes get each hop's control-plane
// programs under StageDir/HOP as well; workers only the target's files.
func TestStageHops(t *testing.T) {
	target, src, nodes, tgts := stageWorld(t)
	hop := &release.Release{Version: catalog.Version{Major: 1, Minor: 30, Patch: 14}, Manifest: &bundle.Manifest{KubernetesVersion: "v1.30.14"}}
	for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"} {
		content := bytes.Repeat([]byte(name+" v1.30.14 "), 1000)
		sum := sha256.Sum256(content)
		p := "hops/v1.30.14/bin/linux/amd64/" + name
		hop.Manifest.Files = append(hop.Manifest.Files, bundle.File{Name: name, Arch: "amd64", Path: p, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(content))})
		src.content[p] = content
	}
	target.Hops = []*release.Release{hop}
	dirs := t.TempDir()
	opts := Options{Release: target, Source: src, Nodes: nodes, Addresses: tgts[:1], Connector: &shellNodes{cmds: map[string]int{}},
		StageDir: filepath.Join(dirs, "cp-1"), CacheDir: t.TempDir()}
	res, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(res.Nodes[0].Sent, ","); got != "kube-apiserver,kube-controller-manager,kube-proxy,kube-scheduler,kubectl,kubelet,v1.30.14/kube-apiserver,v1.30.14/kube-controller-manager,v1.30.14/kube-scheduler" {
		t.Errorf("sent %s", got)
	}
	for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		got, err := os.ReadFile(filepath.Join(dirs, "cp-1", "v1.30.14", name))
		if err != nil || !bytes.Equal(got, src.content["hops/v1.30.14/bin/linux/amd64/"+name]) {
			t.Errorf("hop's %s staged wrong (%v)", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dirs, "cp-1", "v1.30.14", "kubelet")); err == nil {
		t.Error("the hop's kubelet was staged: kubelets go straight to the target")
	}
	opts.Addresses, opts.StageDir = tgts[1:2], filepath.Join(dirs, "worker-1")
	if res, err = Run(context.Background(), opts); err != nil || strings.Join(res.Nodes[0].Sent, ",") != "kube-proxy,kubectl,kubelet" {
		t.Errorf("worker: %+v, %v", res.Nodes[0], err)
	}
}

func TestFasterWay(t *testing.T) {
	for _, c := range []struct {
		link, encode, ratio float64
		want                string
	}{
		{link: 12e6, encode: 400e6, ratio: 0.3, want: CodecZstd},   // 100 Mbit/s
		{link: 117e6, encode: 400e6, ratio: 0.3, want: CodecZstd},  // 1 Gbit/s
		{link: 1100e6, encode: 400e6, ratio: 0.3, want: CodecNone}, // 10 Gbit/s, loopback
		{link: 400e6, encode: 400e6, ratio: 0.3, want: CodecNone},  // a tie: nothing to wait for
		{link: 117e6, encode: 90e6, ratio: 0.3, want: CodecNone},   // a slow machine
		{link: 12e6, encode: 400e6, ratio: 0.95, want: CodecNone},  // nothing to gain: compressed already
	} {
		got, reason := fasterWay(CodecZstd, c.link, c.encode, c.ratio)
		if got != c.want || !strings.Contains(reason, fmt.Sprintf("%.0f MB/s as", c.link/1e6)) || !strings.Contains(reason, fmt.Sprintf("%.0f MB/s here, to %.2fx", c.encode/1e6, c.ratio)) {
			t.Errorf("link %.0f, encoding %.0f, ratio %.2f: %s (%s), want %s", c.link, c.encode, c.ratio, got, reason, c.want)
		}
	}
}

// The rest of a file after the codec's probe is encoded once for every
// node: the same file at the same offset is made once, and decodes to the
// file from there.
func TestEncodedFromOnceForAll(t *testing.T) {
	target, src, _, _ := stageWorld(t)
	f, _, _ := target.File("kubelet", "amd64")
	c := &encodedCache{store: &cas.Store{Dir: filepath.Join(t.TempDir(), "files")}, dir: t.TempDir(), source: src, log: slog.New(slog.DiscardHandler)}
	off := f.Size / 3
	p, err := c.encodedFrom(context.Background(), f, "", CodecZstd, off)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	opens := src.opens.Load()
	if again, err := c.encodedFrom(context.Background(), f, "", CodecZstd, off); err != nil || again != p || src.opens.Load() != opens {
		t.Fatalf("again: %s %v, %d opens more", again, err, src.opens.Load()-opens)
	}
	if fi2, _ := os.Stat(p); fi2 == nil || !fi2.ModTime().Equal(fi.ModTime()) {
		t.Error("the encoded rest was made again")
	}
	var out bytes.Buffer
	in, _ := os.Open(p)
	defer in.Close()
	if err := decodeZstd(&out, in); err != nil || !bytes.Equal(out.Bytes(), src.content["kubelet"][off:]) {
		t.Fatalf("decodes to %d bytes, want the %d from %d on: %v", out.Len(), f.Size-off, off, err)
	}
}

// With --codec auto and files encoded here (a bundle file's), the first
// file big enough is measured: its first bytes go as they are and stay on
// the node, the rest follows in the codec chosen, and every file arrives
// whole; what was sent is the probe once, never again.
func TestStageMeasuresTheCodec(t *testing.T) {
	target, src, nodes, tgts := stageWorld(t)
	// kubelet big enough to measure, and not all alike (so zstd's bytes
	// differ from the file's).
	big := make([]byte, 6<<20)
	for i := range big {
		big[i] = byte(i*7 + i/4096)
	}
	m := target.Manifest
	for i := range m.Files {
		if m.Files[i].Name == "kubelet" {
			sum := sha256.Sum256(big)
			m.Files[i].SHA256, m.Files[i].Size = hex.EncodeToString(sum[:]), int64(len(big))
		}
	}
	src.content["kubelet"] = big
	conn := &shellNodes{cmds: map[string]int{}}
	opts := Options{Release: target, Source: src, Nodes: nodes, Addresses: tgts[1:2], Connector: conn,
		StageDir: t.TempDir(), CacheDir: t.TempDir()}
	res, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	n := res.Nodes[0]
	if !strings.HasPrefix(n.CodecReason, "measured on the first megabytes: the link took ") || (n.Codec != CodecNone && n.Codec != CodecZstd && n.Codec != CodecGzip) {
		t.Fatalf("codec %q: %q", n.Codec, n.CodecReason)
	}
	for _, name := range n.Sent {
		if got, err := os.ReadFile(filepath.Join(opts.StageDir, "v1.31.4", name)); err != nil || !bytes.Equal(got, src.content[name]) {
			t.Errorf("%s staged wrong (%v)", name, err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(opts.StageDir, "v1.31.4", ".*.kubelift-partial*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	// kubelet went in two parts: the probe, and the rest from its end.
	var parts []string
	for _, cmd := range conn.ran {
		if sc, args, err := nodescript.Parse(cmd); err == nil && sc.Name == "stage-file" && args[1] == "kubelet" {
			parts = append(parts, args[4]+"@"+args[5])
		}
	}
	probe := strconv.Itoa(len(big) / 8)
	if strings.Join(parts, ",") != "none@0,"+n.Codec+"@"+probe {
		t.Errorf("kubelet was sent as %v, want the probe (none@0) and the rest (%s@%s)", parts, n.Codec, probe)
	}
	// Sent as they are, the files' bytes at most (the probe's counted
	// once); encoded, fewer.
	if n.Codec == CodecNone && n.BytesSent < int64(len(big)) || n.BytesSent > n.Bytes {
		t.Errorf("%s: sent %d bytes of %d (kubelet %d)", n.Codec, n.BytesSent, n.Bytes, len(big))
	}

	// Going on from a cut-off kubelet: no probe; it is finished in the
	// node's codec, and says why it was not measured.
	kubelet, _, _ := target.File("kubelet", "amd64")
	vdir := filepath.Join(opts.StageDir, "v1.31.4")
	if err := os.Remove(filepath.Join(vdir, "kubelet")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vdir, ".kubelet."+kubelet.SHA256+".kubelift-partial"), big[:1000], 0o644); err != nil {
		t.Fatal(err)
	}
	res, err = Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if n := res.Nodes[0]; n.CodecReason != "not measured: the stage went on from a file a stage had cut off" || strings.Join(n.Sent, ",") != "kubelet" {
		t.Errorf("resumed: %+v", n)
	}
	if got, _ := os.ReadFile(filepath.Join(vdir, "kubelet")); !bytes.Equal(got, big) {
		t.Error("kubelet staged wrong after going on")
	}
}

func decodeZstd(w io.Writer, r io.Reader) error {
	zr, err := zstd.NewReader(r)
	if err != nil {
		return err
	}
	defer zr.Close()
	_, err = io.Copy(w, zr)
	return err
}

// A bundle with a node stack stages containerd's archive and runc on the
// nodes that run an older containerd, beside the release's files, and
// not on one that runs the bundle's; a node whose runtime version does
// not parse is refused, naming the node, the field and the value.
func TestStageRuntimeParts(t *testing.T) {
	target, src, nodes, tgts := stageWorld(t)
	for _, p := range []struct{ name, version string }{{release.FileContainerd, "v2.3.7"}, {release.FileRunc, "v1.5.2"}} {
		content := bytes.Repeat([]byte(p.name+" "+p.version+" "), 1000)
		sum := sha256.Sum256(content)
		path := "stack/linux/amd64/" + p.name
		target.Manifest.Files = append(target.Manifest.Files, bundle.File{Name: p.name, Version: p.version, Arch: "amd64", Path: path, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(content))})
		src.content[path] = content
	}
	nodes[1].Status.NodeInfo.ContainerRuntimeVersion = "containerd://1.7.35"
	nodes[2].Status.NodeInfo.ContainerRuntimeVersion = "containerd://2.3.7"
	dirs := t.TempDir()
	opts := Options{Release: target, Source: src, Nodes: nodes, Connector: &shellNodes{cmds: map[string]int{}}, CacheDir: t.TempDir()}
	for i, want := range map[int]string{1: "containerd,kube-proxy,kubectl,kubelet,runc", 2: "kube-proxy,kubectl,kubelet"} {
		opts.Addresses, opts.StageDir = tgts[i:i+1], filepath.Join(dirs, tgts[i].Name)
		res, err := Run(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(res.Nodes[0].Sent, ","); got != want {
			t.Errorf("%s: sent %s, want %s", tgts[i].Name, got, want)
		}
	}
	got, err := os.ReadFile(release.StagePath(filepath.Join(dirs, "worker-1"), "v1.31.4", release.FileContainerd))
	if err != nil || !bytes.Equal(got, src.content["stack/linux/amd64/containerd"]) {
		t.Errorf("containerd staged wrong (%v)", err)
	}

	nodes[1].Status.NodeInfo.ContainerRuntimeVersion = "containerd://1.7.35; rm -rf /"
	opts.Addresses, opts.StageDir = tgts[1:2], filepath.Join(dirs, "worker-1b")
	_, err = Run(context.Background(), opts)
	if err == nil || !strings.Contains(err.Error(), "worker-1") || !strings.Contains(err.Error(), "containerRuntimeVersion") || !strings.Contains(err.Error(), "rm -rf") {
		t.Errorf("a runtime version that does not parse: %v", err)
	}
}
