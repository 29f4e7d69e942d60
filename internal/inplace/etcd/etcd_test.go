package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
	"github.com/kubelift/kubelift/internal/waiter"
)

func v(s string) catalog.Version {
	x, err := catalog.ParseVersion(s)
	if err != nil {
		panic(err)
	}
	return x
}

// members are members at versions ("" for one whose unit does not run).
func members(versions ...string) []Member {
	var out []Member
	for i, ver := range versions {
		var at catalog.Version
		if ver != "" {
			at = v(ver)
		}
		out = append(out, Member{Node: fmt.Sprintf("cp-%d", i+1), Version: at, ClientURL: fmt.Sprintf("http://10.0.0.%d:2379", i+1), Dir: "/usr/local/bin"})
	}
	return out
}

// Plan moves the members behind the bundle's etcd, one minor at a time,
// and to 3.6 only from 3.5.32 on (etcd's v3.6 upgrade guide), naming the
// nodes that hold it back and what to do first.
func TestPlanKeepsEtcdsVersionPath(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members []Member
		to      string
		nodes   string // "" for no move
		err     string
	}{
		{"3.5.35 to 3.6", members("v3.5.35", "v3.5.35", "v3.5.35"), "v3.6.16", "cp-1,cp-2,cp-3", ""},
		{"one moved already", members("v3.6.16", "v3.5.35", "v3.5.32"), "v3.6.16", "cp-2,cp-3", ""},
		{"a patch", members("v3.5.24", "v3.5.24", "v3.5.24"), "v3.5.35", "cp-1,cp-2,cp-3", ""},
		{"at the bundle's", members("v3.6.16", "v3.6.16", "v3.6.16"), "v3.6.16", "", ""},
		{"past the bundle's", members("v3.6.16"), "v3.5.35", "", ""},
		{"below the floor", members("v3.5.35", "v3.5.24", "v3.5.31"), "v3.6.16",
			"", "takes members only from v3.5.32 on (etcd's v3.6 upgrade guide): cp-2 (etcd v3.5.24), cp-3 (etcd v3.5.31); move every member to the newest 3.5 patch first"},
		{"a minor skipped", members("v3.4.23"), "v3.6.16", "", "etcd moves one minor at a time, and the bundle's is v3.6.16: cp-1 (etcd v3.4.23); move them to 3.5 first"},
		{"a member down", members("v3.5.35", "", "v3.5.35"), "v3.6.16", "", "the etcd unit does not run on cp-2: every member must be up and healthy before one moves"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Plan(tc.members, v(tc.to))
			switch {
			case tc.err != "":
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
			case err != nil:
				t.Fatal(err)
			case tc.nodes == "" && m != nil:
				t.Fatalf("a move %v, want none", m)
			case tc.nodes != "" && (m == nil || strings.Join(m.Nodes, ",") != tc.nodes || m.To != v(tc.to)):
				t.Fatalf("move %+v, want %s to %s", m, tc.nodes, tc.to)
			}
		})
	}
}

// ParseStatus reads etcdctl's JSON as 3.5 and 3.6 print it; a version
// that does not parse is refused, naming the node, the member and the
// value.
func TestParseStatus(t *testing.T) {
	out := `[{"Endpoint":"http://10.0.0.1:2379","Status":{"header":{"cluster_id":17237436991929493444,"member_id":9372538179322589801,"revision":53,"raft_term":2},"version":"3.5.35","dbSize":1093632,"leader":9372538179322589801,"raftIndex":722,"raftTerm":2,"raftAppliedIndex":722,"dbSizeInUse":1093632}},` +
		`{"Endpoint":"http://10.0.0.2:2379","Status":{"header":{"member_id":12070283437478170524},"version":"3.6.16","leader":9372538179322589801,"storageVersion":"3.6.0"}}]`
	st, err := ParseStatus("cp-1", out)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || st[0].ID != 9372538179322589801 || st[0].Leader != st[0].ID || st[1].Version != v("v3.6.16") || st[1].Endpoint != "http://10.0.0.2:2379" {
		t.Fatalf("%+v", st)
	}
	if st, err := ParseStatus("cp-1", "\n"); err != nil || st != nil {
		t.Errorf("no member answered: %v, %v", st, err)
	}
	_, err = ParseStatus("cp-1", strings.Replace(out, `"3.6.16"`, `"3.6.16$(reboot)"`, 1))
	if err == nil || !strings.Contains(err.Error(), `node cp-1: etcd member http://10.0.0.2:2379: version "3.6.16$(reboot)"`) {
		t.Errorf("a forged version: %v", err)
	}
}

