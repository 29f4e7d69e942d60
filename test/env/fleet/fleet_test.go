package fleet

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/compat"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/pkg/hashskip"
)

const (
	oldVersion = "v1.30.14"
	newVersion = "v1.31.4"
)

// testWorld is a fleet of 1 control-plane node and 2 workers, their Node
// objects and Pods in a fake clientset, and the operator's side: the
// inventory and an SSH dialer built from it, as the CLI builds them.
type testWorld struct {
	fleet   *Fleet
	client  *fake.Clientset
	inv     *nodeaccess.Inventory
	dialer  *nodeaccess.Dialer
	targets []nodeaccess.Address
	nodes   []corev1.Node
	pods    []corev1.Pod
	cat     *catalog.Catalog
}

var specs = []NodeSpec{
	{Name: "cp-1", Address: "127.77.0.1", ControlPlane: true, KubeletVersion: oldVersion, KubeProxy: true},
	{Name: "worker-1", Address: "127.77.0.2", KubeletVersion: oldVersion, KubeProxy: true},
	{Name: "worker-2", Address: "127.77.0.3", KubeletVersion: oldVersion},
}

func newWorld(t *testing.T, binaries map[string]Binary) *testWorld {
	t.Helper()
	w := &testWorld{}
	for _, s := range specs {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Labels: map[string]string{}},
			Status: corev1.NodeStatus{
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}},
				NodeInfo:   corev1.NodeSystemInfo{KubeletVersion: s.KubeletVersion, Architecture: "amd64", OperatingSystem: "linux"},
				Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}, // the inventory overrides it
			}}
		if s.ControlPlane {
			n.Labels["node-role.kubernetes.io/control-plane"] = ""
		}
		w.nodes = append(w.nodes, n)
	}
	w.pods = []corev1.Pod{pod("web", "uid-web", "worker-1", "nginx", "sidecar"), pod("db", "uid-db", "worker-2", "postgres")}
	var objs []runtime.Object
	for i := range w.nodes {
		objs = append(objs, &w.nodes[i])
	}
	for i := range w.pods {
		objs = append(objs, &w.pods[i])
	}
	w.client = fake.NewClientset(objs...)
	// The fake API server serves the Eviction subresource, as every real
	// one does (kubectl's drain helper asks discovery before it evicts).
	w.client.Resources = []*metav1.APIResourceList{{GroupVersion: "v1", APIResources: []metav1.APIResource{
		{Name: "pods/eviction", Kind: "Eviction", Group: "policy", Version: "v1"}}}}
	var err error
	if w.cat, err = catalog.Default(); err != nil {
		t.Fatal(err)
	}
	w.fleet, err = Start(context.Background(), Config{Dir: t.TempDir(), Client: w.client, Binaries: binaries, Log: t.Logf, LeaseRenew: time.Second}, specs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.fleet.Close)
	if w.inv, err = nodeaccess.LoadInventory(w.fleet.Inventory()); err != nil {
		t.Fatal(err)
	}
	opts := append(w.inv.DialerOptions(), nodeaccess.WithAgentSocket(""))
	if w.dialer, err = nodeaccess.NewDialer(w.inv.SSH.KnownHostsFile, opts...); err != nil {
		t.Fatal(err)
	}
	if w.targets, err = nodeaccess.Addresses(w.nodes, w.inv); err != nil {
		t.Fatal(err)
	}
	return w
}

func pod(name string, uid types.UID, node string, containers ...string) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid, CreationTimestamp: metav1.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Image: "registry.example/" + c + ":1",
			Resources:              corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}},
			TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile, ImagePullPolicy: corev1.PullIfNotPresent})
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: c, Ready: true, RestartCount: 2})
	}
	return p
}

func (w *testWorld) target(name string) nodeaccess.Address {
	for _, t := range w.targets {
		if t.Name == name {
			return t
		}
	}
	panic("no target " + name)
}

