package runbook

import (
	"context"

	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/driver/binary"
	"github.com/kubelift/kubelift/internal/inplace/driver/kubeadm"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
)

// KubeadmRunDir is where, on a node, each kubeadm run kubelift starts
// keeps its output (NAME.log), exit status (NAME.rc) and pid.
const KubeadmRunDir = kubeadm.RunDir

// driverFor is the driver for the cluster read: kubeadm's when kubeadm
// built it (its kubeadm-config ConfigMap), else the binary one (each part
// a systemd unit whose program is swapped).
func driverFor(v *preflight.View) driver.ControlPlane {
	if v.Kubeadm != nil {
		return kubeadm.New(v.Kubeadm)
	}
	return binary.Driver{}
}

// driverRun is what the drivers read of this run, as it stands now.
func (r *upgradeRun) driverRun() *driver.Run {
	d := &driver.Run{
		Client: r.client, REST: r.opts.Plan.REST, Log: r.log, Wait: r.wait,
		Target: r.target, Plan: r.plan, Addresses: r.tgts,
		StageDir: r.opts.Plan.StageDir, BackupDir: r.opts.BackupDir, Snapshot: r.opts.Snapshot, Now: r.opts.Plan.Now,
		ReadyTimeout: r.opts.ReadyTimeout, HealthWindow: r.opts.Plan.HealthWindow,
		KubeadmConfig: r.opts.KubeadmConfig, Dry: r.dry, Fx: effects{r},
	}
	if r.view != nil {
		d.Facts = r.view.Facts
	}
	r.mu.Lock()
	if r.state != nil {
		d.Started = r.state.Started.Unix()
	}
	r.mu.Unlock()
	return d
}

// effects are the run's side of the driver seam.
type effects struct{ r *upgradeRun }

func (e effects) OnNode(ctx context.Context, node, from, to string, fn func(context.Context, *nodeops.Ops) error) error {
	return e.r.onNodeTo(ctx, node, from, to, fn)
}

func (e effects) SetNode(ctx context.Context, node, status, step string, err error) {
	e.r.setNode(ctx, node, status, step, err)
}

func (e effects) Event(ctx context.Context, node, reason, msg string) {
	e.r.event(ctx, node, reason, msg)
}

func (e effects) Would(node, what, command string) { e.r.would(node, what, command) }
func (e effects) Fence(ctx context.Context) error  { return e.r.fence(ctx) }
func (e effects) Lost() error                      { return e.r.lostForGood() }
func (e effects) MarkMoved(node, part string)      { e.r.moved.Mark(node, part) }
func (e effects) Timed() func()                    { return e.r.timed(&e.r.res.Waiting) }

var _ driver.Effects = effects{}

// waitComponent waits for comp to run the version (driver.WaitPart).
func (r *upgradeRun) waitComponent(ctx context.Context, o *nodeops.Ops, comp, version string) error {
	return driver.WaitPart(ctx, r.driverRun(), o, comp, version)
}