// cluster is three members on fake nodes: etcd-status answers what each
// runs and who leads, etcd-swap restarts a member at the bundle's
// version (a leader hands its leadership to the next member on the way
// down), etcd-restore puts its old version back.
type cluster struct {
	mu       sync.Mutex
	versions map[string]string // node -> version
	backedUp map[string]string
	leader   string
	order    []string // the scripts that changed a node, "SCRIPT NODE"
	// comesBack false: a swapped member does not answer again.
	comesBack bool
	// elsewhere: the cluster has a fourth member, on no control-plane node;
	// lone: it has cp-1 alone.
	elsewhere, lone bool
	// restoreDown: a member put back does not answer either.
	restoreDown bool
	// lag: a member put back answers at its new version for this many
	// status reads more (its restart queued); overlaps counts the
	// restores made while another's restart was still under way.
	lag      int
	lagging  map[string]int
	prev     map[string]string
	overlaps int
}

func (c *cluster) node(name string) *fakenode.Node {
	return &fakenode.Node{Scripts: map[string]fakenode.Handler{
		"etcd-status": func([]string) (string, error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			var st []map[string]any
			for i, n := range []string{"cp-1", "cp-2", "cp-3"} {
				ver := c.versions[n]
				if c.lagging[n] > 0 {
					c.lagging[n]--
					ver = c.prev[n]
				}
				if ver == "down" {
					continue
				}
				st = append(st, map[string]any{"Endpoint": fmt.Sprintf("http://10.0.0.%d:2379", i+1),
					"Status": map[string]any{"header": map[string]any{"member_id": i + 1}, "version": strings.TrimPrefix(ver, "v"), "leader": int(c.leader[3] - '0')}})
			}
			b, _ := json.Marshal(st)
			return "### members\n" + c.memberList() + "\n### status\n" + string(b) + "\n", nil
		},
		"etcd-swap": func([]string) (string, error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.order = append(c.order, "swap "+name)
			if _, ok := c.backedUp[name]; !ok {
				c.backedUp[name] = c.versions[name]
			}
			c.versions[name] = "v3.6.16"
			if !c.comesBack {
				c.versions[name] = "down"
			}
			if c.leader == name {
				c.leader = map[string]string{"cp-1": "cp-2", "cp-2": "cp-3", "cp-3": "cp-1"}[name]
			}
			return "", nil
		},
		"etcd-restore": func([]string) (string, error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			old, ok := c.backedUp[name]
			if !ok {
				return "### none\n", nil
			}
			if c.versions[name] == old { // put back already, and running
				return "### same\n", nil
			}
			c.order = append(c.order, "restore "+name)
			for n, left := range c.lagging {
				if n != name && left > 0 {
					c.overlaps++
				}
			}
			if c.lag > 0 {
				if c.lagging == nil {
					c.lagging, c.prev = map[string]int{}, map[string]string{}
				}
				c.lagging[name], c.prev[name] = c.lag, c.versions[name]
			}
			c.versions[name] = old
			if c.restoreDown {
				c.versions[name] = "down"
			}
			return "", nil
		},
	}}
}

