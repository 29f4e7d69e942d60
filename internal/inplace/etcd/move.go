package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/waiter"
)

// File is the bundle's etcd release archive (catalog nodeStack "etcd"),
// staged on the control-plane nodes.
const File = release.FileEtcd

// Mover moves one cluster's etcd members.
type Mover struct {
	Members []Member
	Move    *Move
	// SHA256 is the signed sum of the bundle's etcd archive for a node.
	SHA256 func(node string) string
	// OnNode runs fn with node's operations (its stage and backup
	// directories for this upgrade; fenced by the upgrade lock).
	OnNode func(ctx context.Context, node string, fn func(context.Context, *nodeops.Ops) error) error
	// Wait and Timeout bound the wait for the cluster to be healthy,
	// before a member moves and after.
	Wait    waiter.Waiter
	Timeout time.Duration
	// Event posts an Event on a node.
	Event func(ctx context.Context, node, reason, msg string)
	Log   *slog.Logger
	// Snapshot: a snapshot was taken before (a minor move needs one: no
	// rollback puts it back).
	Snapshot bool
	// Dry: a dry run, which tells Would the move instead of making it.
	Dry   bool
	Would func(node, what, command string)
}

// MoveAll moves each member of m.Move that is not at the bundle's etcd
// yet, followers first, the leader last: the cluster healthy first, the
// member's programs swapped and its unit restarted, then the member
// answering at the new version and the cluster healthy again, each
// bounded by Timeout. A member that does not come back is put back (its
// old programs, while the move is within a minor or no other member has
// moved) and the error says so.
func (m Mover) MoveAll(ctx context.Context) error {
	if m.Dry {
		m.Would("", m.Move.String()+", the leader last; each member's programs backed up, swapped and restarted, the cluster healthy before and after", "")
		return nil
	}
	if m.Move.Minor() && !m.Snapshot {
		return fmt.Errorf("etcd %s -> %s moves a minor, which a rollback cannot put back: it needs the snapshot taken first (do not pass --skip-etcd-backup)", m.Move.From, m.Move.To)
	}
	c, err := m.healthy(ctx, m.Members[0].Node)
	if err != nil {
		return err
	}
	for _, mb := range m.order(c.Status) {
		if err := m.moveMember(ctx, mb); err != nil {
			return err
		}
	}
	return nil
}

// order is the members to move, followers first and the leader last,
// as st (the members' statuses) says.
func (m Mover) order(st []Status) []Member {
	var leader uint64
	byURL := map[string]Status{}
	for _, s := range st {
		byURL[s.Endpoint], leader = s, s.Leader
	}
	var out []Member
	var last *Member
	for i, mb := range m.Members {
		if !slices.Contains(m.Move.Nodes, mb.Node) {
			continue
		}
		if byURL[mb.ClientURL].ID == leader {
			last = &m.Members[i]
			continue
		}
		out = append(out, mb)
	}
	if last != nil {
		out = append(out, *last)
	}
	return out
}