func (w *testWorld) dial(t *testing.T, name string) nodeaccess.Node {
	t.Helper()
	n, err := w.dialer.Dial(context.Background(), w.target(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// The facts the engine reads: versions of the running units, their flags
// from the unit and environment files, free space, and the containers of
// the node's pods with the hashes the old kubelet computed.
func TestReadFacts(t *testing.T) {
	w := newWorld(t, nil)
	ctx := context.Background()
	cp, err := nodefacts.Read(ctx, w.dial(t, "cp-1"), "cp-1", release.DefaultStageDir, newVersion)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"kubelet": oldVersion, "kube-apiserver": oldVersion, "kube-controller-manager": oldVersion, "kube-scheduler": oldVersion, "kube-proxy": oldVersion}
	if fmt.Sprint(cp.Components) != fmt.Sprint(want) {
		t.Errorf("cp-1 components %v, want %v", cp.Components, want)
	}
	if got := cp.Values["kube-apiserver --etcd-servers"]; got != "https://127.0.0.1:2379" {
		t.Errorf("kube-apiserver --etcd-servers %q", got)
	}
	if got := cp.Programs["kubelet"]; got != "/usr/local/bin/kubelet" {
		t.Errorf("kubelet program %q", got)
	}
	if cp.FreeBytes < 100<<30 {
		t.Errorf("free %d", cp.FreeBytes)
	}
	if cp.ContainersErr != "" || len(cp.Containers) != 0 {
		t.Errorf("cp-1 has no pods: %v %q", cp.Containers, cp.ContainersErr)
	}

	wk, err := nodefacts.Read(ctx, w.dial(t, "worker-1"), "worker-1", release.DefaultStageDir, newVersion)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(wk.Components) != fmt.Sprint(map[string]string{"kubelet": oldVersion, "kube-proxy": oldVersion}) {
		t.Errorf("worker-1 components %v", wk.Components)
	}
	// --kubeconfig is second in kubeadm's KUBELET_KUBECONFIG_ARGS.
	for _, fl := range []string{"--config", "--bootstrap-kubeconfig", "--kubeconfig", "--container-runtime-endpoint", "--node-ip"} {
		if !slices.Contains(wk.Flags["kubelet"], fl) {
			t.Errorf("kubelet flags %v lack %s", wk.Flags["kubelet"], fl)
		}
	}
	if got := wk.Values["kubelet --kubeconfig"]; got != "/etc/kubernetes/kubelet.conf" {
		t.Errorf("--kubeconfig %q", got)
	}
	if src := wk.FlagSources["kubelet --node-ip"]; src != "/var/lib/kubelet/kubeadm-flags.env" {
		t.Errorf("--node-ip from %q", src)
	}
	if got := wk.Values["kubelet --node-ip"]; got != "127.77.0.2" {
		t.Errorf("--node-ip %q", got)
	}
	if len(wk.Staged) != 0 {
		t.Errorf("staged %v before staging", wk.Staged)
	}
	h, err := kubeletcompat.NewHasher(w.cat, oldVersion)
	if err != nil {
		t.Fatal(err)
	}
	if len(wk.Containers) != 2 || wk.ContainersErr != "" {
		t.Fatalf("worker-1 containers %+v %q", wk.Containers, wk.ContainersErr)
	}
	p := w.pods[0]
	for i, c := range wk.Containers {
		spec := &p.Spec.Containers[i]
		hash, _ := h.Hash(spec)
		without, ok, _ := h.HashWithoutResources(spec)
		if !ok {
			t.Fatalf("%s: no hash without resources", oldVersion)
		}
		if c.ID != ContainerID(p.UID, spec.Name) || c.PodUID != string(p.UID) || c.Namespace != "default" || c.Pod != "web" || c.Name != spec.Name || !c.Running {
			t.Errorf("container %d: %+v", i, c)
		}
		if c.Hash != kubeletcompat.Label(hash) || c.HashWithoutResources != kubeletcompat.Label(without) {
			t.Errorf("container %s hashes %s/%s, %s computes %x/%x", c.Name, c.Hash, c.HashWithoutResources, oldVersion, hash, without)
		}
		if !c.StartedAt.Equal(p.CreationTimestamp.Time) {
			t.Errorf("container %s started %v", c.Name, c.StartedAt)
		}
	}
	// A deleted pod's containers are gone.
	if err := w.client.CoreV1().Pods("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		f, err := nodefacts.Read(ctx, w.dial(t, "worker-1"), "worker-1", release.DefaultStageDir, newVersion)
		return err == nil && len(f.Containers) == 0
	})
	if n := w.fleet.Stats().Commands["facts"]; n < 3 {
		t.Errorf("facts counted %d times", n)
	}
}

// waitFor polls cond until it holds (the pod informer is asynchronous);
// the test's own deadline bounds it.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for !cond() {
		if deadline, ok := t.Deadline(); ok && time.Until(deadline) < time.Second {
			t.Fatal("condition never held")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// newTarget is v1.31.4 with random (incompressible) files, so that their
// gzip streams are long enough for the fleet's stream cache; the kubelet
// honours the hash-skip file.
func newTarget(t *testing.T, cat *catalog.Catalog) (*release.Release, *memSource, map[string]Binary) {
	t.Helper()
	rel, err := cat.Lookup(newVersion)
	if err != nil {
		t.Fatal(err)
	}
	r := *rel
	m := &bundle.Manifest{KubernetesVersion: newVersion, Arches: []string{"amd64"}, Release: r}
	src := &memSource{content: map[string][]byte{}}
	bins := map[string]Binary{}
	for _, name := range release.FilesFor(release.RoleControlPlane) {
		content := make([]byte, 200<<10)
		rand.Read(content)
		sum := sha256.Sum256(content)
		f := bundle.File{Name: name, Arch: "amd64", Path: "bin/linux/amd64/" + name, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(content)), HashSkip: name == "kubelet"}
		m.Files = append(m.Files, f)
		src.content[name] = content
		bins[f.SHA256] = Binary{Component: name, Version: newVersion}
	}
	return &release.Release{Version: rel.Parsed(), Manifest: m, Catalog: &r, Record: &cluster.Available{KubernetesVersion: newVersion, BundleDigest: "sha256:abc"}}, src, bins
}

type memSource struct{ content map[string][]byte }

func (s *memSource) Open(_ context.Context, f bundle.File, _ string) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(s.content[f.Name])), nil
}