// memberList is etcdctl member list -w json: the three members, and any
// the cluster has beyond them.
func (c *cluster) memberList() string {
	ids := []string{`{"ID":1,"name":"cp-1"}`, `{"ID":2,"name":"cp-2"}`, `{"ID":3,"name":"cp-3"}`}
	if c.lone {
		ids = ids[:1]
	}
	if c.elsewhere {
		ids = append(ids, `{"ID":4,"name":"etcd-4"}`)
	}
	return `{"header":{"cluster_id":1},"members":[` + strings.Join(ids, ",") + `]}`
}

func (c *cluster) mover(t *testing.T, m *Move) Mover {
	nodes := map[string]*fakenode.Node{}
	for _, n := range []string{"cp-1", "cp-2", "cp-3"} {
		nodes[n] = c.node(n)
	}
	var ms []Member
	for i, n := range []string{"cp-1", "cp-2", "cp-3"} {
		var ver catalog.Version // a unit that does not run: no version (Members)
		if c.versions[n] != "down" {
			ver = v(c.versions[n])
		}
		ms = append(ms, Member{Node: n, Version: ver, ClientURL: fmt.Sprintf("http://10.0.0.%d:2379", i+1), Dir: "/usr/local/bin"})
	}
	return Mover{Members: ms, Move: m, Snapshot: true, SHA256: func(string) string { return strings.Repeat("a", 64) },
		OnNode: func(ctx context.Context, node string, fn func(context.Context, *nodeops.Ops) error) error {
			return fn(ctx, &nodeops.Ops{Node: nodes[node], Name: node, StageDir: "/var/lib/kubelift/staged", BackupDir: "/var/lib/kubelift/backup", From: "v1.31.4", To: "v1.31.14", Facts: &nodefacts.Facts{}})
		},
		Wait: waiter.Waiter{}, Timeout: 3 * time.Second, Event: func(context.Context, string, string, string) {},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// MoveAll moves the followers first and the leader last, each once the
// cluster is healthy; a run that resumes moves only those not moved.
func TestMoveAllLeaderLast(t *testing.T) {
	c := &cluster{versions: map[string]string{"cp-1": "v3.5.35", "cp-2": "v3.5.35", "cp-3": "v3.5.35"}, backedUp: map[string]string{}, leader: "cp-1", comesBack: true}
	mv := &Move{From: v("v3.5.35"), To: v("v3.6.16"), Nodes: []string{"cp-1", "cp-2", "cp-3"}}
	if err := c.mover(t, mv).MoveAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.order, ", "); got != "swap cp-2, swap cp-3, swap cp-1" {
		t.Errorf("moved %s, want the leader (cp-1) last", got)
	}
	c.order = nil
	if err := c.mover(t, mv).MoveAll(context.Background()); err != nil || len(c.order) != 0 {
		t.Errorf("again: %v, moved %v", err, c.order)
	}
}

// A member that does not come back is put back while no other member runs
// the new minor; past that it is left, and the error says where to look.
func TestMoveAllPutsBackAMemberThatDoesNotComeBack(t *testing.T) {
	c := &cluster{versions: map[string]string{"cp-1": "v3.5.35", "cp-2": "v3.5.35", "cp-3": "v3.5.35"}, backedUp: map[string]string{}, leader: "cp-1"}
	mv := &Move{From: v("v3.5.35"), To: v("v3.6.16"), Nodes: []string{"cp-1", "cp-2", "cp-3"}}
	err := c.mover(t, mv).MoveAll(context.Background())
	if err == nil || !strings.Contains(err.Error(), "node cp-2: etcd v3.6.16") || !strings.Contains(err.Error(), "the old etcd is back") {
		t.Fatalf("err = %v", err)
	}
	if got := strings.Join(c.order, ", "); got != "swap cp-2, restore cp-2" || c.versions["cp-2"] != "v3.5.35" {
		t.Errorf("did %s, cp-2 at %s", got, c.versions["cp-2"])
	}

	// The old etcd is restarted without waiting (etcd-restore: --no-block):
	// "back" only once the cluster is healthy again.
	c = &cluster{versions: map[string]string{"cp-1": "v3.5.35", "cp-2": "v3.5.35", "cp-3": "v3.5.35"}, backedUp: map[string]string{}, leader: "cp-1", restoreDown: true}
	err = c.mover(t, mv).MoveAll(context.Background())
	if err == nil || !strings.Contains(err.Error(), "node cp-2: the old etcd is put back, and etcd is not healthy: member cp-2") || strings.Contains(err.Error(), "the old etcd is back") {
		t.Errorf("a member down after its put-back: %v", err)
	}

	c = &cluster{versions: map[string]string{"cp-1": "v3.5.35", "cp-2": "v3.6.16", "cp-3": "v3.5.35"}, backedUp: map[string]string{}, leader: "cp-1"}
	err = c.mover(t, &Move{From: v("v3.5.35"), To: v("v3.6.16"), Nodes: []string{"cp-1", "cp-3"}}).MoveAll(context.Background())
	if err == nil || !strings.Contains(err.Error(), "its old etcd is not put back, since the cluster's version may have moved to v3.6 already") {
		t.Fatalf("err = %v", err)
	}
	if got := strings.Join(c.order, ", "); got != "swap cp-3" {
		t.Errorf("did %s", got)
	}
}

// A rollback puts a patch move back, member by member; a minor move stays
// once a member runs the new minor.
func TestPutBack(t *testing.T) {
	c := &cluster{versions: map[string]string{"cp-1": "v3.5.35", "cp-2": "v3.5.35", "cp-3": "v3.5.35"}, backedUp: map[string]string{"cp-1": "v3.5.32", "cp-2": "v3.5.32", "cp-3": "v3.5.32"}, leader: "cp-1", comesBack: true}
	if err := c.mover(t, &Move{From: v("v3.5.32"), To: v("v3.5.35")}).PutBack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.order, ", "); got != "restore cp-1, restore cp-2, restore cp-3" || c.versions["cp-3"] != "v3.5.32" {
		t.Errorf("did %s", got)
	}

	c = &cluster{versions: map[string]string{"cp-1": "v3.6.16", "cp-2": "v3.5.35", "cp-3": "v3.5.35"}, backedUp: map[string]string{"cp-1": "v3.5.35"}, leader: "cp-2", comesBack: true}
	if err := c.mover(t, &Move{From: v("v3.5.35"), To: v("v3.6.16")}).PutBack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(c.order) != 0 || c.versions["cp-1"] != "v3.6.16" {
		t.Errorf("a minor move was put back: %v", c.order)
	}

	// etcd-restore only queues the restart: the next member's waits
	// until the one before answers at its old version again.
	// (Three reads: the wait for the cluster before the next restore
	// reads too.)
	c = &cluster{versions: map[string]string{"cp-1": "v3.5.35", "cp-2": "v3.5.35", "cp-3": "v3.5.32"}, backedUp: map[string]string{"cp-1": "v3.5.32", "cp-2": "v3.5.32"}, leader: "cp-1", comesBack: true, lag: 3}
	if err := c.mover(t, &Move{From: v("v3.5.32"), To: v("v3.5.35")}).PutBack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c.overlaps != 0 || len(c.order) != 2 {
		t.Errorf("restarts overlapped %d times (did %v)", c.overlaps, c.order)
	}
	// A rollback run again restarts nothing (etcd-restore: ### same).
	if err := c.mover(t, &Move{From: v("v3.5.32"), To: v("v3.5.35")}).PutBack(context.Background()); err != nil || len(c.order) != 2 {
		t.Errorf("put back again: %v, did %v", err, c.order)
	}

	// A run killed while cp-2's new etcd would not start left it down: it
	// is put back first, though the cluster is not healthy without it.
	c = &cluster{versions: map[string]string{"cp-1": "v3.5.35", "cp-2": "down", "cp-3": "v3.5.35"}, backedUp: map[string]string{"cp-2": "v3.5.35"}, leader: "cp-1", comesBack: true}
	if err := c.mover(t, &Move{From: v("v3.5.35"), To: v("v3.6.16")}).PutBack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.order, ", "); got != "restore cp-2" || c.versions["cp-2"] != "v3.5.35" {
		t.Errorf("did %s, cp-2 at %s", got, c.versions["cp-2"])
	}

	// Two members down (a patch move): each is put back before the
	// cluster is asked to be healthy, which it is not while one is down.
	c = &cluster{versions: map[string]string{"cp-1": "v3.5.35", "cp-2": "down", "cp-3": "down"}, backedUp: map[string]string{"cp-2": "v3.5.32", "cp-3": "v3.5.32"}, leader: "cp-1", comesBack: true}
	if err := c.mover(t, &Move{From: v("v3.5.32"), To: v("v3.5.35")}).PutBack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.order, ", "); got != "restore cp-2, restore cp-3" || c.versions["cp-3"] != "v3.5.32" {
		t.Errorf("two members down: did %s, cp-3 at %s", got, c.versions["cp-3"])
	}

	// A lone member down after a move of a minor may have moved the
	// cluster's version: not put back, and the error says why.
	c = &cluster{versions: map[string]string{"cp-1": "down", "cp-2": "down", "cp-3": "down"}, backedUp: map[string]string{"cp-1": "v3.5.35"}, leader: "cp-1", comesBack: true, lone: true}
	m := c.mover(t, &Move{From: v("v3.5.35"), To: v("v3.6.16")})
	m.Members = m.Members[:1]
	if err := m.PutBack(context.Background()); err == nil || !strings.Contains(err.Error(), "no member's unit runs") || len(c.order) != 0 {
		t.Errorf("a lone member down past a minor: %v, did %v", err, c.order)
	}
}

