package inplace

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/waiter"
	corev1 "k8s.io/api/core/v1"
)

// etcdStep snapshots etcd before the control plane is touched, with the
// API server's own etcd endpoints and client certificates, on a
// control-plane node.
func (r *applyRun) etcdStep(ctx context.Context) error {
	if r.opts.SkipEtcdBackup || r.state.Backup != "" {
		return nil
	}
	if r.controlPlaneDone() {
		return nil
	}
	for _, n := range r.plan.Nodes {
		f := r.view.facts[n.Name]
		if n.Role != RoleControlPlane || f == nil || f.Values["kube-apiserver --etcd-servers"] == "" {
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
		err := r.onNode(ctx, n.Name, func(ctx context.Context, o *nodeOps) error {
			_, err := o.run(ctx, "etcd snapshot", nodescript.EtcdSnapshot, args...)
			return err
		})
		if err != nil {
			return fmt.Errorf("%w (pass --skip-etcd-backup to upgrade without one)", err)
		}
		r.mu.Lock()
		r.state.Backup = n.Name + ":" + snap
		r.mu.Unlock()
		r.log.Info("etcd snapshot", "node", n.Name, "path", snap)
		return r.save(ctx)
	}
	return errors.New("no control-plane node runs kube-apiserver with --etcd-servers to back etcd up from (pass --skip-etcd-backup)")
}

func (r *applyRun) controlPlaneDone() bool {
	to := r.target.Version.String()
	for _, n := range r.plan.Nodes {
		for _, c := range controlPlaneFiles {
			if v, ok := n.Components[c]; ok && v != to {
				return false
			}
		}
	}
	return true
}

// controlPlaneStep moves each control-plane node's apiserver, controller
// manager and scheduler, one node at a time, each waiting for its health
// at the target before the next; any failure restores that component.
func (r *applyRun) controlPlaneStep(ctx context.Context) error {
	if err := r.setState(ctx, StateUpgradingControlPlane); err != nil {
		return err
	}
	to := r.target.Version.String()
	for _, n := range r.plan.Nodes {
		if n.Role != RoleControlPlane {
			continue
		}
		for _, comp := range controlPlaneFiles {
			if _, ok := n.Components[comp]; !ok {
				continue // not run on this node
			}
			err := r.onNode(ctx, n.Name, func(ctx context.Context, o *nodeOps) error {
				if v, err := o.running(ctx, comp); err != nil {
					return err
				} else if v == to {
					return nil // already at the target: a re-run skips it
				}
				r.setNode(ctx, n.Name, NodeUpgrading, comp, nil)
				r.event(ctx, n.Name, "UpgradingComponent", fmt.Sprintf("kubelift: %s %s -> %s", comp, o.from, to))
				if err := o.backup(ctx, comp); err != nil {
					return err
				}
				if err := o.swap(ctx, comp, r.fileSHA(comp, n.Arch)); err != nil {
					return r.rollback(ctx, o, comp, err)
				}
				if err := r.waitComponent(ctx, o, comp, to); err != nil {
					return r.rollback(ctx, o, comp, err)
				}
				r.log.Info("upgraded", "node", n.Name, "component", comp, "version", to)
				return nil
			})
			if err != nil {
				r.setNode(ctx, n.Name, failedStatus(err), comp, err)
				return err
			}
		}
		r.setNode(ctx, n.Name, NodePending, "control plane at "+to, nil)
	}
	return r.setState(ctx, StateUpgradedControlPlane)
}

// waitComponent waits for comp to run the version (and the API server to
// answer /readyz and /version at the node's address).
func (r *applyRun) waitComponent(ctx context.Context, o *nodeOps, comp, version string) error {
	if r.dry {
		r.would(o.name, fmt.Sprintf("wait for %s to run %s and be healthy", comp, version), "")
		return nil
	}
	defer r.timed(&r.res.Waiting)()
	err := r.wait.Poll(ctx, time.Second, r.opts.ReadyTimeout, func(ctx context.Context) error {
		v, err := o.running(ctx, comp)
		switch {
		case err != nil:
			return err
		case v != version:
			return fmt.Errorf("%s runs %q, want %s", comp, v, version)
		case comp == "kube-apiserver" && r.opts.Plan.REST != nil:
			return readyz(ctx, r.opts.Plan.REST, r.tgts[o.name].Address)
		}
		return nil
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("node %s: %s not healthy at %s within %s: %w", o.name, comp, version, r.opts.ReadyTimeout, err)
	}
	return err
}

// rollback restores comp after a failed swap and waits for the old
// version; it returns the original failure.
func (r *applyRun) rollback(ctx context.Context, o *nodeOps, comp string, cause error) error {
	ctx = context.WithoutCancel(ctx)
	r.log.Error("rolling back", "node", o.name, "component", comp, "err", cause)
	r.event(ctx, o.name, "RollingBack", fmt.Sprintf("kubelift: %s back to %s: %v", comp, o.from, cause))
	if err := o.restore(ctx, comp); err != nil {
		return fmt.Errorf("%w; rollback of %s failed too: %w", cause, comp, err)
	}
	if err := r.waitComponent(ctx, o, comp, o.from); err != nil {
		return fmt.Errorf("%w; after rollback %s: %w", cause, comp, err)
	}
	if comp == "kubelet" && r.watch != nil {
		if err := r.watch.until(ctx, o.name, r.opts.ReadyTimeout, func(n *corev1.Node) bool {
			return nodeReady(n) && n.Status.NodeInfo.KubeletVersion == o.from
		}); err != nil {
			return fmt.Errorf("%w; after rollback node %s not Ready at %s: %w", cause, o.name, o.from, err)
		}
	}
	if comp == "kubelet" {
		if err := r.uncordon(ctx, o.name); err != nil {
			return fmt.Errorf("%w; after rollback: %w", cause, err)
		}
	}
	return fmt.Errorf("%w: node %s rolled back to %s: %w", ErrNodeFailed, o.name, o.from, cause)
}
