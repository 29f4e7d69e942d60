package preflight_test

import (
	"strings"
	"testing"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/preflight/preflighttest"
)

// A binary cluster's etcd member behind the etcd the bundle carries is
// planned to move (plan says from, to and the nodes); to 3.6 from a 3.5
// below 3.5.32 blocks, naming the node and the way there; the etcd step
// is staged on control-plane nodes; a bundle without etcd plans nothing.
func TestEtcdPlannedWhereTheBundleCarriesIt(t *testing.T) {
	w := preflighttest.New(t)
	cp := w.View.Facts["cp-1"]
	cp.Etcd, cp.Programs = "v3.5.35", map[string]string{"etcd": "/usr/local/bin/etcd"}
	cp.Values["etcd --advertise-client-urls"] = "http://10.0.0.1:2379"
	m := w.Opts.Target.Manifest
	for _, f := range m.Files {
		cp.Staged[f.Name] = f.SHA256
	}
	staged := func(p *preflight.Plan) bool {
		for _, n := range p.Nodes {
			if n.Name == "cp-1" {
				return n.Staged
			}
		}
		return false
	}
	if p := w.Plan(t); p.Etcd != nil || len(preflighttest.Only(p, preflight.CheckEtcd)) > 0 || !staged(p) {
		t.Fatalf("a bundle without etcd: etcd %+v, findings %+v, staged %v", p.Etcd, preflighttest.Only(p, preflight.CheckEtcd), staged(p))
	}
	// Without etcd in the bundle, the members are not even read: a unit
	// that says its client URLs some other way blocks nothing.
	delete(cp.Values, "etcd --advertise-client-urls")
	cp.EtcdUnread = `etcd --version "etcd Version: 3.6.0-rc.1": a pre-release`
	if p := w.Plan(t); p.Blocked || len(preflighttest.Only(p, preflight.CheckEtcd)) > 0 {
		t.Fatalf("a bundle without etcd, a unit kubelift cannot read: findings %+v", preflighttest.Only(p, preflight.CheckEtcd))
	}
	cp.Values["etcd --advertise-client-urls"], cp.EtcdUnread = "http://10.0.0.1:2379", ""

	m.Files = append(m.Files, bundle.File{Name: "etcd", Version: "v3.6.16", Arch: "amd64", Path: "bin/linux/amd64/etcd-v3.6.16-linux-amd64.tar.gz", SHA256: strings.Repeat("e", 64), Size: 1 << 20})
	p := w.Plan(t)
	if p.Etcd == nil || p.Etcd.From != "v3.5.35" || p.Etcd.To != "v3.6.16" || strings.Join(p.Etcd.Nodes, ",") != "cp-1" {
		t.Fatalf("etcd move %+v", p.Etcd)
	}
	if staged(p) {
		t.Errorf("cp-1 counts as staged without etcd's archive")
	}
	// One member loses its quorum while it restarts, and cp-1's API server
	// (v1.30.14, tracing on by default) passes the leader's handover on:
	// said, not blocked; with tracing off, only the quorum is said.
	if p.Blocked {
		t.Errorf("the move blocks: %+v", preflighttest.Only(p, preflight.CheckEtcd))
	}
	preflighttest.Want(t, preflighttest.Only(p, preflight.CheckEtcd), preflight.Warning, "etcd", "one member (cp-1)", "quorum")
	preflighttest.Want(t, preflighttest.Only(p, preflight.CheckEtcd), preflight.Warning, "etcd", "cp-1 (v1.30.14)", "leader changed")
	cp.Values["kube-apiserver --feature-gates"] = "APIServerTracing=false"
	if fs := preflighttest.Only(w.Plan(t), preflight.CheckEtcd); len(fs) != 1 || strings.Contains(fs[0].Message, "leader changed") {
		t.Errorf("with APIServerTracing=false: %+v, want the quorum's warning alone", fs)
	}
	cp.Staged["etcd"] = strings.Repeat("e", 64)
	if p := w.Plan(t); !staged(p) {
		t.Errorf("cp-1 with etcd's archive staged counts as not staged")
	}

	cp.Etcd = "v3.5.24"
	p = w.Plan(t)
	if !p.Blocked || p.Etcd != nil {
		t.Fatalf("from 3.5.24: blocked %v, etcd %+v", p.Blocked, p.Etcd)
	}
	preflighttest.Want(t, preflighttest.Only(p, preflight.CheckEtcd), preflight.Blocking, "etcd", "cp-1 (etcd v3.5.24)", "v3.5.32", "--etcd v3.5.PATCH")
}
