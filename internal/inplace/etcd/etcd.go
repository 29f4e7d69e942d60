// Package etcd moves a binary cluster's etcd to the bundle's, one member
// at a time, as etcd's own upgrade guides ask: every member healthy and
// one leader before each member moves and after it, the leader last;
// each member's programs backed up, swapped for the bundle's and its unit
// restarted (etcd hands off its leadership on the way down); and puts a
// move back for a rollback while no member has moved a minor (past that,
// a member of the older minor cannot rejoin: the way back is etcd's
// downgrade or the snapshot, docs/etcd.md). Plan says whether a cluster
// may move at all: one minor at a time, and to 3.6 only from 3.5.32 on.
// The runbook says when (its "etcd" step, after the snapshot and before
// the control plane); this room says how.
package etcd

import (
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// Unit is the systemd unit of a member (nodefacts reads it on every node).
const Unit = nodefacts.Etcd

// Floor36 is the oldest 3.5 from which etcd's v3.6 upgrade guide lets a
// member move to 3.6 (upgrades/upgrade_3_6.md): older 3.5s can keep a
// learner's promotion or a removed member only in the v2 store, which
// 3.6 no longer reads (etcd#19557, #20793, #20967).
var Floor36 = catalog.Version{Major: 3, Minor: 5, Patch: 32}

// Member is one member of a binary cluster's etcd, as its node said:
// the node runs it as the unit etcd.
type Member struct {
	Node    string
	Version catalog.Version
	// ClientURL is the first of the member's --advertise-client-urls.
	ClientURL string
	// Dir is where its programs are (its running program's directory):
	// the bundle's etcd, etcdctl and etcdutl go there.
	Dir string
	// CA, Cert and Key are the node's API server's etcd client
	// certificates (--etcd-cafile, --etcd-certfile, --etcd-keyfile), each
	// "" when not given: etcdctl asks the members with them.
	CA, Cert, Key string
}

// Down says the member's unit does not run: its node said no version.
func (mb Member) Down() bool { return mb.Version == (catalog.Version{}) }

// Members are the etcd members the facts of nodes show, in nodes' order:
// each control-plane node with the etcd unit, its Version zero where the unit does not
// run. A member whose version, client URL or program the node did not
// say, or said in a form refused here (where an etcd move takes them, not
// where the facts are read: a cluster that moves no etcd never needs
// them), is an error naming the node, the field and the value.
func Members(nodes []nodeaccess.Address, facts map[string]*nodefacts.Facts) ([]Member, error) {
	var out []Member
	for _, a := range nodes {
		n := a.Name
		if a.Role != release.RoleControlPlane {
			continue
		}
		f := facts[n]
		if f == nil || (f.Etcd == "" && f.Units[Unit] == "") {
			continue
		}
		if f.EtcdUnread != "" {
			return nil, fmt.Errorf("node %s: %s", n, f.EtcdUnread)
		}
		var v catalog.Version
		if f.Etcd != "" {
			var err error
			if v, err = catalog.ParseReported(f.Etcd); err != nil {
				return nil, fmt.Errorf("node %s: etcd version: %w", n, err)
			}
		}
		urls := f.Values["etcd --advertise-client-urls"]
		prog := f.Programs[Unit]
		if urls == "" || prog == "" {
			return nil, fmt.Errorf("node %s has an etcd unit, but says no --advertise-client-urls or program for it", n)
		}
		u, _, _ := strings.Cut(urls, ",")
		if bad := nodefacts.CheckEndpoint(n, "etcd --advertise-client-urls", u); bad != nil {
			return nil, bad
		}
		if bad := nodefacts.CheckPath(n, "etcd program", prog); bad != nil {
			return nil, bad
		}
		out = append(out, Member{Node: n, Version: v, ClientURL: u, Dir: path.Dir(prog),
			CA: f.Values["kube-apiserver --etcd-cafile"], Cert: f.Values["kube-apiserver --etcd-certfile"], Key: f.Values["kube-apiserver --etcd-keyfile"]})
	}
	return out, nil
}

// Move is the move of a cluster's etcd the bundle makes.
type Move struct {
	// From is the oldest member's version, To the bundle's.
	From, To catalog.Version
	// Nodes are the members' nodes that move (those before To), in the
	// nodes' order; the leader goes last when they move.
	Nodes []string
}

// NewMove is the move from one version to another of nodes, as a record
// or plan wrote them; a version that does not parse is an error naming it.
func NewMove(from, to string, nodes []string) (*Move, error) {
	f, err := catalog.ParseVersion(from)
	if err != nil {
		return nil, fmt.Errorf("etcd move from %q: %w", from, err)
	}
	t, err := catalog.ParseVersion(to)
	if err != nil {
		return nil, fmt.Errorf("etcd move to %q: %w", to, err)
	}
	return &Move{From: f, To: t, Nodes: nodes}, nil
}

// Minor says a member moves a minor (3.5 to 3.6): past that, the move is
// not put back by a rollback.
func (m *Move) Minor() bool { return m.From.Minor != m.To.Minor }

// String is the move in words.
func (m *Move) String() string {
	return fmt.Sprintf("etcd %s -> %s on %s, one member at a time", m.From, m.To, strings.Join(m.Nodes, ", "))
}

// Plan is the move of members to the bundle's etcd to: nil when every
// member runs to or a later etcd (a member is never moved back). It
// refuses a member that does not run (moving another could cost the
// cluster its quorum), one more than one minor behind (etcd moves one
// minor at a time) and, to 3.6, a 3.5 member older than Floor36, naming
// the nodes and what to do first.
func Plan(members []Member, to catalog.Version) (*Move, error) {
	var m *Move
	var down, skip, low []string
	for _, mb := range members {
		if mb.Version.Compare(to) >= 0 {
			continue
		}
		switch {
		case mb.Down():
			down = append(down, mb.Node)
		case mb.Version.Major != to.Major || to.Minor-mb.Version.Minor > 1:
			skip = append(skip, fmt.Sprintf("%s (etcd %s)", mb.Node, mb.Version))
		case to.Minor == 6 && mb.Version.Minor == 5 && mb.Version.Compare(Floor36) < 0:
			low = append(low, fmt.Sprintf("%s (etcd %s)", mb.Node, mb.Version))
		}
		if m == nil {
			m = &Move{From: mb.Version, To: to}
		}
		if mb.Version.Compare(m.From) < 0 {
			m.From = mb.Version
		}
		m.Nodes = append(m.Nodes, mb.Node)
	}
	sort.Strings(skip)
	sort.Strings(low)
	switch {
	case len(down) > 0:
		return nil, fmt.Errorf("the etcd unit does not run on %s: every member must be up and healthy before one moves; start it (or wait for a restart to end) and plan again; where an upgrade stopped while it moved that member, upgrade rollback puts the member's old etcd back", strings.Join(down, ", "))
	case len(skip) > 0:
		return nil, fmt.Errorf("etcd moves one minor at a time, and the bundle's is %s: %s; move them to %d.%d first (a bundle made with --etcd v%d.%d.PATCH)",
			to, strings.Join(skip, ", "), to.Major, to.Minor-1, to.Major, to.Minor-1)
	case len(low) > 0:
		return nil, fmt.Errorf("etcd %s takes members only from %s on (etcd's v3.6 upgrade guide): %s; move every member to the newest 3.5 patch first (a bundle made with --etcd v3.5.PATCH), then to %s",
			to, Floor36, strings.Join(low, ", "), to)
	}
	return m, nil
}

// Planned is a move as a plan shows it (upgrade plan -o json: etcd).
type Planned struct {
	From  string   `json:"from"`
	To    string   `json:"to"`
	Nodes []string `json:"nodes"`
}

// PlanFor plans the move of members to the etcd t carries for arch (the
// members' nodes' architecture): nil where t carries none, or no member
// is behind it; an error where it cannot move them (Plan) or its etcd's
// version does not parse.
func PlanFor(t *release.Release, members []Member, arch string) (*Planned, error) {
	if t == nil || t.Manifest == nil || len(members) == 0 {
		return nil, nil
	}
	f, _, ok := t.File(File, release.ArchOr(arch))
	if !ok {
		return nil, nil
	}
	to, err := catalog.ParseVersion(f.Version)
	if err != nil {
		return nil, fmt.Errorf("the %s bundle's etcd (%s): version %q: %w", t.Version, f.Path, f.Version, err)
	}
	m, err := Plan(members, to)
	if err != nil || m == nil {
		return nil, err
	}
	return &Planned{From: m.From.String(), To: m.To.String(), Nodes: m.Nodes}, nil
}
