// Package runbook applies an upgrade in place, rolls it back, and resumes
// either: the cluster's steps as one ordered list (runbook(): plan, stage,
// record, workloads, back up etcd, control plane, kubelets, complete),
// walked forward by Apply and backward by Rollback, each step checking the
// cluster first so that a second run continues the first; each node's
// kubelet as the named steps of kubeletSteps, in the workers' window. The
// control plane moves through the driver of the cluster's kind
// (driver.ControlPlane); what the runbook does is in docs/runbook.md.
package runbook

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/drain"
	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/inplace/workloads"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/upgradelock"
	"github.com/kubelift/kubelift/internal/waiter"
)

// ApplyOptions configure Apply. The plan's options say what to read.
type ApplyOptions struct {
	Plan preflight.PlanOptions
	// Source supplies files missing on the nodes (staged first).
	Source   stage.Source
	CacheDir string
	// BackupDir is where replaced binaries go on each node.
	BackupDir string
	// Holder names this run in the lock.
	Holder string
	// LockDuration is how long the lock lasts unless renewed.
	LockDuration time.Duration
	// RestoreLabels adds back the labels pods' nodeSelectors need.
	RestoreLabels bool
	// Ignore lists checks whose blocking findings do not stop apply.
	Ignore []preflight.Check
	// Soak waits between worker batches.
	Soak time.Duration
	// Settle is how long a restarted kubelet runs before its node is
	// verified (every container still the same).
	Settle time.Duration
	// ReadyTimeout bounds the wait for a restarted component.
	ReadyTimeout time.Duration
	// SkipEtcdBackup skips the etcd snapshot; Snapshot keeps it off its
	// node (a copy on this machine, and the copy in a registry).
	SkipEtcdBackup bool
	Snapshot       driver.Snapshots
	// DryRun plans and says what would be done; nothing changes.
	DryRun bool
	// Drain cordons each node and evicts its pods (PodDisruptionBudgets
	// hold) before its kubelet restarts, and uncordons it after; predicted
	// restarts then do not block. DrainTimeout bounds a drain.
	Drain        bool
	DrainTimeout time.Duration
	// Hook, when set, runs before ("pre") and after ("post") each node's
	// kubelet moves; a pre failure stops the run before the node is
	// touched, a post failure rolls the node back (a health gate).
	Hook func(ctx context.Context, phase, node, from, to string) error
	// Nodes or Selector choose the workers whose kubelets move (manual
	// mode, TKEStack's): the control plane always goes first; the other
	// workers wait for a later apply, and status shows them pending.
	Nodes    []string
	Selector labels.Selector
	// KubeadmConfig, on a kubeadm cluster, is an UpgradeConfiguration
	// given to every `kubeadm upgrade` (--config): kubeadm's own
	// settings, its timeouts for example.
	KubeadmConfig *kubeadm.UpgradeConfig
	// Locked, where set, runs once the run holds the lock, before
	// anything else, with the holder whose lock it took over (""):
	// agent mode takes over what that run left (its agents, its requests).
	Locked func(ctx context.Context, takenOver string) error
	// Clock is what every wait of the run waits on (the real clock when
	// nil; unit tests drive a fake one).
	Clock clock.Clock
}

// ApplyResult reports Apply.
type ApplyResult struct {
	Plan        *preflight.Plan `json:"plan"`
	State       *record.Upgrade `json:"state,omitempty"`
	Patched     []string        `json:"tolerationsAdded,omitempty"`
	Labels      []string        `json:"labelsRestored,omitempty"`
	NothingToDo bool            `json:"nothingToDo,omitempty"`
	// Steps times each step; Waiting is the time spent waiting for
	// restarted components (their units' restarts, by the node's clock,
	// and the Ready and /readyz waits),
	// Settling the --settle pauses, summed over nodes (nodes in flight
	// together overlap).
	Steps    []StepTime `json:"steps,omitempty"`
	Waiting  float64    `json:"waitingSeconds"`
	Settling float64    `json:"settlingSeconds"`
	// Restarts times each unit restart a swap made (by the node's clock
	// where it told: see nodeops.Ops.Restarted), in the order they ended.
	Restarts []UnitRestart `json:"restarts,omitempty"`
	// DryRun lists, for a dry run, every change the run would make, in
	// order: nothing was changed.
	DryRun []Action `json:"dryRun,omitempty"`
}

