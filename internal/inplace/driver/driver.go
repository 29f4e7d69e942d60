// Package driver is the seam between the runbook and one kind of
// cluster's control plane. A driver (binary/, kubeadm/) implements
// ControlPlane over a plain Run (what the run read and decided) and asks
// the run for the little it must do through Effects (reach a node, record
// a node's status, post an Event, say what a dry run would do, check the
// lock, mark a part moved, time a wait). It never sees the runbook: a
// third kind, or a second way to reach nodes, plugs in here.
//
// The package also holds what both kinds and the kubelets share: a
// binary part's wait, put-back and undo (parts.go), kube-proxy's move
// (proxy.go), and the leaders' leases (leases.go).
package driver

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/waiter"
)

// ControlPlane moves one kind of cluster's control plane: the runbook
// keeps what every kind shares (the order of nodes, the lock, the
// record, the events, the kubelets); a driver does what happens on one
// control-plane node.
type ControlPlane interface {
	// Kind names the cluster kind, as the plan says it.
	Kind() string
	// Components lists the parts the driver moves on node n, in the order
	// it moves them.
	Components(n *preflight.NodeState) []string
	// BackupEtcd snapshots etcd from the first control-plane node that
	// can, and returns "NODE:PATH".
	BackupEtcd(ctx context.Context, r *Run) (string, error)
	// Upgrade moves node's control plane to t (a hop on the way, or the
	// run's target), each part healthy there before the next; a part that
	// fails is put back and the error wraps ErrNodeFailed. Parts at t
	// already (or, for a hop, past it) are skipped, so a re-run continues.
	Upgrade(ctx context.Context, r *Run, node string, t *release.Release) error
	// Undo puts node's control plane back at the version the run started
	// from, in the reverse order of Upgrade (rollback).
	Undo(ctx context.Context, r *Run, node string) error
	// Settle waits, after node's step, until every part that ran or moved
	// runs version (at least version, with atLeast: a hop) and the same
	// process a health window later, the leaders leading again; a part
	// that is down is started. moved are the parts the step swapped or
	// restored ("" for the node's control plane as a whole).
	Settle(ctx context.Context, r *Run, node, version string, atLeast bool, moved map[string]bool) error
	// BeforeKubelet prepares a node whose kubelet is about to be swapped
	// (kubeadm: the kubelet's configuration for the target).
	BeforeKubelet(ctx context.Context, r *Run, o *nodeops.Ops) error
}

// Effects are what a driver asks of the run it serves.
type Effects interface {
	// OnNode dials node and runs fn with its operations, moving from one
	// version to another; a run that no longer holds its lock does not
	// start.
	OnNode(ctx context.Context, node, from, to string, fn func(context.Context, *nodeops.Ops) error) error
	// SetNode records node's status (record.Node*) and step.
	SetNode(ctx context.Context, node, status, step string, err error)
	// Event posts an Event on node.
	Event(ctx context.Context, node, reason, msg string)
	// Would says, in a dry run, a change the run walks past.
	Would(node, what, command string)
	// Fence is nil while the run holds the upgrade lock: asked before
	// every change.
	Fence(ctx context.Context) error
	// Lost says why the run lost the lock for good (another run holds
	// it), nil otherwise: a put-back then leaves the node to that run.
	Lost() error
	// MarkMoved records that part (or "", the node's control plane as a
	// whole) was swapped or restored: the node is settled after its step.
	MarkMoved(node, part string)
	// Timed counts the time until the returned func is called as waiting.
	Timed() func()
}

// Run is what a driver reads of the run it serves: plain data, and the
// Effects it may ask for.
type Run struct {
	Client kubernetes.Interface
	// REST reaches each control-plane node's /readyz (nil: not asked).
	REST *rest.Config
	Log  *slog.Logger
	// Wait is every wait and every time read of the run.
	Wait waiter.Waiter
	// Target is the run's target release (its Hops on the way).
	Target *release.Release
	// Plan is the plan the run follows: its nodes, in order, and From,
	// the versions the upgrade started from.
	Plan *preflight.Plan
	// Facts are what the plan read on each node; Addresses how to reach
	// it.
	Facts     map[string]*nodefacts.Facts
	Addresses map[string]nodeaccess.Address
	// StageDir and BackupDir are the nodes' staged files and backups.
	StageDir, BackupDir string
	// Snapshot says where the etcd snapshot is kept off its node.
	Snapshot Snapshots
	// Now names the etcd snapshot.
	Now func() time.Time
	// Started is the upgrade record's start, in Unix seconds (0 without
	// one): it names kubeadm's runs of this upgrade.
	Started int64
	// ReadyTimeout bounds each wait for a restarted part; HealthWindow is
	// how long a settled part must keep its process.
	ReadyTimeout, HealthWindow time.Duration
	// KubeadmConfig is the UpgradeConfiguration each `kubeadm upgrade`
	// is given (nil: none).
	KubeadmConfig *kubeadm.UpgradeConfig
	// Dry walks the steps, runs what only reads, and says through
	// Effects.Would what would change instead of changing it.
	Dry bool
	Fx  Effects
}

// ErrNodeFailed means a node failed its upgrade and was put back.
var ErrNodeFailed = errors.New("node upgrade failed")

// FailedStatus is the status of a node whose step failed with err:
// rolled back when the step undid itself, else failed.
func FailedStatus(err error) string {
	switch {
	case errors.Is(err, ErrNodeFailed):
		return record.NodeRolledBack
	case errors.Is(err, ErrNotStarted):
		return record.NodePending
	}
	return record.NodeFailed
}

// ErrNotStarted means the run stopped before a node began (the hook held
// it back: a controller's pause or stop): the node stays pending.
var ErrNotStarted = errors.New("stopped before the node began")

// From is the version the upgrade started from.
func (r *Run) From() string {
	if len(r.Plan.From) == 0 {
		return ""
	}
	return r.Plan.From[0]
}

// Node is the plan's state of the node named (nil: not in the plan).
func (r *Run) Node(name string) *preflight.NodeState {
	for i := range r.Plan.Nodes {
		if r.Plan.Nodes[i].Name == name {
			return &r.Plan.Nodes[i]
		}
	}
	return nil
}

// NodeFrom is the version node upgrades from (preflight.Plan.NodeFrom).
func (r *Run) NodeFrom(name string, state *preflight.NodeState) string {
	return r.Plan.NodeFrom(state, r.Facts[name], r.Target.Version.String())
}

// OnNode runs fn on node, from the version it upgrades from to the
// target.
func (r *Run) OnNode(ctx context.Context, node string, fn func(context.Context, *nodeops.Ops) error) error {
	return r.Fx.OnNode(ctx, node, r.NodeFrom(node, r.Node(node)), r.Target.Version.String(), fn)
}