// Members are the control-plane nodes with an etcd unit, running or not
// (one that does not run is a member the plan must not move past), each
// with the client URL, program and client certificates its node said.
func TestMembers(t *testing.T) {
	facts := map[string]*nodefacts.Facts{
		"cp-1": {Etcd: "v3.5.35", Units: map[string]string{"etcd": "/etc/systemd/system/etcd.service"}, Programs: map[string]string{"etcd": "/opt/etcd/bin/etcd"},
			Values: map[string]string{"etcd --advertise-client-urls": "https://10.0.0.1:2379,https://127.0.0.1:2379", "kube-apiserver --etcd-cafile": "/etc/etcd/ca.pem"}},
		"cp-2": {Units: map[string]string{"etcd": "/etc/systemd/system/etcd.service"}, Programs: map[string]string{"etcd": "/opt/etcd/bin/etcd"},
			Values: map[string]string{"etcd --advertise-client-urls": "https://10.0.0.2:2379"}},
		"cp-3": {Units: map[string]string{}, Values: map[string]string{}},
	}
	cp := func(names ...string) []nodeaccess.Address {
		var out []nodeaccess.Address
		for _, n := range names {
			out = append(out, nodeaccess.Address{Name: n, Role: release.RoleControlPlane})
		}
		return append(out, nodeaccess.Address{Name: "worker-1", Role: release.RoleWorker})
	}
	facts["worker-1"] = facts["cp-1"] // a worker's etcd is none of kubelift's
	ms, err := Members(cp("cp-1", "cp-2", "cp-3"), facts)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0] != (Member{Node: "cp-1", Version: v("v3.5.35"), ClientURL: "https://10.0.0.1:2379", Dir: "/opt/etcd/bin", CA: "/etc/etcd/ca.pem"}) ||
		ms[1].Node != "cp-2" || ms[1].Version != (catalog.Version{}) {
		t.Fatalf("members %+v", ms)
	}
	for field, change := range map[string]func(){
		`etcd --advertise-client-urls "https://10.0.0.2:2379;reboot" refused`: func() {
			facts["cp-2"].Values["etcd --advertise-client-urls"] = "https://10.0.0.2:2379;reboot"
		},
		`etcd --version "etcd Version: 3.6.0-rc.1"`: func() { facts["cp-2"].EtcdUnread = `etcd --version "etcd Version: 3.6.0-rc.1": a pre-release` },
	} {
		change()
		if _, err := Members(cp("cp-1", "cp-2"), facts); err == nil || !strings.Contains(err.Error(), "node cp-2: "+field) {
			t.Errorf("%s: %v", field, err)
		}
		facts["cp-2"].Values["etcd --advertise-client-urls"], facts["cp-2"].EtcdUnread = "https://10.0.0.2:2379", ""
	}
	delete(facts["cp-2"].Values, "etcd --advertise-client-urls")
	if _, err := Members(cp("cp-1", "cp-2"), facts); err == nil || !strings.Contains(err.Error(), "node cp-2 has an etcd unit, but says no --advertise-client-urls") {
		t.Errorf("a member without a client URL: %v", err)
	}
}