// Action is one change a dry run walked past without making it.
type Action struct {
	Step string `json:"step"`
	Node string `json:"node,omitempty"`
	// What says it in words; Command is the node script with its
	// arguments (kubelift-NAME ARG...), or the API patch.
	What    string `json:"what,omitempty"`
	Command string `json:"command,omitempty"`
}

// UnitRestart is how long one unit on one node took to restart.
type UnitRestart struct {
	Node    string  `json:"node"`
	Unit    string  `json:"unit"`
	Seconds float64 `json:"seconds"`
}

// StepTime is how long one step of Apply took.
type StepTime struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// ErrNodeFailed means a node failed its upgrade and was rolled back.
var ErrNodeFailed = driver.ErrNodeFailed

// defaults fills in what Apply and Rollback use and the caller left out.
func (opts *ApplyOptions) defaults() error {
	if err := opts.Plan.Defaults(); err != nil {
		return err
	}
	if opts.BackupDir == "" {
		opts.BackupDir = release.DefaultBackupDir
	}
	if opts.LockDuration == 0 {
		opts.LockDuration = 60 * time.Second
	}
	if opts.Settle == 0 {
		opts.Settle = 15 * time.Second
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 5 * time.Minute
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = 2 * time.Minute
	}
	if opts.Holder == "" {
		opts.Holder = upgradelock.NewHolder()
	}
	return nil
}

// upgradeRun is one Apply or Rollback: what every step shares.
type upgradeRun struct {
	opts   ApplyOptions
	client kubernetes.Interface
	log    *slog.Logger
	target *release.Release
	plan   *preflight.Plan
	view   *preflight.View
	tgts   map[string]nodeaccess.Address
	state  *record.Upgrade
	watch  *cluster.NodeWatch
	// driver moves the control plane (the cluster's kind).
	driver driver.ControlPlane
	// lock is the upgrade lock the run holds (nil in a dry run): every
	// node step and record write asks it first (fence).
	lock *upgradelock.Lock
	// moved: control-plane nodes a part of which was swapped or restored
	// since the node was last settled (settle.go).
	moved driver.Moved
	// workloads serves the workload gate (gate.go) while kubelets move;
	// nil in a dry run or with NoWorkloadGate.
	workloads *workloads.Watch
	// wait is every wait and every time read of the run.
	wait waiter.Waiter
	mu   sync.Mutex // state
	res  *ApplyResult
	// events posts Events in the background (nil: at once).
	events *record.Events
	// drainerOnce builds drainer: it cordons, drains and uncordons, and
	// holds the nodes this run cordoned.
	drainerOnce sync.Once
	drainer     *drain.Drainer
	// resumingControlPlane: the control-plane nodes kubeadm was moving
	// when the run this one resumes stopped.
	resumingControlPlane map[string]bool
	// stateIdx indexes plan.Nodes by name (built once).
	indexOnce sync.Once
	stateIdx  map[string]int
	// dry: walk the steps, run what only reads, and record in res.DryRun
	// what would change instead of changing it. step is the step walked.
	dry  bool
	step string
	// writer stores the state; flush writes it in the background while
	// nodes are in flight (nil before startFlushing).
	writerOnce sync.Once
	writer     *record.Writer
	flush      *record.Flusher
}

