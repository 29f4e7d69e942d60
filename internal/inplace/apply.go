package inplace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/drain"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/upgradelock"
	"github.com/kubelift/kubelift/internal/waiter"
)

// Annotations the engine leaves on a Node it upgraded: the cluster itself
// says what is done (as system-upgrade-controller's label does).
const (
	AnnotationUpgradedTo = "kubelift.dev/upgraded-to"
	AnnotationBundle     = "kubelift.dev/bundle"
)

// ApplyOptions configure Apply. The plan's options say what to read.
type ApplyOptions struct {
	Plan PlanOptions
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
	Ignore []Check
	// Soak waits between worker batches.
	Soak time.Duration
	// Settle is how long a restarted kubelet runs before its node is
	// verified (every container still the same).
	Settle time.Duration
	// ReadyTimeout bounds the wait for a restarted component.
	ReadyTimeout time.Duration
	// SkipEtcdBackup skips the etcd snapshot.
	SkipEtcdBackup bool
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
	// Clock is what every wait of the run waits on (the real clock when
	// nil; unit tests drive a fake one).
	Clock clock.Clock
}

// ApplyResult reports Apply.
type ApplyResult struct {
	Plan        *Plan           `json:"plan"`
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

// StepTime is how long one step of Apply took.
type StepTime struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// ErrNodeFailed means a node failed its upgrade and was rolled back.
var ErrNodeFailed = errors.New("node upgrade failed")

// defaults fills in what Apply and Rollback use and the caller left out.
func (opts *ApplyOptions) defaults() error {
	if err := opts.Plan.defaults(); err != nil {
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

// applyRun is one Apply: what every step shares.
type applyRun struct {
	opts   ApplyOptions
	client kubernetes.Interface
	log    *slog.Logger
	target *release.Release
	plan   *Plan
	view   *clusterView
	tgts   map[string]nodeaccess.Target
	state  *record.Upgrade
	watch  *nodeWatch
	// driver moves the control plane (the cluster's kind).
	driver controlPlane
	// lock is the upgrade lock the run holds (nil in a dry run): every
	// node step and record write asks it first (fence).
	lock *upgradelock.Lock
	// moved: control-plane nodes a part of which was swapped or restored
	// since the node was last settled (settle.go); under mu.
	moved map[string]map[string]bool
	// workloads serves the workload gate (gate.go) while kubelets move;
	// nil in a dry run or with NoWorkloadGate.
	workloads *workloadWatch
	// wait is every wait and every time read of the run.
	wait waiter.Waiter
	mu   sync.Mutex // state
	res  *ApplyResult
	// events posts Events in the background (nil: at once).
	events *eventQueue
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
	// writer stores the state; dirty asks flushLoop for a write.
	writerOnce sync.Once
	writer     *record.Writer
	dirty      chan struct{}
}

// Apply upgrades the cluster in place, in the plan's order, each step
// checking the cluster first so that a second run (after a failure, a
// kill, or on a cluster already upgraded) continues where the first
// stopped:
//
//	lock -> plan -> stage -> back up etcd -> control plane, node by node
//	-> tolerations (and labels) -> kubelets, control-plane nodes then
//	worker batches -> complete
func Apply(ctx context.Context, opts ApplyOptions) (*ApplyResult, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	p := &opts.Plan
	r := &applyRun{opts: opts, client: p.Client, log: p.Log, target: p.Target, res: &ApplyResult{}, dry: opts.DryRun, wait: waiter.Waiter{Clock: opts.Clock}}
	if !r.dry {
		lock, err := upgradelock.Acquire(ctx, r.client, opts.Holder, opts.LockDuration, opts.Clock, r.log)
		if err != nil {
			return nil, err
		}
		r.lock = lock
		if lock.TakenOver != "" {
			r.log.Warn("took over the lock of a run that stopped", "holder", lock.TakenOver)
		}
		var stopKeeping func()
		ctx, stopKeeping = upgradelock.Hold(ctx, lock, r.log)
		defer stopKeeping()
		// Deferred in reverse: cordons this run left undone, events posted
		// and the state written before the lock is released.
		defer r.startFlushing(ctx)()
		r.events = newEventQueue(ctx, r.client, r.log)
		defer func() {
			wait := 30 * time.Second
			if ctx.Err() != nil {
				wait = 3 * time.Second // interrupted: the API may be what failed
			}
			r.events.close(wait)
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
func (r *applyRun) runbook() []step {
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
		{name: "control plane", do: r.controlPlaneStep, undo: r.controlPlaneUndo},
		{name: "kubelets", do: r.kubeletsStep, undo: r.kubeletsUndo},
		{name: "complete", do: r.completeStep},
	}
}

// would records, in a dry run, a change the run walks past.
func (r *applyRun) would(node, what, command string) {
	r.mu.Lock()
	r.res.DryRun = append(r.res.DryRun, Action{Step: r.step, Node: node, What: what, Command: command})
	r.mu.Unlock()
	r.log.Info("dry run: would", "step", r.step, "node", node, "what", what, "command", command)
}

// planStep builds the plan and refuses on blocking findings apply does
// not resolve itself.
func (r *applyRun) planStep(ctx context.Context) error {
	v, err := readCluster(ctx, r.opts.Plan)
	if err != nil {
		return err
	}
	p, err := evaluate(ctx, r.opts.Plan, v)
	if err != nil && !errors.Is(err, ErrBlocked) {
		return err
	}
	r.plan, r.view, r.res.Plan = p, v, p
	r.driver = driverFor(v)
	r.tgts = map[string]nodeaccess.Target{}
	for _, t := range v.tgts {
		r.tgts[t.Name] = t
	}
	for _, n := range r.opts.Nodes {
		if _, ok := r.tgts[n]; !ok {
			return fmt.Errorf("--nodes: node %s is not in the cluster", n)
		}
	}
	if r.opts.KubeadmConfig != nil {
		switch {
		case v.kubeadm == nil:
			return fmt.Errorf("--kubeadm-config: the cluster was not built by kubeadm (no configmap %s/%s): there is no kubeadm to give it to", kubeadm.ConfigNamespace, kubeadm.ConfigMapName)
		case r.target.Version.Minor < 31:
			return fmt.Errorf("--kubeadm-config: kubeadm %s has no UpgradeConfiguration (kubeadm v1.31 and later do)", r.target.Version)
		}
	}
	if r.resumingControlPlane, err = controlPlaneInFlight(ctx, r.client, r.target.Version.String()); err != nil {
		return err
	}
	var blocking []string
	for _, f := range p.Findings {
		if f.Severity != Blocking || r.resolves(f) {
			continue
		}
		blocking = append(blocking, fmt.Sprintf("%s %s: %s", f.Check, f.Object, f.Message))
	}
	if len(blocking) > 0 {
		return fmt.Errorf("%w by %d findings (upgrade plan shows them):\n  %s", ErrBlocked, len(blocking), strings.Join(blocking, "\n  "))
	}
	done, err := r.done(ctx)
	if err != nil {
		return err
	}
	if done {
		r.res.NothingToDo = true
		r.log.Info("every node already runs the target: nothing to do", "version", r.target.Version.String())
	}
	return nil
}

// controlPlaneInFlight returns the control-plane nodes a recorded kubeadm
// upgrade to to was moving when its run stopped (kubeadm, detached, may
// still be restarting their components); none for a binary cluster, whose
// parts move only while kubelift runs.
func controlPlaneInFlight(ctx context.Context, c kubernetes.Interface, to string) (map[string]bool, error) {
	s, err := record.Read(ctx, c)
	if err != nil || s == nil || s.To != to || s.ControlPlane != release.KindKubeadm {
		return nil, err
	}
	var moving map[string]bool
	for _, n := range s.Nodes {
		if n.Role == release.RoleControlPlane && n.Status == record.NodeUpgrading {
			if moving == nil {
				moving = map[string]bool{}
			}
			moving[n.Name] = true
		}
	}
	return moving, nil
}

// resolves says apply itself fixes a blocking finding, or it is about a
// worker this run leaves alone.
func (r *applyRun) resolves(f Finding) bool {
	if f.Check == CheckValues {
		return false // never ignored, whatever the node: nothing runs on values that did not parse
	}
	if f.Node != "" && !r.selected(f.Node) {
		return true
	}
	for _, c := range r.opts.Ignore {
		if c == f.Check {
			return true
		}
	}
	if f.Check == CheckRestarts && r.opts.Drain {
		return true // drained first: nothing runs there to restart
	}
	if f.Check == CheckHealth && len(r.resumingControlPlane) > 0 &&
		(r.resumingControlPlane[strings.TrimPrefix(f.Object, "apiserver/")] || strings.HasPrefix(f.Object, "lease/")) {
		// The run this one resumes stopped while kubeadm moved a
		// control-plane node (it may be restarting that node's API
		// server, or the leaders, right now): the control plane step
		// follows that kubeadm run, waits for the node's static pods to
		// be Ready at the target, and for the leases before the next
		// node.
		r.log.Warn("resuming a control plane upgrade in flight: the control plane step waits for this", "object", f.Object, "finding", f.Message)
		return true
	}
	return f.Check == CheckReadmission && f.Code == CodeLabelsMissing && r.opts.RestoreLabels
}

// selected: the node's kubelet moves in this run (control-plane nodes and
// the chosen workers).
func (r *applyRun) selected(name string) bool {
	if len(r.opts.Nodes) == 0 && r.opts.Selector == nil {
		return true
	}
	if r.tgts[name].Role == release.RoleControlPlane || slices.Contains(r.opts.Nodes, name) {
		return true
	}
	if n := r.view.node(name); n != nil && r.opts.Selector != nil {
		return r.opts.Selector.Matches(labels.Set(n.Labels))
	}
	return false
}

// done: every selected node's kubelet and every control-plane component
// run the target, and nothing a run left is unfinished: no Node carries
// kubelift's in-flight record or cordon, and the record of an upgrade to
// the target says it completed (a run that died after the last swap, or
// before its last step, is finished, not taken for done).
func (r *applyRun) done(ctx context.Context) (bool, error) {
	to := r.target.Version.String()
	for i := range r.view.nodes {
		a := r.view.nodes[i].Annotations
		if _, ok := a[AnnotationInFlight]; (ok || a[drain.AnnotationCordoned] == "true") && r.selected(r.view.nodes[i].Name) {
			return false, nil
		}
	}
	s, err := record.Read(ctx, r.client)
	if err != nil {
		return false, err
	}
	if s != nil && s.To == to && s.State != record.StateComplete && s.State != record.StateRolledBack {
		if s.State != record.StateUpgradingKubelets {
			return false, nil
		}
		for _, e := range s.Nodes {
			if e.Status == record.NodeUpgrading {
				return false, nil
			}
		}
		// Manual mode leaves workers for a later apply; with none left,
		// the run that stopped never said complete.
		every := true
		for _, n := range r.plan.Nodes {
			every = every && r.nodeAtTarget(n)
		}
		if every {
			return false, nil
		}
	}
	return r.allAtTarget(), nil
}

// allAtTarget: every selected node's kubelet and every control-plane
// component run the target.
func (r *applyRun) allAtTarget() bool {
	to := r.target.Version.String()
	for _, n := range r.plan.Nodes {
		if !r.nodeAtTarget(n) && r.selected(n.Name) {
			return false
		}
		for _, c := range release.ControlPlaneFiles {
			if v, ok := n.Components[c]; ok && v != to {
				return false
			}
		}
	}
	return true
}

// nodeAtTarget: the node's kubelet runs the target, and so does its
// kube-proxy unit when it has one and the bundle carries kube-proxy.
func (r *applyRun) nodeAtTarget(n NodeState) bool {
	to := r.target.Version.String()
	if n.Kubelet != to {
		return false
	}
	v, runs := n.Components[proxyComponent]
	if _, _, inBundle := r.target.File(proxyComponent, archOr(n.Arch)); runs && inBundle && v != to {
		return false
	}
	return true
}

func (r *applyRun) stageStep(ctx context.Context) error {
	var missing []nodeaccess.Target
	for _, n := range r.plan.Nodes {
		// The plan reads what is staged of the target only: with hops, a
		// control-plane node is always passed to Stage, which sends only
		// what is not there.
		if !n.Staged || (len(r.target.Hops) > 0 && n.Role == release.RoleControlPlane) {
			missing = append(missing, r.tgts[n.Name])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if r.dry {
		for _, t := range missing {
			arch := archOr(r.nodeState(t.Name).Arch)
			would := func(rel *release.Release, names []string, label string) {
				for _, name := range names {
					if f, _, ok := rel.File(name, arch); ok {
						r.would(t.Name, "stage "+label+name+" (pulled from the registry where the node reaches it, else sent over SSH)",
							nodescript.StageFile.Show(release.StagePath(r.opts.Plan.StageDir, rel.Version.String(), ""), f.Name, f.SHA256, strconv.FormatInt(f.Size, 10), "zstd", "0"))
					}
				}
			}
			for _, h := range r.target.Hops {
				would(h, release.HopFilesForKind(r.driver.Kind(), t.Role), h.Version.String()+"/")
			}
			if !r.nodeState(t.Name).Staged {
				would(r.target, release.FilesForKind(r.driver.Kind(), t.Role), "")
			}
		}
		return nil
	}
	_, err := stage.Run(ctx, stage.Options{Release: r.target, Source: r.opts.Source, Nodes: r.view.nodes, Addresses: missing,
		Connector: r.opts.Plan.Connector, Parallel: r.opts.Plan.Parallel, StageDir: r.opts.Plan.StageDir, CacheDir: r.opts.CacheDir, Kind: r.driver.Kind(),
		Via: r.opts.Plan.StageVia, Codec: r.opts.Plan.StageCodec, NodeCredentials: r.opts.Plan.NodeCredentials, Log: r.log})
	return err
}

// recordStep starts (or continues) the state record: an upgrade to
// another version, a completed one and a rolled-back one start afresh (a
// new etcd snapshot among them).
func (r *applyRun) recordStep(ctx context.Context) error {
	s, err := record.Read(ctx, r.client)
	if err != nil {
		return err
	}
	to := r.target.Version.String()
	if s == nil || s.To != to || s.State == record.StateComplete || s.State == record.StateRolledBack {
		s = &record.Upgrade{From: strings.Join(r.plan.From, ","), To: to, State: record.StateStarted, Started: r.opts.Plan.Now().UTC()}
	}
	s.Holder, s.Bundle, s.LastError, s.ControlPlane = r.opts.Holder, r.target.Record.BundleDigest, "", r.driver.Kind()
	s.Hops = r.plan.Hops
	for _, n := range r.plan.Nodes {
		e := s.Node(n.Name, n.Role)
		inFlight := false
		if node := r.view.node(n.Name); node != nil {
			_, inFlight = node.Annotations[AnnotationInFlight]
		}
		if r.nodeAtTarget(n) && e.Status != record.NodeDone && !inFlight {
			e.Status = record.NodeDone
		}
	}
	r.mu.Lock()
	r.state = s
	r.mu.Unlock()
	return r.save(ctx)
}

// onNode dials a node and runs fn with its operations, from the version
// its kubelet ran before this upgrade.
func (r *applyRun) onNode(ctx context.Context, name string, fn func(context.Context, *nodeops.Ops) error) error {
	return r.onNodeFrom(ctx, name, r.onNodeFromVersion(name), fn)
}

// fence is asked before every node step and record write: nil while the
// run holds the upgrade lock. A run whose renewals fail past the renew
// deadline (its API server unreachable) waits up to the lock's duration
// for one to succeed, then stops: another run may have taken the lock
// over by then (docs/runbook.md, "The lock").
func (r *applyRun) fence(ctx context.Context) error {
	if r.lock == nil {
		return nil
	}
	return r.lock.Fence(ctx, r.opts.LockDuration)
}

// lostForGood says why the run lost the lock for good (another run holds
// it now), nil otherwise: an undo then leaves the node to that run (it
// finishes a node from its in-flight record) instead of writing over
// what it may be doing.
func (r *applyRun) lostForGood() error {
	if r.lock == nil {
		return nil
	}
	return r.lock.Lost()
}

// onNodeFromVersion is the version node upgrades from: its kubelet's
// before this upgrade.
func (r *applyRun) onNodeFromVersion(name string) string {
	from := ""
	if f := r.view.facts[name]; f != nil {
		from = f.Components["kubelet"]
	}
	if s := r.nodeState(name); s != nil && s.Kubelet != "" {
		from = s.Kubelet
	}
	if len(r.plan.From) > 0 && (from == "" || from == r.target.Version.String()) {
		from = r.plan.From[0]
	}
	return from
}

// onNodeFrom is onNode with the old version given.
func (r *applyRun) onNodeFrom(ctx context.Context, name, from string, fn func(context.Context, *nodeops.Ops) error) error {
	return r.onNodeTo(ctx, name, from, r.target.Version.String(), fn)
}

// onNodeTo is onNode moving from one given version to another (a hop).
func (r *applyRun) onNodeTo(ctx context.Context, name, from, to string, fn func(context.Context, *nodeops.Ops) error) error {
	if _, err := catalog.ParseReported(from); err != nil {
		return fmt.Errorf("node %s: the version it upgrades from: %w", name, err)
	}
	if err := r.fence(ctx); err != nil {
		return fmt.Errorf("node %s: not started: %w", name, err)
	}
	t := r.tgts[name]
	n, err := r.opts.Plan.Connector.Dial(ctx, t)
	if err != nil {
		return err
	}
	defer n.Close()
	// The plan read the node's units, programs and flags; they do not
	// change while it is upgraded (only what runs does, read live).
	f := r.view.facts[name]
	if f == nil {
		return fmt.Errorf("node %s: not read by the plan", name)
	}
	o := &nodeops.Ops{Node: n, Name: name, StageDir: r.opts.Plan.StageDir, BackupDir: r.opts.BackupDir, From: from, To: to, Facts: f}
	if r.dry {
		o.Dry = func(node, command string) { r.would(node, "", command) }
	}
	o.Restarted = func(d time.Duration) {
		r.mu.Lock()
		r.res.Waiting += d.Seconds()
		r.mu.Unlock()
	}
	return fn(ctx, o)
}

func (r *applyRun) nodeState(name string) *NodeState {
	r.indexOnce.Do(func() {
		r.stateIdx = make(map[string]int, len(r.plan.Nodes))
		for i := range r.plan.Nodes {
			r.stateIdx[r.plan.Nodes[i].Name] = i
		}
	})
	if i, ok := r.stateIdx[name]; ok {
		return &r.plan.Nodes[i]
	}
	return nil
}

func (r *applyRun) fileSHA(name, arch string) string {
	f, _, _ := r.target.File(name, archOr(arch))
	return f.SHA256
}
