package runbook

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kubelift/kubelift/internal/inplace/etcd"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
)

// etcdStep snapshots etcd before the control plane is touched (the
// driver says how).
func (r *upgradeRun) etcdStep(ctx context.Context) error {
	if r.opts.SkipEtcdBackup || r.state.Backup != "" {
		return nil
	}
	if r.controlPlaneDone() && r.plan.Etcd == nil {
		return nil
	}
	where, err := r.driver.BackupEtcd(ctx, r.driverRun())
	if err != nil {
		return fmt.Errorf("%w (pass --skip-etcd-backup to upgrade without one)", err)
	}
	r.mu.Lock()
	r.state.Backup = where
	r.mu.Unlock()
	node, file, _ := strings.Cut(where, ":")
	r.log.Info("etcd snapshot", "node", node, "path", file)
	return r.save(ctx)
}

// etcdMoveStep moves a binary cluster's etcd members to the bundle's, one
// at a time, once the snapshot is taken and before the control plane
// (etcd.Mover.MoveAll); the move is recorded first, for a rollback.
func (r *upgradeRun) etcdMoveStep(ctx context.Context) error {
	p := r.plan.Etcd
	if p == nil || slices.Contains(r.opts.Ignore, preflight.CheckEtcd) {
		return nil
	}
	m, err := r.etcdMover(p.From, p.To, p.Nodes)
	if err != nil {
		return err
	}
	if r.state.Etcd == nil { // a run that resumes keeps the first's: its From is what the backups hold
		r.mu.Lock()
		r.state.Etcd = &record.EtcdMove{From: p.From, To: p.To}
		r.mu.Unlock()
		if err := r.save(ctx); err != nil {
			return err
		}
	}
	return m.MoveAll(ctx)
}

// etcdUndo puts back the etcd move this upgrade recorded, while etcd lets
// it (etcd.Mover.PutBack).
func (r *upgradeRun) etcdUndo(ctx context.Context) error {
	if r.state.Etcd == nil {
		return nil
	}
	m, err := r.etcdMover(r.state.Etcd.From, r.state.Etcd.To, nil)
	if err != nil {
		return err
	}
	return m.PutBack(ctx)
}

// etcdMover moves this run's etcd members (as the plan read them) from
// one version to another, on each node as the run's other steps do.
func (r *upgradeRun) etcdMover(from, to string, nodes []string) (etcd.Mover, error) {
	mv, err := etcd.NewMove(from, to, nodes)
	members, merr := etcd.Members(r.view.Addresses, r.view.Facts)
	return etcd.Mover{Members: members, Move: mv, Wait: r.wait, Timeout: r.opts.ReadyTimeout, Event: r.event, Log: r.log, OnNode: r.onNode, Dry: r.dry, Would: r.would, Snapshot: r.state.Backup != "",
		SHA256: func(node string) string { return r.target.SHA256(etcd.File, release.ArchOr(r.nodeState(node).Arch)) },
	}, errors.Join(err, merr)
}