// moveMember moves one member unless it runs the bundle's etcd already
// (a run that resumes): healthy cluster, swap and restart, then the
// member at the new version in a healthy cluster.
func (m Mover) moveMember(ctx context.Context, mb Member) error {
	to := m.Move.To
	c, err := m.healthy(ctx, mb.Node)
	if err != nil {
		return err
	}
	if s, ok := find(c.Status, mb.ClientURL); ok && s.Version.Compare(to) >= 0 {
		return nil
	}
	// A lone member at the new minor moves the cluster's version at
	// once, as do the others' (the old one cannot rejoin then).
	othersMoved := len(m.Members) == 1
	for _, s := range c.Status {
		othersMoved = othersMoved || (s.Endpoint != mb.ClientURL && s.Version.Minor == to.Minor)
	}
	m.Event(ctx, mb.Node, "MovingEtcd", fmt.Sprintf("kubelift: etcd %s -> %s", mb.Version, to))
	err = m.OnNode(ctx, mb.Node, func(ctx context.Context, o *nodeops.Ops) error {
		_, err := o.Run(ctx, "move etcd", nodescript.EtcdSwap, backupDir(o), path.Join(o.StageDir, o.To, File), m.SHA256(mb.Node), mb.Dir, Unit)
		return err
	})
	if err == nil {
		err = m.Wait.Poll(ctx, time.Second, m.Timeout, func(ctx context.Context) error {
			c, err := m.status(ctx, mb.Node)
			if err == nil {
				err = m.check(c, mb, to)
			}
			return err
		})
	}
	if err != nil {
		return m.putBackAfter(ctx, mb, othersMoved, fmt.Errorf("node %s: etcd %s: %w", mb.Node, to, err))
	}
	m.Log.Info("etcd member moved", "node", mb.Node, "from", mb.Version.String(), "to", to.String())
	return nil
}

// putBackAfter puts a member that did not come back onto its old
// programs, where that is still safe: within a minor, or while no other
// member runs the new minor (othersMoved; the cluster's version is then
// still the old one, which the old etcd rejoins), and waits for the
// cluster to be healthy again. It returns cause with what was done.
func (m Mover) putBackAfter(ctx context.Context, mb Member, othersMoved bool, cause error) error {
	ctx = context.WithoutCancel(ctx)
	if m.Move.Minor() && othersMoved {
		return fmt.Errorf("%w; its old etcd is not put back, since the cluster's version may have moved to %s already (other members run it, or this one is alone; see docs/etcd.md: restore)", cause, m.Move.To.MinorString())
	}
	if err := m.restore(ctx, mb.Node); err != nil {
		return errors.Join(cause, fmt.Errorf("node %s: putting the old etcd back: %w", mb.Node, err))
	}
	if err := m.back(ctx, mb, true); err != nil {
		return errors.Join(cause, fmt.Errorf("node %s: the old etcd is put back, and %w", mb.Node, err))
	}
	m.Event(ctx, mb.Node, "EtcdRestored", fmt.Sprintf("kubelift: etcd put back: %v", cause))
	return fmt.Errorf("%w; the old etcd is back", cause)
}

// restore puts node's backed-up etcd programs back and restarts it.
func (m Mover) restore(ctx context.Context, node string) error {
	return m.OnNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error {
		_, err := o.Run(ctx, "put etcd back", nodescript.EtcdRestore, backupDir(o), m.member(node).Dir, Unit)
		return err
	})
}

func (m Mover) member(node string) Member {
	for _, mb := range m.Members {
		if mb.Node == node {
			return mb
		}
	}
	return Member{Node: node}
}

// backupDir is BACKUP/FROM/etcd: the etcd programs apart from the rest.
func backupDir(o *nodeops.Ops) string { return path.Join(o.BackupDirOf(), "etcd") }

