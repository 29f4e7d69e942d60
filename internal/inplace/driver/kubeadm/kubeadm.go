// Package kubeadm is the control-plane driver of a kubeadm-built
// cluster: `kubeadm upgrade apply` on the first control-plane node and
// `kubeadm upgrade node` on the others, each run detached on the node and
// followed (run.go); the static pods and kubeadm's addons waited for
// (static.go); a rollback from the manifests kubeadm kept (undo.go,
// manifests.go).
package kubeadm

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	kadm "github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// Driver upgrades a kubeadm-built control plane the way kubeadm's
// documentation does, with the target's kubeadm staged on every node:
// `kubeadm upgrade apply` on the first control-plane node, `kubeadm
// upgrade node` on the others, each run detached on the node and followed
// (a lost connection or a killed kubelift does not stop kubeadm halfway;
// the next run follows the same one). kubeadm moves the static pods one
// by one and puts a failed one back itself; kubelift reports its reason.
// Workers get `kubeadm upgrade node` (their kubelet's configuration)
// before their kubelet is swapped, as on any cluster.
type Driver struct {
	cfg *kadm.Config
}

// New is the driver of a cluster kubeadm built with cfg (its
// kubeadm-config).
func New(cfg *kadm.Config) Driver { return Driver{cfg: cfg} }

var _ driver.ControlPlane = Driver{}

func (Driver) Kind() string { return release.KindKubeadm }

// Components: every control-plane node runs all three as static pods.
func (Driver) Components(n *preflight.NodeState) []string {
	return preflight.Components(release.KindKubeadm, n)
}

// BackupEtcd snapshots the local etcd from inside its static pod on the
// first control-plane node, and keeps a copy off it (driver.KeepOffNode).
func (d Driver) BackupEtcd(ctx context.Context, r *driver.Run) (string, error) {
	if !d.cfg.LocalEtcd {
		return "", errors.New("the cluster's etcd is external (kubeadm-config etcd.external): back it up where it runs")
	}
	node := r.Plan.FirstControlPlane()
	if node == "" {
		return "", errors.New("no control-plane node to back etcd up from")
	}
	snap := path.Join(r.BackupDir, r.Plan.From[0], fmt.Sprintf("etcd-snapshot-%s.db", r.Now().UTC().Format("20060102T150405Z")))
	err := r.OnNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error {
		_, err := o.Run(ctx, "etcd snapshot", nodescript.KubeadmEtcdSnapshot, snap, d.cfg.EtcdDataDir, path.Join(d.cfg.CertificatesDir, "etcd"))
		return err
	})
	if err == nil {
		_, err = driver.KeepOffNode(ctx, r, node, snap)
	}
	if err != nil {
		return "", err
	}
	return node + ":" + snap, nil
}

// Upgrade runs `kubeadm upgrade apply` (first control-plane node) or
// `kubeadm upgrade node` (the others) unless every control-plane static
// pod of the node runs the target already, then waits until they do and
// are Ready, and until kubeadm's addons (kube-proxy, CoreDNS) have rolled
// out.
//
// t is the run's target: plan refuses hops on a kubeadm cluster.
func (d Driver) Upgrade(ctx context.Context, r *driver.Run, node string, t *release.Release) error {
	if t != r.Target {
		return fmt.Errorf("node %s: kubelift moves a kubeadm control plane one minor at a time, not through %s", node, t.Version)
	}
	to := t.Version.String()
	// Read through an API server restart: a run resumed while kubeadm
	// moves the control plane may find it restarting.
	var at map[string]string
	err := r.Wait.Poll(ctx, time.Second, r.ReadyTimeout, func(ctx context.Context) error {
		var err error
		at, _, err = staticVersions(ctx, r, node)
		return err
	})
	if err != nil {
		return err
	}
	verb := "node" // kubeadm upgrade apply on the first, upgrade node on the others
	if node == r.Plan.FirstControlPlane() {
		verb = "apply"
	}
	if allAt(at, to) {
		if err := r.OnNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error { return d.follow(ctx, r, o, verb, to) }); err != nil {
			r.Fx.SetNode(ctx, node, driver.FailedStatus(err), "kubeadm", err)
			return err
		}
		return waitAddons(ctx, r)
	}
	err = r.OnNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error { return d.move(ctx, r, o, verb, to) })
	if err != nil {
		r.Fx.SetNode(ctx, node, driver.FailedStatus(err), "kubeadm", err)
		return err
	}
	if !r.Dry {
		r.Log.Info("upgraded", "node", node, "control plane", "kubeadm", "version", to)
	}
	return waitAddons(ctx, r)
}