// Health is every member of the cluster's list answering at a URL of its
// own and naming the same leader among them: a member that knows no
// leader, two URLs answered by one member, or a member on a machine
// kubelift does not see stop the move before anything restarts.
func TestMoveAllWaitsForAHealthyCluster(t *testing.T) {
	mv := &Move{From: v("v3.5.35"), To: v("v3.6.16"), Nodes: []string{"cp-1", "cp-2", "cp-3"}}
	for name, tc := range map[string]struct {
		change func(*cluster, *Mover)
		want   string
	}{
		"a member elsewhere": {func(c *cluster, _ *Mover) { c.elsewhere = true }, "the cluster lists member 4, which is none of the control-plane nodes' etcd units"},
		"no leader":          {func(c *cluster, _ *Mover) { c.leader = "cp-0" }, "knows no leader"},
		"one URL, two members": {func(_ *cluster, m *Mover) { m.Members[1].ClientURL = m.Members[0].ClientURL },
			"member cp-2 (http://10.0.0.1:2379) answers as member 1, as another member's URL does"},
		"a minor without a snapshot": {func(_ *cluster, m *Mover) { m.Snapshot = false }, "it needs the snapshot taken first"},
	} {
		t.Run(name, func(t *testing.T) {
			c := &cluster{versions: map[string]string{"cp-1": "v3.5.35", "cp-2": "v3.5.35", "cp-3": "v3.5.35"}, backedUp: map[string]string{}, leader: "cp-1", comesBack: true}
			m := c.mover(t, mv)
			m.Timeout = time.Second
			tc.change(c, &m)
			if err := m.MoveAll(context.Background()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if len(c.order) != 0 {
				t.Errorf("moved %v", c.order)
			}
		})
	}
}

// A lone member that does not come back at a new minor is not put back:
// alone, it moves the cluster's version at once.
func TestALoneMemberIsNotPutBackPastAMinor(t *testing.T) {
	c := &cluster{versions: map[string]string{"cp-1": "v3.5.35", "cp-2": "v3.5.35", "cp-3": "v3.5.35"}, backedUp: map[string]string{}, leader: "cp-1"}
	m := c.mover(t, &Move{From: v("v3.5.35"), To: v("v3.6.16"), Nodes: []string{"cp-1"}})
	m.Members = m.Members[:1]
	c.versions["cp-2"], c.versions["cp-3"], c.lone = "down", "down", true // a one-member cluster
	err := m.MoveAll(context.Background())
	if err == nil || !strings.Contains(err.Error(), "its old etcd is not put back") || strings.Join(c.order, ", ") != "swap cp-1" {
		t.Fatalf("err = %v, did %v", err, c.order)
	}
}