// Apply upgrades the cluster in place, in the plan's order, each step
// checking the cluster first so that a second run (after a failure, a
// kill, or on a cluster already upgraded) continues where the first
// stopped:
//
//	lock -> plan -> stage -> tolerations (and labels) -> back up etcd ->
//	control plane, node by node -> CoreDNS (binary clusters) -> kubelets,
//	control-plane nodes then worker batches -> complete
func Apply(ctx context.Context, opts ApplyOptions) (*ApplyResult, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	p := &opts.Plan
	r := &upgradeRun{opts: opts, client: p.Client, log: p.Log, target: p.Target, res: &ApplyResult{}, dry: opts.DryRun, wait: waiter.Waiter{Clock: opts.Clock}}
	if !r.dry {
		var stop func()
		var err error
		if r.lock, ctx, stop, err = upgradelock.Take(ctx, r.client, opts.Holder, opts.LockDuration, opts.Clock, r.log, opts.Locked); err != nil {
			return nil, err
		}
		defer stop()
		// Deferred in reverse: cordons this run left undone, events posted
		// and the state written before the lock is released.
		defer r.startFlushing(ctx)()
		r.events = record.NewEvents(ctx, r.client, r.log)
		defer func() {
			wait := 30 * time.Second
			if ctx.Err() != nil {
				wait = 3 * time.Second // interrupted: the API may be what failed
			}
			r.events.Close(wait)
		}()
		defer r.nodes().UncordonLeftovers(ctx)
	}

	for _, s := range r.runbook() {
		if r.res.NothingToDo {
			break
		}
		r.log.Info("step", "name", s.name, "dryRun", r.dry)
		r.step = s.name
		began := r.wait.Now()
		err := s.do(ctx)
		r.res.Steps = append(r.res.Steps, StepTime{Name: s.name, Seconds: r.wait.Since(began).Seconds()})
		r.res.State = r.state
		if err != nil {
			if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
				err = fmt.Errorf("%w (%w)", err, cause)
			}
			r.fail(ctx, err)
			return r.res, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return r.res, nil
}

// step is one step of the runbook: do makes it happen (and, run again,
// skips what is done already, so a second run continues the first); undo,
// when the step changes something a rollback puts back, puts it back.
type step struct {
	name     string
	do, undo func(context.Context) error
}

// runbook is the upgrade, in order. Apply walks it forward with do;
// Rollback walks it backward with undo.
func (r *upgradeRun) runbook() []step {
	return []step{
		{name: "plan", do: r.planStep},
		{name: "stage", do: r.stageStep},
		// Undone last: the record says the upgrade was rolled back.
		{name: "record", do: r.recordStep, undo: r.recordUndo},
		// The snapshot is kept: it is what a restore of etcd would need.
		// Before any component restarts: a node whose kubelet cannot reach
		// an API server for a while (its only endpoint restarting, as
		// kubeadm moves the control plane) is tainted NotReady by a
		// controller manager that still runs elsewhere, and pods without
		// the tolerations are evicted at once. Tolerations and labels
		// added are right for the old version too.
		{name: "workloads", do: r.workloadsStep},
		{name: "back up etcd", do: r.etcdStep},
		// Before the control plane, as kubeadm moves etcd: the API
		// servers of both versions speak to either etcd.
		{name: "etcd", do: r.etcdMoveStep, undo: r.etcdUndo},
		{name: "control plane", do: r.controlPlaneStep, undo: r.controlPlaneUndo},
		{name: "coredns", do: r.corednsStep, undo: r.corednsUndo},
		{name: "kubelets", do: r.kubeletsStep, undo: r.kubeletsUndo},
		{name: "complete", do: r.completeStep},
	}
}

// would records, in a dry run, a change the run walks past.
func (r *upgradeRun) would(node, what, command string) {
	r.mu.Lock()
	r.res.DryRun = append(r.res.DryRun, Action{Step: r.step, Node: node, What: what, Command: command})
	r.mu.Unlock()
	r.log.Info("dry run: would", "step", r.step, "node", node, "what", what, "command", command)
}