// follow finishes a node moved already, by a run this one resumes:
// kubeadm may still be going past the static pods (its config, kubelet
// and addon phases), or have stopped there. Follow it to its end (re-run
// when it failed or was killed, as kubeadm's own advice is), so that
// nothing else moves while it runs; then Ready there too. A node moved
// without a kubeadm run of this upgrade is only waited for.
func (d Driver) follow(ctx context.Context, r *driver.Run, o *nodeops.Ops, verb, to string) error {
	if r.Dry {
		return nil
	}
	run := runName(r, verb)
	out, err := o.Run(ctx, "kubeadm status", nodescript.KubeadmStatus, RunDir, run)
	if err != nil {
		return err
	}
	if status, rest, _ := strings.Cut(out, "\n"); strings.TrimSpace(status) != "lost" || strings.TrimSpace(rest) != "" {
		args, err := kubeadmArgs(ctx, r, o, verb)
		if err != nil {
			return err
		}
		r.Fx.MarkMoved(o.Name, "")
		if err := runKubeadm(ctx, r, o, run, args); err != nil {
			return err
		}
	}
	return d.waitStaticAt(ctx, r, o, to)
}

// move runs `kubeadm upgrade VERB` on the node once the leaders lead and
// the run holds the lock, and waits for the static pods at to. A kubeadm
// that fails puts the old manifests back itself: then the control plane
// is waited for at the old version and leading again, and the error wraps
// driver.ErrNodeFailed.
func (d Driver) move(ctx context.Context, r *driver.Run, o *nodeops.Ops, verb, to string) error {
	node := o.Name
	r.Fx.SetNode(ctx, node, record.NodeUpgrading, "kubeadm", nil)
	args, err := kubeadmArgs(ctx, r, o, verb)
	if err != nil {
		return err
	}
	run := runName(r, verb)
	r.Fx.Event(ctx, node, "UpgradingControlPlane", fmt.Sprintf("kubelift: kubeadm %s (%s -> %s)", strings.Join(args, " "), o.From, to))
	if err := waitLeaders(ctx, r); err != nil {
		return err
	}
	if err := r.Fx.Fence(ctx); err != nil {
		return fmt.Errorf("node %s: kubeadm not started: %w", node, err)
	}
	r.Fx.MarkMoved(node, "")
	if err := runKubeadm(ctx, r, o, run, args); err != nil {
		if !errors.Is(err, errKubeadmFailed) {
			return err
		}
		// kubeadm put the old manifests back: wait until the control
		// plane runs them again (its API server restarts meanwhile).
		if werr := d.waitStaticAt(ctx, r, o, o.From); werr != nil {
			return fmt.Errorf("%w; after it, the control plane is not back at %s: %v", err, o.From, werr)
		}
		// ... and leads again (the next run's plan checks the leases).
		if werr := waitLeaders(ctx, r); werr != nil {
			return fmt.Errorf("%w; after it, %v", err, werr)
		}
		return fmt.Errorf("%w: %w; kubeadm put node %s's control plane back at %s", driver.ErrNodeFailed, err, node, o.From)
	}
	if r.Dry {
		r.Fx.Would(node, "wait for the control plane's static pods to run "+to+" and be Ready", "")
		return nil
	}
	return d.waitStaticAt(ctx, r, o, to)
}

// BeforeKubelet runs `kubeadm upgrade node` on a worker (its kubelet's
// configuration for the target), before its kubelet is swapped; control
// planes had theirs in the control-plane step.
func (d Driver) BeforeKubelet(ctx context.Context, r *driver.Run, o *nodeops.Ops) error {
	if r.Addresses[o.Name].Role == release.RoleControlPlane {
		return nil
	}
	args, err := kubeadmArgs(ctx, r, o, "node")
	if err != nil {
		return err
	}
	return runKubeadm(ctx, r, o, runName(r, "node"), args)
}
