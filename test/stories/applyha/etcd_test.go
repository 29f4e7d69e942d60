package applyha

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/etcd"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/test/env/kube"
)

// apiProbe asks the API server, 10 times a second each, for /readyz and
// for a ConfigMap (the upgrade's record, kube-system/kubelift-upgrade:
// NotFound before the run writes it is an answer too) until the record
// says the control plane moves: the etcd step's window and the steps
// before it, in which etcd's members restart one at a time and no request
// may fail. Bounded: it stops by itself after 15 minutes.
//
// The sandbox's API servers run with APIServerTracing=false: through
// v1.33 the gate's etcd tracing replaces the etcd client's retries, and
// the leader's handover then fails a read in flight, or the /readyz etcd
// check for a second (etcd.Unretried; plan warns of it). With the
// default gate, earlier runs of this story lost 1 of 1,162 reads so, and
// another 11 of 842 /readyz answers.
type apiProbe struct {
	stop, done chan struct{}
	mu         sync.Mutex
	asked      int
	failed     []string
	etcdStep   bool // the record said the etcd step's time (it names a snapshot)
}

func startAPIProbe(t *testing.T) *apiProbe {
	t.Helper()
	cfg, err := h.SB.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst, cfg.Timeout = 100, 100, 5*time.Second // the probe's own pace, not client-go's default 5/s
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &apiProbe{stop: make(chan struct{}), done: make(chan struct{})}
	go p.run(c)
	return p
}

