// Package binary is the control-plane driver of a binary-deployed
// cluster: kube-apiserver, kube-controller-manager and kube-scheduler as
// systemd units, each program swapped for the staged one and its unit
// restarted, one part at a time, each healthy before the next.
package binary

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// Driver upgrades a binary-deployed control plane.
type Driver struct{}

var _ driver.ControlPlane = Driver{}

func (Driver) Kind() string { return release.KindBinary }

// BeforeKubelet: nothing to prepare.
func (Driver) BeforeKubelet(context.Context, *driver.Run, *nodeops.Ops) error { return nil }

func (Driver) Components(n *preflight.NodeState) []string {
	return preflight.Components(release.KindBinary, n)
}

// BackupEtcd runs etcdctl's snapshot with the API server's own etcd
// endpoints and client certificates, and keeps a copy off the node
// (driver.KeepOffNode).
func (Driver) BackupEtcd(ctx context.Context, r *driver.Run) (string, error) {
	for _, n := range r.Plan.Nodes {
		f := r.Facts[n.Name]
		if n.Role != release.RoleControlPlane || f == nil || f.Values["kube-apiserver --etcd-servers"] == "" {
			continue
		}
		snap := path.Join(r.BackupDir, r.From(), fmt.Sprintf("etcd-snapshot-%s.db", r.Now().UTC().Format("20060102T150405Z")))
		endpoint, _, _ := strings.Cut(f.Values["kube-apiserver --etcd-servers"], ",")
		// The API server's own client flags, in etcdctl's order: --cacert,
		// --cert, --key (each empty when not given).
		args := []string{snap, endpoint}
		for _, flag := range []string{"--etcd-cafile", "--etcd-certfile", "--etcd-keyfile"} {
			args = append(args, f.Values["kube-apiserver "+flag])
		}
		err := r.OnNode(ctx, n.Name, func(ctx context.Context, o *nodeops.Ops) error {
			_, err := o.Run(ctx, "etcd snapshot", nodescript.EtcdSnapshot, args...)
			return err
		})
		if err == nil {
			_, err = driver.KeepOffNode(ctx, r, n.Name, snap)
		}
		if err != nil {
			return "", err
		}
		return n.Name + ":" + snap, nil
	}
	return "", errors.New("no control-plane node runs kube-apiserver with --etcd-servers to back etcd up from")
}

// Upgrade swaps each part in turn: back up what runs (under BACKUP/ITS
// VERSION), swap in t's, wait healthy, and on a failure restore it.
func (d Driver) Upgrade(ctx context.Context, r *driver.Run, node string, t *release.Release) error {
	to := t.Version.String()
	state := r.Node(node)
	for _, comp := range d.Components(state) {
		file, _, ok := t.File(comp, release.ArchOr(state.Arch))
		if !ok {
			return fmt.Errorf("node %s: the %s bundle has no %s for linux/%s", node, to, comp, release.ArchOr(state.Arch))
		}
		// What runs now is what a failure goes back to: in one minor, the
		// version the node upgrades from, where rollback looks; through
		// hops, the part's own version (backed up under BACKUP/VERSION),
		// read from its program when it does not run, so that a part
		// that moved past a hop and then stopped is never moved back.
		err := r.Fx.OnNode(ctx, node, r.NodeFrom(node, state), to, func(ctx context.Context, o *nodeops.Ops) error {
			return swapPart(ctx, r, o, comp, t, file.SHA256)
		})
		if err != nil {
			r.Fx.SetNode(ctx, node, driver.FailedStatus(err), comp, err)
			return err
		}
	}
	return nil
}

// swapPart moves one part to t unless it is there (or past a hop)
// already: back up, fence, swap, wait healthy; a failed swap or wait
// puts it back.
func swapPart(ctx context.Context, r *driver.Run, o *nodeops.Ops, comp string, t *release.Release, sum string) error {
	to := t.Version.String()
	running, err := o.Running(ctx, comp)
	if err != nil {
		return err
	}
	if running == to {
		return nil // at t already: a re-run skips it
	}
	if len(r.Target.Hops) > 0 {
		skip, err := throughHops(ctx, r, o, comp, running, t)
		if skip || err != nil {
			return err
		}
	}
	r.Fx.SetNode(ctx, o.Name, record.NodeUpgrading, comp+" to "+to, nil)
	r.Fx.Event(ctx, o.Name, "UpgradingComponent", fmt.Sprintf("kubelift: %s %s -> %s", comp, o.From, to))
	if err := o.Backup(ctx, comp); err != nil {
		return err
	}
	if err := r.Fx.Fence(ctx); err != nil {
		return fmt.Errorf("node %s: %s not swapped: %w", o.Name, comp, err)
	}
	r.Fx.MarkMoved(o.Name, comp)
	if err := o.Swap(ctx, comp, sum); err != nil {
		return putBack(ctx, r, o, comp, err)
	}
	if err := driver.WaitPart(ctx, r, o, comp, to); err != nil {
		return putBack(ctx, r, o, comp, err)
	}
	r.Log.Info("upgraded", "node", o.Name, "component", comp, "version", to)
	return nil
}

// throughHops decides, on the way through hops, what a part that is not
// at hop t goes back to on a failure (its own version: o.From), and skips
// one past t already; a part that does not run is read from its program,
// and refused when that cannot say.
func throughHops(ctx context.Context, r *driver.Run, o *nodeops.Ops, comp, running string, t *release.Release) (skip bool, err error) {
	to := t.Version.String()
	cur := running
	if cur == "" {
		if cur, err = o.Installed(ctx, comp); err != nil {
			return false, err
		}
	}
	v, perr := catalog.ParseReported(cur)
	switch {
	case perr != nil:
		return false, fmt.Errorf("node %s: %s does not run, and the version of its program cannot be read (%q): start its unit, or put its program back, and apply again", o.Name, comp, cur)
	case running == "" && cur == to:
		return false, fmt.Errorf("node %s: %s's program is %s already but it does not run: see its unit's log; kubelift does not guess what to put back", o.Name, comp, to)
	case t != r.Target && v.Compare(t.Version) > 0:
		return true, nil // past this hop already
	}
	o.From = cur
	return false, nil
}

// putBack restores comp after cause and returns the node's failure.
func putBack(ctx context.Context, r *driver.Run, o *nodeops.Ops, comp string, cause error) error {
	if err := driver.PutBack(ctx, r, o, comp, cause); err != nil {
		return err
	}
	return driver.RolledBack(o, cause)
}

// Undo restores the parts newest first: scheduler, controller manager,
// API server, each where it runs the target.
func (d Driver) Undo(ctx context.Context, r *driver.Run, node string) error {
	parts := d.Components(r.Node(node))
	for i := len(parts) - 1; i >= 0; i-- {
		comp := parts[i]
		err := r.Fx.OnNode(ctx, node, r.From(), r.Target.Version.String(), func(ctx context.Context, o *nodeops.Ops) error {
			moved, err := driver.UndoPart(ctx, r, o, comp)
			if err == nil && moved {
				r.Fx.SetNode(ctx, node, record.NodeRolledBack, comp, nil)
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}
