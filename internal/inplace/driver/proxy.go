package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/waiter"
)

// ProxyHealthz is kube-proxy's health endpoint at its default address,
// read on the node itself.
const ProxyHealthz = "http://127.0.0.1:10256/healthz"

// MoveProxy moves the node's kube-proxy unit to the target, right after
// its kubelet and in the kubelet's window: back up, swap, wait until it
// runs the target and, when its health endpoint answered 200 before the
// swap, answers 200 again; on failure the old one is put back. A restart
// keeps the Service rules it programmed (they live in the kernel, not in
// the process), so Service traffic keeps flowing while it restarts; the
// sandbox's prober measures that.
func MoveProxy(ctx context.Context, r *Run, o *nodeops.Ops) error {
	if !o.HasUnit(release.KubeProxy) {
		return nil
	}
	to := o.To
	arch := release.ArchOr(r.Node(o.Name).Arch)
	if _, _, ok := r.Target.File(release.KubeProxy, arch); !ok {
		r.Log.Warn("the bundle carries no kube-proxy: it stays as it is", "node", o.Name)
		return nil
	}
	now, err := o.Running(ctx, release.KubeProxy)
	if err != nil {
		return err
	}
	if now == "" {
		// Down: what its unit would start says whether a run moved it.
		if now, err = o.Installed(ctx, release.KubeProxy); err != nil {
			return err
		}
		if now != to {
			r.Log.Warn("kube-proxy has a unit but does not run: left as it is", "node", o.Name, "program", o.Binary(release.KubeProxy), "version", now)
			return nil
		}
	}
	// Its own old version: kube-proxy may lag the kubelet.
	po := *o
	if now != to {
		po.From = now
	}
	if now == to {
		// Moved by an earlier run that stopped: healthy, or put back.
		if err := waitProxy(ctx, r, &po, true); err != nil {
			return rollbackProxy(ctx, r, &po, err)
		}
		return nil
	}
	healthy := false
	if !r.Dry {
		h, err := po.Healthz(ctx, ProxyHealthz)
		if err != nil {
			return err
		}
		healthy = h == "200"
	}
	r.Fx.SetNode(ctx, o.Name, record.NodeUpgrading, release.KubeProxy, nil)
	if err := po.Backup(ctx, release.KubeProxy); err != nil {
		return err
	}
	if err := po.Swap(ctx, release.KubeProxy, r.Target.SHA256(release.KubeProxy, arch)); err != nil {
		return rollbackProxy(ctx, r, &po, err)
	}
	if err := waitProxy(ctx, r, &po, healthy); err != nil {
		return rollbackProxy(ctx, r, &po, err)
	}
	r.Log.Info("kube-proxy upgraded", "node", o.Name, "from", po.From, "to", to)
	return nil
}

// waitProxy waits for kube-proxy to run the target and, when healthy is
// set, its health endpoint to answer 200 (rules synced).
func waitProxy(ctx context.Context, r *Run, o *nodeops.Ops, healthy bool) error {
	if err := WaitPart(ctx, r, o, release.KubeProxy, o.To); err != nil {
		return err
	}
	if !healthy || r.Dry {
		return nil
	}
	defer r.Fx.Timed()()
	last := ""
	err := r.Wait.Poll(ctx, time.Second, r.ReadyTimeout, func(ctx context.Context) error {
		h, err := o.Healthz(ctx, ProxyHealthz)
		if err != nil {
			return err
		}
		last = h
		if h != "200" {
			return fmt.Errorf("%s answers %s", ProxyHealthz, h)
		}
		return nil
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("node %s: kube-proxy %s not healthy within %s (%s answered %s before the swap, %s now): %w", o.Name, o.To, r.ReadyTimeout, ProxyHealthz, "200", last, err)
	}
	return err
}

// rollbackProxy puts the old kube-proxy back after a failed swap; the
// kubelet stays at the target (the skew allows it).
func rollbackProxy(ctx context.Context, r *Run, o *nodeops.Ops, cause error) error {
	cause = fmt.Errorf("kube-proxy: %w", cause)
	if err := PutBack(ctx, r, o, release.KubeProxy, cause); err != nil {
		return err
	}
	return RolledBack(o, cause)
}