func (p *apiProbe) run(c kubernetes.Interface) {
	defer close(p.done)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	end := time.After(15 * time.Minute)
	for {
		select {
		case <-p.stop:
			return
		case <-end:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, rerr := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cm, gerr := c.CoreV1().ConfigMaps("kube-system").Get(ctx, record.Name, metav1.GetOptions{})
		cancel()
		now := time.Now().Format("15:04:05.0")
		p.mu.Lock()
		p.asked += 2
		for what, err := range map[string]error{"/readyz": rerr, "configmap": gerr} {
			if err != nil && !apierrors.IsNotFound(err) {
				p.failed = append(p.failed, fmt.Sprintf("%s %s: %.300v", now, what, err))
			}
		}
		var st record.Upgrade
		if gerr == nil && json.Unmarshal([]byte(cm.Data["state.json"]), &st) != nil {
			p.failed = append(p.failed, fmt.Sprintf("%s configmap: state.json does not parse", now))
		}
		moving := st.State == record.StateUpgradingControlPlane || st.State == record.StateUpgradedControlPlane || st.State == record.StateUpgradingKubelets
		p.etcdStep = p.etcdStep || st.Backup != ""
		p.mu.Unlock()
		if moving {
			return
		}
	}
}

// Stop ends the probe and checks that no request failed while it ran,
// and that it saw the etcd step's time.
func (p *apiProbe) Stop(t *testing.T) {
	t.Helper()
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	t.Logf("the API through etcd's move: %d requests, %d failed", p.asked, len(p.failed))
	if len(p.failed) > 0 {
		t.Errorf("the API failed %d of %d requests while etcd moved:\n  %s", len(p.failed), p.asked, strings.Join(p.failed, "\n  "))
	}
	if !p.etcdStep {
		t.Error("the probe never saw the record name a snapshot: it stopped before the etcd step")
	}
}

// etcdStatus is what every member says of itself, asked over SSH on cp-1
// as an operator would (the member's own etcdctl, read as the engine
// reads it).
func etcdStatus(t *testing.T) []etcd.Status {
	t.Helper()
	var eps []string
	for _, m := range h.SB.Nodes() {
		if m.Role == "control-plane" {
			eps = append(eps, "http://"+m.Address+":2379")
		}
	}
	out := h.SSH(t, "cp-1", "ETCDCTL_API=3 /usr/local/bin/etcdctl --endpoints="+strings.Join(eps, ",")+" endpoint status -w json")
	st, err := etcd.ParseStatus("cp-1", out)
	if err != nil || len(st) != len(eps) {
		t.Fatalf("etcdctl endpoint status: %v (%d of %d members)\n%s", err, len(st), len(eps), out)
	}
	return st
}

// leaderNode is the node whose member leads, as st says.
func leaderNode(t *testing.T, st []etcd.Status) string {
	t.Helper()
	for _, s := range st {
		if s.ID == s.Leader {
			for _, m := range h.SB.Nodes() {
				if s.Endpoint == "http://"+m.Address+":2379" {
					return m.Name
				}
			}
		}
	}
	t.Fatalf("no member leads: %+v", st)
	return ""
}

// etcdMoved checks apply moved every member to newEtcd, one at a time
// with the one that led before last (its log), that every member runs it
// now, and that the snapshot taken first was kept in snapshots, whole:
// etcd's own etcdutl reads it.
func etcdMoved(t *testing.T, said, leader, snapshots string) {
	t.Helper()
	var order []string
	for _, line := range strings.Split(said, "\n") {
		if strings.Contains(line, `msg="etcd member moved"`) {
			f := strings.Fields(line[strings.Index(line, "node="):])
			order = append(order, strings.TrimPrefix(f[0], "node="))
		}
	}
	if len(order) != 3 || order[2] != leader {
		t.Errorf("etcd members moved in the order %v; want all three, %s (the leader) last", order, leader)
	}
	for _, s := range etcdStatus(t) {
		if s.Version.String() != newEtcd {
			t.Errorf("member %s runs etcd %s, want %s", s.Endpoint, s.Version, newEtcd)
		}
	}
	copies, err := filepath.Glob(filepath.Join(snapshots, "cp-1-etcd-snapshot-*.db"))
	if err != nil || len(copies) != 1 {
		t.Fatalf("the snapshot's copy in %s: %v, %v", snapshots, copies, err)
	}
	dir, err := kube.Addon(context.Background(), "etcd", newEtcd)
	if err != nil {
		t.Fatal(err)
	}
	// etcdutl may write beside the file it reads: a copy of the copy.
	tmp := filepath.Join(t.TempDir(), "snapshot.db")
	data, err := os.ReadFile(copies[0])
	if err == nil {
		err = os.WriteFile(tmp, data, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(dir, "etcdutl"), "snapshot", "status", tmp, "-w", "json").CombinedOutput()
	var status struct {
		Revision  int64 `json:"revision"`
		TotalKeys int   `json:"totalKey"`
	}
	if err != nil || json.Unmarshal(out, &status) != nil || status.TotalKeys == 0 {
		t.Errorf("etcdutl snapshot status of the copy: %v\n%s", err, out)
	}
	t.Logf("the snapshot kept off cp-1: %d keys at revision %d", status.TotalKeys, status.Revision)
	snapshotPushed(t, copies[0], data)
}

// snapshotRepo is where apply pushes the etcd snapshot's copy: the
// sandbox's private registry.
func snapshotRepo() string { return h.SB.Registry.Address + "/kubelift/etcd-snapshots" }

// snapshotPushed checks that the copy of the snapshot, data, is in the
// private registry as apply's artifact, tagged with its name: read back
// as a user would, from the admin machine with the registry's user.
func snapshotPushed(t *testing.T, copy string, data []byte) {
	t.Helper()
	opts, err := h.SB.RegistryOptions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(snapshotRepo() + ":" + filepath.Base(copy))
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref, opts...)
	if err != nil {
		t.Fatalf("the snapshot's artifact %s: %v", ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	sum := fmt.Sprintf("%x", sha256.Sum256(data))
	if string(m.Config.MediaType) != driver.SnapshotArtifact.Type || len(m.Layers) != 1 || m.Layers[0].Digest.Hex != sum || m.Layers[0].Size != int64(len(data)) {
		t.Errorf("the snapshot's artifact %s: %+v, want one layer of sha256 %s, %d bytes", ref, m, sum, len(data))
	}
}