// The engine's Stage: every file reaches each node's stage directory with
// its sha256, each distinct stream is decompressed once for the fleet,
// and a second Stage sends nothing.
func TestStage(t *testing.T) {
	w := newWorld(t, nil)
	target, src, _ := newTarget(t, w.cat)
	opts := stage.Options{Release: target, Source: src, Nodes: w.nodes, Addresses: w.targets[1:], Connector: w.dialer, Parallel: 2, CacheDir: t.TempDir()}
	res, err := inplace.Stage(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range res.Nodes {
		if strings.Join(ns.Sent, ",") != "kube-proxy,kubectl,kubelet" || ns.BytesSent == 0 {
			t.Errorf("%s: %+v", ns.Node, ns)
		}
		st := w.fleet.Stats().Nodes[ns.Node]
		if st.BytesReceived != ns.BytesSent {
			t.Errorf("%s: received %d bytes, the engine sent %d", ns.Node, st.BytesReceived, ns.BytesSent)
		}
		for _, name := range ns.Sent {
			sum, ok := w.fleet.File(ns.Node, release.StagePath(release.DefaultStageDir, newVersion, name))
			if want := fileSHA(target, name); !ok || sum != want {
				t.Errorf("%s: %s staged as %q, want %s", ns.Node, name, sum, want)
			}
		}
	}
	s := w.fleet.Stats()
	if s.StageCacheMisses != 3 || s.StageCacheHits != 3 {
		t.Errorf("stream cache: %d misses, %d hits; want 3 and 3 (three files, two nodes)", s.StageCacheMisses, s.StageCacheHits)
	}
	// The facts list them too.
	f, err := nodefacts.Read(context.Background(), w.dial(t, "worker-2"), "worker-2", release.DefaultStageDir, newVersion)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Staged) != 3 || f.Staged["kubelet"] != fileSHA(target, "kubelet") {
		t.Errorf("staged %v", f.Staged)
	}
	// Again: nothing sent.
	res, err = inplace.Stage(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range res.Nodes {
		if len(ns.Sent) != 0 || len(ns.Present) != 3 || ns.BytesSent != 0 {
			t.Errorf("second stage %s: %+v", ns.Node, ns)
		}
	}
	if n := w.fleet.Stats().Commands["list staged"]; n != 4 {
		t.Errorf("listed %d times, want 4", n)
	}
}

func fileSHA(t *release.Release, name string) string {
	f, _, _ := t.File(name, "amd64")
	return f.SHA256
}

// stageScript is the command the engine's staging runs: the engine
// checks content before sending it, so only a stream corrupted on the
// way, played here, reaches the node's own check.
func stageScript(vdir, name, sum string) string {
	return nodescript.StageFile.Command(vdir, name, sum, "0", "gzip", "0")
}

// A stream whose content is not the signed sha256 exits 65 with the
// engine's message and leaves nothing staged; one that is, is staged.
func TestStageChecksSHA(t *testing.T) {
	w := newWorld(t, nil)
	n := w.dial(t, "worker-1")
	vdir := "/var/lib/kubelift/staged/" + newVersion
	for _, size := range []int{1 << 10, 300 << 10} { // below and above the stream cache's prefix
		content := make([]byte, size)
		rand.Read(content)
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Write(content)
		zw.Close()
		sum := sha256.Sum256(content)
		good := hex.EncodeToString(sum[:])
		bad := strings.Repeat("0", 64)
		name := fmt.Sprintf("file-%d", size)

		_, err := n.Run(context.Background(), stageScript(vdir, name, bad), bytes.NewReader(gz.Bytes()))
		var exit *nodeaccess.ExitError
		if !errors.As(err, &exit) || exit.Code != 65 || !strings.Contains(exit.Stderr, "sha256 "+good+" on the node, signed "+bad) {
			t.Errorf("size %d, wrong sha: %v", size, err)
		}
		if _, ok := w.fleet.File("worker-1", vdir+"/"+name); ok {
			t.Errorf("size %d: staged despite the wrong sha", size)
		}
		if _, err := n.Run(context.Background(), stageScript(vdir, name, good), bytes.NewReader(gz.Bytes())); err != nil {
			t.Errorf("size %d: %v", size, err)
		}
		if got, ok := w.fleet.File("worker-1", vdir+"/"+name); got != good || !ok {
			t.Errorf("size %d: staged %q", size, got)
		}
	}
	// Not gzip at all.
	_, err := n.Run(context.Background(), stageScript(vdir, "junk", strings.Repeat("0", 64)), strings.NewReader("not gzip"))
	var exit *nodeaccess.ExitError
	if !errors.As(err, &exit) || exit.Code != 65 || !strings.Contains(exit.Stderr, "gzip: stdin") {
		t.Errorf("not gzip: %v", err)
	}
}

// A command no handler plays fails with 127, naming the node and the
// command, and is counted.
func TestCommandNotPlayed(t *testing.T) {
	w := newWorld(t, nil)
	_, err := w.dial(t, "worker-2").Run(context.Background(), "set -e\nreboot --force\necho done", nil)
	var exit *nodeaccess.ExitError
	if !errors.As(err, &exit) || exit.Code != 127 || !strings.HasPrefix(exit.Stderr, "fleet: worker-2: command not played (") || !strings.HasSuffix(exit.Stderr, "): set -e") {
		t.Fatalf("got %v", err)
	}
	if n := w.fleet.Stats().Commands["not played"]; n != 1 {
		t.Errorf("not played counted %d", n)
	}
}

// The client checks every node's host key: a known_hosts file with
// another key for a node is refused before logging in.
func TestHostKeyChecked(t *testing.T) {
	w := newWorld(t, nil)
	tgt := w.target("worker-1")
	if _, err := w.dialer.Dial(context.Background(), tgt); err != nil {
		t.Fatalf("the fleet's known_hosts: %v", err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	key, _ := ssh.NewPublicKey(pub)
	file := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(file, []byte(knownhosts.Line([]string{knownhosts.Normalize(tgt.Addr())}, key)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := nodeaccess.NewDialer(file, append(w.inv.DialerOptions(), nodeaccess.WithAgentSocket(""))...)
	if err != nil {
		t.Fatal(err)
	}
	n, err := d.Dial(context.Background(), tgt)
	var hk *nodeaccess.HostKeyError
	if !errors.As(err, &hk) || !hk.Mismatch {
		if n != nil {
			n.Close()
		}
		t.Fatalf("another host key in known_hosts: %v", err)
	}
}

// The whole engine, unmodified, upgrades the fleet from v1.30.14 to
// v1.31.4: plan, stage, etcd snapshot, control plane, hash-skip file,
// kubelets (each restart patching its Node NotReady at the new version,
// which a stand-in for KWOK's stage brings back Ready), and the containers
// stay the same. Then cleanup removes the hash-skip files.
func TestApply(t *testing.T) {
	target, src, bins := newTarget(t, mustCatalog(t))
	w := newWorld(t, bins)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	restarting := kwok(ctx, t, w.client)

	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	res, err := inplace.Apply(ctx, inplace.ApplyOptions{
		Plan: preflight.PlanOptions{Client: w.client, Target: target, Catalog: w.cat, Connector: w.dialer, Inventory: w.inv, Parallel: 3, HealthWindow: 200 * time.Millisecond,
			MaxUnavailable: "1", Log: log},
		Source: src, CacheDir: t.TempDir(), Settle: time.Millisecond, ReadyTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if res.State == nil || res.State.State != record.StateComplete {
		t.Fatalf("state %+v", res.State)
	}
	// Every kubelet's restart is timed, named by node and unit.
	restarted := map[string]bool{}
	for _, rs := range res.Restarts {
		if rs.Unit == "kubelet" {
			restarted[rs.Node] = true
		}
	}
	if len(restarted) != len(specs) {
		t.Errorf("kubelet restarts timed on %v, want every node's: %+v", restarted, res.Restarts)
	}
	s := w.fleet.Stats()
	if s.Commands["not played"] != 0 {
		t.Errorf("commands not played: %d", s.Commands["not played"])
	}
	for _, name := range []string{"facts", "list staged", "stage file", "etcd snapshot", "back up", "swap", "running version", "crictl ps", "write hash-skip"} {
		if s.Commands[name] == 0 {
			t.Errorf("no %q command played: %v", name, s.Commands)
		}
	}
	for _, spec := range specs {
		if v := w.fleet.Running(spec.Name, "kubelet"); v != newVersion {
			t.Errorf("%s: kubelet runs %q", spec.Name, v)
		}
		if n := s.Nodes[spec.Name].KubeletRestarts(); n != 1 {
			t.Errorf("%s: kubelet restarted %d times", spec.Name, n)
		}
		if got := restarting.versions(spec.Name); fmt.Sprint(got) != fmt.Sprint([]string{newVersion}) {
			t.Errorf("%s: NotReady patches at versions %v", spec.Name, got)
		}
		if _, ok := w.fleet.File(spec.Name, release.DefaultBackupDir+"/"+oldVersion+"/kubelet"); !ok {
			t.Errorf("%s: no kubelet backup", spec.Name)
		}
		data, ok := w.fleet.ReadFile(spec.Name, hashskip.DefaultPath)
		if !ok || !bytes.Contains(data, []byte(newVersion)) {
			t.Errorf("%s: hash-skip file %q", spec.Name, data)
		}
		// kube-proxy moved after the kubelet where it runs as a unit.
		var units []string
		for _, r := range s.Nodes[spec.Name].Restarts {
			units = append(units, r.Unit)
		}
		if spec.KubeProxy {
			if v := w.fleet.Running(spec.Name, "kube-proxy"); v != newVersion {
				t.Errorf("%s: kube-proxy runs %q", spec.Name, v)
			}
			if _, ok := w.fleet.File(spec.Name, release.DefaultBackupDir+"/"+oldVersion+"/kube-proxy"); !ok {
				t.Errorf("%s: no kube-proxy backup", spec.Name)
			}
			if i, j := slices.Index(units, "kubelet"), slices.Index(units, "kube-proxy"); i < 0 || j < i || slices.Contains(units[j+1:], "kube-proxy") {
				t.Errorf("%s: restarts %v, want the kubelet's, then kube-proxy's once", spec.Name, units)
			}
		} else if slices.Contains(units, "kube-proxy") {
			t.Errorf("%s has no kube-proxy, yet restarts %v", spec.Name, units)
		}
	}
	if s.Commands["healthz"] == 0 {
		t.Errorf("kube-proxy's health never read: %v", s.Commands)
	}
	for _, c := range ControlPlaneUnits {
		if v := w.fleet.Running("cp-1", c); v != newVersion {
			t.Errorf("cp-1: %s runs %q", c, v)
		}
	}
	if res.State.Backup == "" || !strings.HasPrefix(res.State.Backup, "cp-1:") {
		t.Errorf("etcd backup %q", res.State.Backup)
	} else if data, ok := w.fleet.ReadFile("cp-1", strings.TrimPrefix(res.State.Backup, "cp-1:")); !ok || !bytes.Contains(data, []byte("simulated etcd snapshot")) {
		t.Errorf("etcd snapshot %q", data)
	}
	// Cleanup removes a hash-skip file once every container's hash is the
	// new kubelet's: at once on cp-1 (no pods), on worker-1 once its old
	// pod is replaced by one the new kubelet created.
	cleanup := func() map[string]compat.NodeCleanup {
		t.Helper()
		out, err := inplace.Cleanup(ctx, compat.CleanupOptions{Client: w.client, Catalog: w.cat, Connector: w.dialer, Inventory: w.inv, Parallel: 3})
		if err != nil {
			t.Fatal(err)
		}
		by := map[string]compat.NodeCleanup{}
		for _, c := range out {
			by[c.Node] = c
		}
		return by
	}
	c := cleanup()
	if !c["cp-1"].Removed || !c["worker-1"].File || c["worker-1"].Removed || c["worker-1"].Old != 2 || c["worker-2"].Removed {
		t.Errorf("first cleanup: %+v", c)
	}
	if _, ok := w.fleet.File("cp-1", hashskip.DefaultPath); ok {
		t.Error("cp-1: hash-skip file still there")
	}
	if err := w.client.CoreV1().Pods("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	web2 := pod("web2", "uid-web2", "worker-1", "nginx")
	if _, err := w.client.CoreV1().Pods("default").Create(ctx, &web2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		f, err := nodefacts.Read(ctx, w.dial(t, "worker-1"), "worker-1", release.DefaultStageDir, newVersion)
		return err == nil && len(f.Containers) == 1 && f.Containers[0].Pod == "web2"
	})
	c = cleanup()
	if !c["worker-1"].Removed || c["worker-1"].Old != 0 || c["worker-2"].Removed || !c["worker-2"].File {
		t.Errorf("second cleanup: %+v", c)
	}
	if n := w.fleet.Stats().Commands["rm"]; n != 2 {
		t.Errorf("rm played %d times, want 2", n)
	}
}

// A kubelet that does not start (its binary is not one the fleet knows)
// never reports Ready at the new version: the engine rolls the node back,
// restoring the old binary, and the restored kubelet reports the old
// version.
func TestApplyRollsBack(t *testing.T) {
	target, src, bins := newTarget(t, mustCatalog(t))
	delete(bins, fileSHA(target, "kubelet"))
	w := newWorld(t, bins)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	restarting := kwok(ctx, t, w.client)
	_, err := inplace.Apply(ctx, inplace.ApplyOptions{
		Plan: preflight.PlanOptions{Client: w.client, Target: target, Catalog: w.cat, Connector: w.dialer, Inventory: w.inv, Parallel: 3, HealthWindow: 200 * time.Millisecond,
			MaxUnavailable: "1", Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))},
		Source: src, CacheDir: t.TempDir(), Settle: time.Millisecond, ReadyTimeout: 2 * time.Second,
	})
	if !errors.Is(err, inplace.ErrNodeFailed) {
		t.Fatalf("apply: %v", err)
	}
	var versions []string
	for _, r := range w.fleet.Stats().Nodes["cp-1"].Restarts {
		if r.Unit == "kubelet" {
			versions = append(versions, r.Version)
		}
	}
	if fmt.Sprint(versions) != fmt.Sprint([]string{"", oldVersion}) {
		t.Errorf("cp-1 kubelet restarts at %q, want the new one failing, then the old one", versions)
	}
	if v := w.fleet.Running("cp-1", "kubelet"); v != oldVersion {
		t.Errorf("cp-1 kubelet runs %q", v)
	}
	if sum, _ := w.fleet.File("cp-1", "/usr/local/bin/kubelet"); sum != OldBinarySHA("kubelet", oldVersion) {
		t.Errorf("cp-1 kubelet binary %s", sum)
	}
	if _, ok := w.fleet.File("cp-1", hashskip.DefaultPath); ok {
		t.Error("the restore left the hash-skip file")
	}
	if got := restarting.versions("cp-1"); fmt.Sprint(got) != fmt.Sprint([]string{oldVersion}) {
		t.Errorf("cp-1 NotReady patches at %v", got)
	}
	if s := w.fleet.Stats(); s.Commands["restore"] != 1 || s.Commands["not played"] != 0 {
		t.Errorf("commands %v", s.Commands)
	}
}

func mustCatalog(t *testing.T) *catalog.Catalog {
	c, err := catalog.Default()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// restarts records the kubelet versions each Node was patched NotReady at.
type restarts struct {
	mu sync.Mutex
	by map[string][]string
}

func (r *restarts) versions(node string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.by[node]...)
}

// kwok stands in for KWOK's node stage: a Node the fleet marked NotReady
// (KubeletRestarting) is made Ready again.
func kwok(ctx context.Context, t *testing.T, c kubernetes.Interface) *restarts {
	return kwokHolding(ctx, t, c, nil)
}

// kwokHolding is kwok, but a Node for which hold says so at the time its
// kubelet restarts stays NotReady (a kubelet that does not come up).
func kwokHolding(ctx context.Context, t *testing.T, c kubernetes.Interface, hold func(node, version string) bool) *restarts {
	r := &restarts{by: map[string][]string{}}
	wi, err := c.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	// Stopped and waited for before the test ends, so it never reports
	// into a finished test.
	t.Cleanup(func() {
		wi.Stop()
		<-done
	})
	go func() {
		defer close(done)
		for ev := range wi.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			for i, cond := range n.Status.Conditions {
				if cond.Type != corev1.NodeReady || cond.Reason != "KubeletRestarting" || cond.Status != corev1.ConditionFalse {
					continue
				}
				if hold != nil && hold(n.Name, n.Status.NodeInfo.KubeletVersion) {
					continue
				}
				r.mu.Lock()
				r.by[n.Name] = append(r.by[n.Name], n.Status.NodeInfo.KubeletVersion)
				r.mu.Unlock()
				n = n.DeepCopy()
				n.Status.Conditions[i] = corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
					LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}
				if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
					t.Errorf("kwok: %v", err) // the test has not ended: Cleanup waits for this goroutine
				}
			}
		}
	}()
	return r
}
