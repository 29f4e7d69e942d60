package runbook

import (
	"context"

	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/workloads"
)

// workloadsStep adds the missing not-ready/unreachable tolerations to
// running pods and, with RestoreLabels, the labels their nodeSelectors
// need; both only add.
func (r *upgradeRun) workloadsStep(ctx context.Context) error {
	if err := r.setState(ctx, record.StatePatchingWorkloads); err != nil {
		return err
	}
	if err := r.addTolerations(ctx); err != nil {
		return err
	}
	if !r.opts.RestoreLabels {
		return nil
	}
	return r.restoreLabels(ctx)
}

// addTolerations adds the missing not-ready and unreachable tolerations
// to every running pod but a DaemonSet's.
func (r *upgradeRun) addTolerations(ctx context.Context) error {
	patched, err := r.patcher().AddTolerations(ctx, r.view.Pods)
	r.res.Patched = append(r.res.Patched, patched...)
	return err
}

// restoreLabels adds the labels pods' nodeSelectors need to their nodes.
func (r *upgradeRun) restoreLabels(ctx context.Context) error {
	want, err := workloads.LabelsWanted(r.view.Nodes, r.view.Pods)
	if err != nil {
		return err
	}
	restored, err := r.patcher().RestoreLabels(ctx, want)
	r.res.Labels = append(r.res.Labels, restored...)
	return err
}

// patcher patches this run's pods and nodes (in a dry run, says so).
func (r *upgradeRun) patcher() workloads.Patcher {
	p := workloads.Patcher{Client: r.client, Log: r.log, Event: r.event}
	if r.dry {
		p.Would = r.would
	}
	return p
}
