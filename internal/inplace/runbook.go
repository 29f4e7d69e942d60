package inplace

import (
	"context"

	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/runbook"
)

// The runbook's options, results and errors, as cmd/ names them.
type (
	ApplyOptions = runbook.ApplyOptions
	ApplyResult  = runbook.ApplyResult
	Action       = runbook.Action
	StepTime     = runbook.StepTime
	// Snapshots says where the etcd snapshot is kept off its node.
	Snapshots = driver.Snapshots
)

// Errors an upgrade can end with, for errors.Is.
var (
	// ErrNodeFailed means a node failed its upgrade and was rolled back.
	ErrNodeFailed = runbook.ErrNodeFailed
	// ErrPanic means a step panicked: a bug in kubelift.
	ErrPanic = runbook.ErrPanic
	// ErrWorkloadsUnavailable means workloads fully available before a
	// node's swap were not again within --health-window after it.
	ErrWorkloadsUnavailable = runbook.ErrWorkloadsUnavailable
	// ErrNotStarted, wrapped by the hook's error before a node, stops
	// the run with the node left pending, not failed.
	ErrNotStarted = driver.ErrNotStarted
)

// What an upgrade leaves on a Node and a kubeadm node.
const (
	AnnotationUpgradedTo = record.AnnotationUpgradedTo
	AnnotationBundle     = record.AnnotationBundle
	KubeadmRunDir        = runbook.KubeadmRunDir
)

// Apply upgrades the cluster in place (runbook.Apply).
func Apply(ctx context.Context, opts ApplyOptions) (*ApplyResult, error) {
	return runbook.Apply(ctx, opts)
}

// Rollback puts the recorded upgrade back (runbook.Rollback).
func Rollback(ctx context.Context, opts ApplyOptions) (*ApplyResult, error) {
	return runbook.Rollback(ctx, opts)
}
