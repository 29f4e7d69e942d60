package inplace

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// controlPlane moves one kind of cluster's control plane: the seam where
// a second kind (kubeadm's static pods and `kubeadm upgrade`) plugs in
// beside the binary one. Apply and Rollback keep what every kind shares
// (the order of nodes, the lock, the state, the events, the kubelets); a
// driver does what happens on one control-plane node.
type controlPlane interface {
	// Kind names the cluster kind, as the plan says it.
	Kind() string
	// Components lists the parts the driver moves on node n, in the order
	// it moves them.
	Components(n *preflight.NodeState) []string
	// BackupEtcd snapshots etcd from the first control-plane node that
	// can, and returns "NODE:PATH".
	BackupEtcd(ctx context.Context, r *applyRun) (string, error)
	// Upgrade moves node's control plane to t (a hop on the way, or the
	// run's target), each part healthy there before the next; a part that
	// fails is put back and the error wraps ErrNodeFailed. Parts at t
	// already (or, for a hop, past it) are skipped, so a re-run continues.
	Upgrade(ctx context.Context, r *applyRun, node string, t *release.Release) error
	// Undo puts node's control plane back at the version the run started
	// from, in the reverse order of Upgrade (Rollback).
	Undo(ctx context.Context, r *applyRun, node string) error
	// BeforeKubelet prepares a node whose kubelet is about to be swapped
	// (kubeadm: the kubelet's configuration for the target).
	BeforeKubelet(ctx context.Context, r *applyRun, o *nodeops.Ops) error
}

// driverFor is the driver for the cluster read: kubeadm's when kubeadm
// built it (its kubeadm-config ConfigMap), else the binary one (each part
// a systemd unit whose program is swapped).
func driverFor(v *preflight.View) controlPlane {
	if v.Kubeadm != nil {
		return kubeadmDriver{cfg: v.Kubeadm}
	}
	return binaryDriver{}
}

// binaryDriver upgrades a binary-deployed control plane: kube-apiserver,
// kube-controller-manager and kube-scheduler as systemd units, each
// program swapped for the staged one and its unit restarted.
type binaryDriver struct{}

func (binaryDriver) Kind() string { return release.KindBinary }

// BeforeKubelet: nothing to prepare.
func (binaryDriver) BeforeKubelet(context.Context, *applyRun, *nodeops.Ops) error { return nil }

func (binaryDriver) Components(n *preflight.NodeState) []string {
	return preflight.Components(release.KindBinary, n)
}

// BackupEtcd runs etcdctl's snapshot with the API server's own etcd
// endpoints and client certificates.
func (binaryDriver) BackupEtcd(ctx context.Context, r *applyRun) (string, error) {
	for _, n := range r.plan.Nodes {
		f := r.view.Facts[n.Name]
		if n.Role != release.RoleControlPlane || f == nil || f.Values["kube-apiserver --etcd-servers"] == "" {
			continue
		}
		snap := path.Join(r.opts.BackupDir, r.plan.From[0], fmt.Sprintf("etcd-snapshot-%s.db", r.opts.Plan.Now().UTC().Format("20060102T150405Z")))
		endpoint, _, _ := strings.Cut(f.Values["kube-apiserver --etcd-servers"], ",")
		// The API server's own client flags, in etcdctl's order: --cacert,
		// --cert, --key (each empty when not given).
		args := []string{snap, endpoint}
		for _, flag := range []string{"--etcd-cafile", "--etcd-certfile", "--etcd-keyfile"} {
			args = append(args, f.Values["kube-apiserver "+flag])
		}
		err := r.onNode(ctx, n.Name, func(ctx context.Context, o *nodeops.Ops) error {
			_, err := o.Run(ctx, "etcd snapshot", nodescript.EtcdSnapshot, args...)
			return err
		})
		if err != nil {
			return "", err
		}
		return n.Name + ":" + snap, nil
	}
	return "", errors.New("no control-plane node runs kube-apiserver with --etcd-servers to back etcd up from")
}

// Upgrade swaps each part in turn: back up what runs (under BACKUP/ITS
// VERSION), swap in t's, wait healthy, and on a failure restore it.
func (d binaryDriver) Upgrade(ctx context.Context, r *applyRun, node string, t *release.Release) error {
	to := t.Version.String()
	for _, comp := range d.Components(r.nodeState(node)) {
		file, _, ok := t.File(comp, release.ArchOr(r.nodeState(node).Arch))
		if !ok {
			return fmt.Errorf("node %s: the %s bundle has no %s for linux/%s", node, to, comp, release.ArchOr(r.nodeState(node).Arch))
		}
		// What runs now is what a failure goes back to: in one minor, the
		// version the node upgrades from, where Rollback looks; through
		// hops, the part's own version (backed up under BACKUP/VERSION),
		// read from its program when it does not run, so that a part
		// that moved past a hop and then stopped is never moved back.
		err := r.onNodeTo(ctx, node, r.onNodeFromVersion(node), to, func(ctx context.Context, o *nodeops.Ops) error {
			running, err := o.Running(ctx, comp)
			if err != nil {
				return err
			}
			if running == to {
				return nil // at t already: a re-run skips it
			}
			if len(r.target.Hops) > 0 {
				cur := running
				if cur == "" {
					if cur, err = o.Installed(ctx, comp); err != nil {
						return err
					}
				}
				v, perr := catalog.ParseReported(cur)
				switch {
				case perr != nil:
					return fmt.Errorf("node %s: %s does not run, and the version of its program cannot be read (%q): start its unit, or put its program back, and apply again", node, comp, cur)
				case running == "" && cur == to:
					return fmt.Errorf("node %s: %s's program is %s already but it does not run: see its unit's log; kubelift does not guess what to put back", node, comp, to)
				case t != r.target && v.Compare(t.Version) > 0:
					return nil // past this hop already
				}
				o.From = cur
			}
			r.setNode(ctx, node, record.NodeUpgrading, comp+" to "+to, nil)
			r.event(ctx, node, "UpgradingComponent", fmt.Sprintf("kubelift: %s %s -> %s", comp, o.From, to))
			if err := o.Backup(ctx, comp); err != nil {
				return err
			}
			if err := r.fence(ctx); err != nil {
				return fmt.Errorf("node %s: %s not swapped: %w", node, comp, err)
			}
			r.markMoved(node, comp)
			if err := o.Swap(ctx, comp, file.SHA256); err != nil {
				return r.rollback(ctx, o, comp, err)
			}
			if err := r.waitComponent(ctx, o, comp, to); err != nil {
				return r.rollback(ctx, o, comp, err)
			}
			r.log.Info("upgraded", "node", node, "component", comp, "version", to)
			return nil
		})
		if err != nil {
			r.setNode(ctx, node, failedStatus(err), comp, err)
			return err
		}
	}
	return nil
}

// Undo restores the parts newest first: scheduler, controller manager,
// API server.
func (d binaryDriver) Undo(ctx context.Context, r *applyRun, node string) error {
	parts := d.Components(r.nodeState(node))
	for i := len(parts) - 1; i >= 0; i-- {
		if err := r.undoComponent(ctx, node, parts[i]); err != nil {
			return err
		}
	}
	return nil
}