// PutBack puts back, for a rollback, the move of the cluster's etcd that
// this upgrade made (m.Move): each member's backed-up programs,
// one member at a time, the cluster healthy before and after each. A
// member whose unit does not run (a run killed while its new etcd would
// not start) goes first, without waiting for a healthy cluster, which it
// keeps from being one: the others hold the quorum, and it must be
// healthy after (after the last of them, where more than one does not
// run). Where the move was of a minor and a member runs the new
// one, or no member runs at all (the version of a member that does not
// run is unknown: a lone one may have moved the cluster's), etcd stays as
// it is (a member of the old minor cannot rejoin such a cluster) and it
// says so, naming the ways back: etcd's downgrade, or the snapshot.
func (m Mover) PutBack(ctx context.Context) error {
	if len(m.Members) == 0 || m.Move == nil {
		return nil
	}
	from, to := m.Move.From, m.Move.To
	if from.Minor != to.Minor {
		if !slices.ContainsFunc(m.Members, func(mb Member) bool { return !mb.Down() }) {
			m.Log.Warn("etcd is not put back: no member runs, and a member that may have moved a minor cannot be given an etcd "+from.MinorString()+"; start them, then rollback again, or see docs/etcd.md (downgrade or the snapshot)",
				"members", len(m.Members))
			return fmt.Errorf("etcd is not put back: no member's unit runs, and after a move of a minor an etcd %s member may not rejoin (docs/etcd.md)", from.MinorString())
		}
		for _, mb := range m.Members {
			if mb.Version.Major == to.Major && mb.Version.Minor == to.Minor {
				m.Log.Warn("etcd stays at "+to.MinorString()+": a member has moved a minor, and an etcd "+from.MinorString()+" member cannot rejoin; the way back is etcd's downgrade or the snapshot (docs/etcd.md)",
					"node", mb.Node, "runs", mb.Version.String(), "before", from.String())
				m.Event(ctx, mb.Node, "EtcdStays", fmt.Sprintf("kubelift: etcd stays at %s: a member has moved a minor (docs/etcd.md: downgrade or restore)", mb.Version))
				return nil
			}
		}
	}
	members := slices.Clone(m.Members)
	slices.SortStableFunc(members, func(a, b Member) int { // the members that do not run first
		switch {
		case a.Down() == b.Down():
			return 0
		case a.Down():
			return -1
		}
		return 1
	})
	down := 0 // members that do not run, not yet put back
	for _, mb := range members {
		if mb.Down() {
			down++
		}
	}
	checked := true // the cluster was healthy after the last member put back
	for _, mb := range members {
		if !mb.Down() {
			if _, err := m.healthy(ctx, mb.Node); err != nil {
				return err
			}
		} else {
			down--
		}
		var said string
		err := m.OnNode(ctx, mb.Node, func(ctx context.Context, o *nodeops.Ops) error {
			var err error
			said, err = o.Run(ctx, "put etcd back", nodescript.EtcdRestore, backupDir(o), mb.Dir, Unit)
			return err
		})
		if err != nil {
			return err
		}
		if m.Dry || strings.Contains(said, "### none") || strings.Contains(said, "### same") {
			continue // a dry run said the restore instead; none or same: nothing restarted
		}
		// The next member that does not run keeps the cluster from being
		// healthy: until the last of them, the wait is for the member.
		checked = down == 0
		if err := m.back(ctx, mb, checked); err != nil {
			return fmt.Errorf("node %s: etcd put back: %w", mb.Node, err)
		}
		m.Log.Info("etcd member put back", "node", mb.Node, "to", from.String(), "cluster healthy", checked)
	}
	if !checked { // the last member that did not run had nothing to put back
		if _, err := m.healthy(ctx, m.Members[0].Node); err != nil {
			return fmt.Errorf("etcd put back: %w", err)
		}
	}
	return nil
}

// back waits, bounded by Timeout, for mb to answer at a version below
// the move's (etcd-restore only queues the restart: until it ends, the
// member answers at the new version, and the next member's restart must
// not overlap it) and, with whole, for the cluster to be healthy.
func (m Mover) back(ctx context.Context, mb Member, whole bool) error {
	err := m.Wait.Poll(ctx, time.Second, m.Timeout, func(ctx context.Context) error {
		c, err := m.status(ctx, mb.Node)
		if err != nil {
			return err
		}
		s, ok := find(c.Status, mb.ClientURL)
		switch {
		case !ok:
			return fmt.Errorf("member %s (%s) does not answer", mb.Node, mb.ClientURL)
		case s.Version.Compare(m.Move.To) >= 0:
			return fmt.Errorf("member %s answers at etcd %s still: its old etcd has not restarted yet", mb.Node, s.Version)
		case whole:
			return m.check(c, Member{}, catalog.Version{})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("etcd is not healthy: %w", err)
	}
	return nil
}
