package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// Status is what one member says of itself (etcdctl endpoint status).
type Status struct {
	Endpoint string
	ID       uint64
	Leader   uint64
	Version  catalog.Version
}

// Cluster is what the cluster says of itself: the members it lists
// (etcdctl member list: their IDs) and what each member asked at its
// client URL says (Status).
type Cluster struct {
	Listed []uint64
	Status []Status
}

// healthy waits, bounded by Timeout, until the cluster is healthy (check),
// asked from node; it returns what it said.
func (m Mover) healthy(ctx context.Context, node string) (Cluster, error) {
	var c Cluster
	err := m.Wait.Poll(ctx, time.Second, m.Timeout, func(ctx context.Context) error {
		var err error
		if c, err = m.status(ctx, node); err == nil {
			err = m.check(c, Member{}, catalog.Version{})
		}
		return err
	})
	if err != nil {
		return Cluster{}, fmt.Errorf("etcd is not healthy: %w", err)
	}
	return c, nil
}

// check says what keeps c from being a healthy cluster whose every member
// is one of m.Members: a member of theirs that does not answer at its
// client URL, or answers as another does; one that knows no leader, or
// names another than the rest; a member the cluster lists that is none
// of theirs (on a machine kubelift does not see: moving the others could
// cost the quorum while it is down); a leader not among them. And, for
// mb, that it runs at least to.
func (m Mover) check(c Cluster, mb Member, to catalog.Version) error {
	if len(c.Listed) == 0 {
		return errors.New("the cluster lists no members (etcdctl member list said nothing)")
	}
	var leader uint64
	answered := map[uint64]bool{}
	for _, want := range m.Members {
		s, ok := find(c.Status, want.ClientURL)
		switch {
		case !ok:
			return fmt.Errorf("member %s (%s) does not answer", want.Node, want.ClientURL)
		case answered[s.ID]:
			return fmt.Errorf("member %s (%s) answers as member %x, as another member's URL does: each member must be asked at a URL of its own", want.Node, want.ClientURL, s.ID)
		case s.Leader == 0:
			return fmt.Errorf("member %s (%s) knows no leader", want.Node, want.ClientURL)
		case leader != 0 && s.Leader != leader:
			return fmt.Errorf("the members name different leaders (%x, %x)", leader, s.Leader)
		case want.Node == mb.Node && s.Version.Compare(to) < 0:
			return fmt.Errorf("member %s runs etcd %s, not %s yet", want.Node, s.Version, to)
		}
		leader = s.Leader
		answered[s.ID] = true
	}
	for _, id := range c.Listed {
		if !answered[id] {
			return fmt.Errorf("the cluster lists member %x, which is none of the control-plane nodes' etcd units: kubelift moves a cluster whose every member it can see (move etcd by hand)", id)
		}
	}
	if !answered[leader] {
		return fmt.Errorf("no member leads (leader %x)", leader)
	}
	return nil
}

// status asks the cluster for its members and every member for its
// status, from node.
func (m Mover) status(ctx context.Context, node string) (Cluster, error) {
	mb := m.member(node)
	var urls []string
	for _, x := range m.Members {
		urls = append(urls, x.ClientURL)
	}
	var out string
	err := m.OnNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error {
		var err error
		out, err = o.Run(ctx, "etcd status", nodescript.EtcdStatus, path.Join(mb.Dir, "etcdctl"), strings.Join(urls, ","), mb.CA, mb.Cert, mb.Key)
		return err
	})
	if err != nil {
		return Cluster{}, err
	}
	return parseCluster(node, out)
}

// parseCluster reads etcd-status's sections: the member list's IDs and
// the members' statuses.
func parseCluster(node, out string) (Cluster, error) {
	members, status, ok := strings.Cut(out, "### status\n")
	members, hasMembers := strings.CutPrefix(strings.TrimSpace(members), "### members")
	if !ok || !hasMembers {
		return Cluster{}, fmt.Errorf("node %s: etcd-status said %q, want its ### members and ### status sections", node, nodeaccess.FirstLine(out))
	}
	var c Cluster
	if members = strings.TrimSpace(members); members != "" {
		var ml struct {
			Members []struct {
				ID uint64 `json:"ID"`
			} `json:"members"`
		}
		if err := json.Unmarshal([]byte(members), &ml); err != nil {
			return Cluster{}, fmt.Errorf("node %s: etcdctl member list: %w", node, err)
		}
		for _, x := range ml.Members {
			c.Listed = append(c.Listed, x.ID)
		}
	}
	var err error
	c.Status, err = ParseStatus(node, status)
	return c, err
}

// ParseStatus reads etcdctl's `endpoint status -w json`, as node said it:
// each member's endpoint, ID, leader and version; a version that does not
// parse is an error naming the node, the endpoint and the value.
func ParseStatus(node, out string) ([]Status, error) {
	var raw []struct {
		Endpoint string
		Status   struct {
			Header struct {
				MemberID uint64 `json:"member_id"`
			} `json:"header"`
			Version string `json:"version"`
			Leader  uint64 `json:"leader"`
		}
	}
	out = strings.TrimSpace(out)
	if out == "" {
		return nil, nil // no member answered
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		return nil, fmt.Errorf("node %s: etcdctl endpoint status: %w", node, err)
	}
	st := make([]Status, 0, len(raw))
	for _, r := range raw {
		v, err := catalog.ParseReported("v" + r.Status.Version)
		if err != nil {
			return nil, fmt.Errorf("node %s: etcd member %s: version %q: %w", node, r.Endpoint, r.Status.Version, err)
		}
		st = append(st, Status{Endpoint: r.Endpoint, ID: r.Status.Header.MemberID, Leader: r.Status.Leader, Version: v})
	}
	return st, nil
}

func find(st []Status, url string) (Status, bool) {
	for _, s := range st {
		if s.Endpoint == url {
			return s, true
		}
	}
	return Status{}, false
}
