package inplace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodescript"
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
	Source   Source
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
	Ignore []string
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
}

// ApplyResult reports Apply.
type ApplyResult struct {
	Plan        *Plan         `json:"plan"`
	State       *UpgradeState `json:"state,omitempty"`
	Patched     []string      `json:"tolerationsAdded,omitempty"`
	Labels      []string      `json:"labelsRestored,omitempty"`
	NothingToDo bool          `json:"nothingToDo,omitempty"`
	// Steps times each step; Waiting is the time spent waiting for
	// restarted components to be healthy (the Ready and /readyz waits),
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
		opts.BackupDir = DefaultBackupDir
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
		host, _ := os.Hostname()
		opts.Holder = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	return nil
}

// applyRun is one Apply: what every step shares.
type applyRun struct {
	opts   ApplyOptions
	client kubernetes.Interface
	log    *slog.Logger
	target *Target
	plan   *Plan
	view   *clusterView
	tgts   map[string]nodeaccess.Target
	state  *UpgradeState
	watch  *nodeWatch
	mu     sync.Mutex // state
	res    *ApplyResult
	// events posts Events in the background (nil: at once).
	events *eventQueue
	// cordoned holds the nodes this run cordoned.
	cordoned sync.Map
	// stateIdx indexes plan.Nodes by name (built once).
	indexOnce sync.Once
	stateIdx  map[string]int
	// dry: walk the steps, run what only reads, and record in res.DryRun
	// what would change instead of changing it. step is the step walked.
	dry  bool
	step string
	// writer stores the state; dirty asks flushLoop for a write.
	writerOnce sync.Once
	writer     *stateWriter
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
	r := &applyRun{opts: opts, client: p.Client, log: p.Log, target: p.Target, res: &ApplyResult{}, dry: opts.DryRun}
	if !r.dry {
		lock, err := AcquireLock(ctx, r.client, opts.Holder, opts.LockDuration, p.Now)
		if err != nil {
			return nil, err
		}
		if lock.TakenOver != "" {
			r.log.Warn("took over the lock of a run that stopped", "holder", lock.TakenOver)
		}
		var stopKeeping func()
		ctx, stopKeeping = keepLock(ctx, lock, r.log)
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
		defer r.uncordonLeftovers(ctx)
	}

	for _, s := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"plan", r.planStep},
		{"stage", r.stageStep},
		{"record", r.recordStep},
		{"back up etcd", r.etcdStep},
		{"control plane", r.controlPlaneStep},
		{"workloads", r.workloadsStep},
		{"kubelets", r.kubeletsStep},
		{"complete", r.completeStep},
	} {
		if r.res.NothingToDo {
			break
		}
		r.log.Info("step", "name", s.name, "dryRun", r.dry)
		r.step = s.name
		began := time.Now()
		err := s.fn(ctx)
		r.res.Steps = append(r.res.Steps, StepTime{Name: s.name, Seconds: time.Since(began).Seconds()})
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

// fail records the error in the state, if there is one.
func (r *applyRun) fail(ctx context.Context, err error) {
	if r.state == nil {
		return
	}
	r.mu.Lock()
	r.state.State, r.state.LastError = StateFailed, err.Error()
	r.mu.Unlock()
	if serr := r.save(context.WithoutCancel(ctx)); serr != nil {
		r.log.Error("cannot record the failure in the state", "err", serr, "failure", err)
	}
}

// keepLock renews the lock in the background until the returned stop is
// called; losing it cancels ctx with the reason. stop waits for the
// renewals to end, then releases the lock (a failure to is logged: the
// lease then expires by itself).
func keepLock(ctx context.Context, lock *Lock, log *slog.Logger) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	keepCtx, stopKeep := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lock.Keep(keepCtx, func(err error) { cancel(fmt.Errorf("lost the upgrade lock: %w", err)) })
	}()
	return ctx, func() {
		stopKeep()
		<-done
		if err := lock.Release(context.WithoutCancel(ctx)); err != nil {
			log.Warn("cannot release the upgrade lock: it expires by itself", "lease", "kube-system/"+LockName, "err", err)
		}
		cancel(nil)
	}
}

// would records, in a dry run, a change the run walks past.
func (r *applyRun) would(node, what, command string) {
	r.mu.Lock()
	r.res.DryRun = append(r.res.DryRun, Action{Step: r.step, Node: node, What: what, Command: command})
	r.mu.Unlock()
	r.log.Info("dry run: would", "step", r.step, "node", node, "what", what, "command", command)
}

// save writes the state now (a dry run keeps it in memory).
func (r *applyRun) save(ctx context.Context) error {
	if r.dry {
		return nil
	}
	r.writerOnce.Do(func() { r.writer = &stateWriter{client: r.client} })
	return r.writer.write(ctx, func() ([]byte, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.state.Updated = r.opts.Plan.Now().UTC()
		return json.Marshal(r.state)
	})
}

// stateFlushInterval bounds how often per-node progress is written.
const stateFlushInterval = time.Second

// saveSoon asks flushLoop to write the state; requests that come while a
// write is pending or within stateFlushInterval of the last are folded
// into one, so a hundred nodes in flight cost one write a second, not a
// hundred. Without a flushLoop the next save carries the change.
func (r *applyRun) saveSoon() {
	select {
	case r.dirty <- struct{}{}:
	default:
	}
}

// flushLoop writes the state when saveSoon asks, at most once per
// stateFlushInterval, until ctx ends.
func (r *applyRun) flushLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.dirty:
		}
		// A write once begun is finished: stopping waits for it.
		if err := r.save(context.WithoutCancel(ctx)); err != nil {
			r.log.Warn("cannot record the state", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(stateFlushInterval):
		}
	}
}

// startFlushing starts flushLoop; the function it returns stops it, waits
// for it, and writes what it left pending, so that nothing is written
// once the run lets go of the lock and nothing touches the state the
// caller then reads.
func (r *applyRun) startFlushing(ctx context.Context) (stop func()) {
	r.dirty = make(chan struct{}, 1)
	loopCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.flushLoop(loopCtx)
	}()
	return func() {
		cancel()
		<-done
		select {
		case <-r.dirty:
			if err := r.save(context.WithoutCancel(ctx)); err != nil {
				r.log.Warn("cannot record the state", "err", err)
			}
		default:
		}
	}
}

func (r *applyRun) setState(ctx context.Context, s string) error {
	r.mu.Lock()
	r.state.State = s
	r.mu.Unlock()
	return r.save(ctx)
}

func (r *applyRun) setNode(ctx context.Context, name, status, step string, err error) {
	r.mu.Lock()
	e := r.state.Node(name, r.tgts[name].Role)
	e.Status, e.Step, e.Updated = status, step, r.opts.Plan.Now().UTC()
	e.LastError = ""
	if err != nil {
		e.LastError = err.Error()
	}
	r.mu.Unlock()
	if r.dirty == nil {
		if serr := r.save(ctx); serr != nil {
			r.log.Warn("cannot record the state", "err", serr)
		}
		return
	}
	r.saveSoon()
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
	r.tgts = map[string]nodeaccess.Target{}
	for _, t := range v.tgts {
		r.tgts[t.Name] = t
	}
	for _, n := range r.opts.Nodes {
		if _, ok := r.tgts[n]; !ok {
			return fmt.Errorf("--nodes: node %s is not in the cluster", n)
		}
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
	if r.done() {
		r.res.NothingToDo = true
		r.log.Info("every node already runs the target: nothing to do", "version", r.target.Version.String())
	}
	return nil
}

// resolves says apply itself fixes a blocking finding, or it is about a
// worker this run leaves alone.
func (r *applyRun) resolves(f Finding) bool {
	if f.Check == "values" {
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
	if f.Check == "restarts" && r.opts.Drain {
		return true // drained first: nothing runs there to restart
	}
	return f.Check == "readmission" && r.opts.RestoreLabels && strings.Contains(f.Message, "lacks the label")
}

// selected: the node's kubelet moves in this run (control-plane nodes and
// the chosen workers).
func (r *applyRun) selected(name string) bool {
	if len(r.opts.Nodes) == 0 && r.opts.Selector == nil {
		return true
	}
	if r.tgts[name].Role == RoleControlPlane || slices.Contains(r.opts.Nodes, name) {
		return true
	}
	if n := r.view.node(name); n != nil && r.opts.Selector != nil {
		return r.opts.Selector.Matches(labels.Set(n.Labels))
	}
	return false
}

// done: every selected node's kubelet and every control-plane component
// run the target.
func (r *applyRun) done() bool {
	to := r.target.Version.String()
	for _, n := range r.plan.Nodes {
		if n.Kubelet != to && r.selected(n.Name) {
			return false
		}
		for _, c := range controlPlaneFiles {
			if v, ok := n.Components[c]; ok && v != to {
				return false
			}
		}
	}
	return true
}

func (r *applyRun) stageStep(ctx context.Context) error {
	var missing []nodeaccess.Target
	for _, n := range r.plan.Nodes {
		if !n.Staged {
			missing = append(missing, r.tgts[n.Name])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if r.dry {
		for _, t := range missing {
			arch := archOr(r.nodeState(t.Name).Arch)
			for _, name := range FilesFor(t.Role) {
				if f, _, ok := r.target.File(name, arch); ok {
					r.would(t.Name, "stage "+name, nodescript.StageFile.Show(StagePath(r.opts.Plan.StageDir, r.target.Version.String(), ""), f.Name, f.SHA256))
				}
			}
		}
		return nil
	}
	_, err := Stage(ctx, StageOptions{Target: r.target, Source: r.opts.Source, Nodes: r.view.nodes, Targets: missing,
		Connector: r.opts.Plan.Connector, Parallel: r.opts.Plan.Parallel, StageDir: r.opts.Plan.StageDir, CacheDir: r.opts.CacheDir, Log: r.log})
	return err
}

// recordStep starts (or continues) the state record: an upgrade to
// another version, a completed one and a rolled-back one start afresh (a
// new etcd snapshot among them).
func (r *applyRun) recordStep(ctx context.Context) error {
	s, err := ReadState(ctx, r.client)
	if err != nil {
		return err
	}
	to := r.target.Version.String()
	if s == nil || s.To != to || s.State == StateComplete || s.State == StateRolledBack {
		s = &UpgradeState{From: strings.Join(r.plan.From, ","), To: to, State: StateStarted, Started: r.opts.Plan.Now().UTC()}
	}
	s.Holder, s.Bundle, s.LastError = r.opts.Holder, r.target.Record.BundleDigest, ""
	for _, n := range r.plan.Nodes {
		e := s.Node(n.Name, n.Role)
		if n.Kubelet == to && e.Status != NodeDone {
			e.Status = NodeDone
		}
	}
	r.mu.Lock()
	r.state = s
	r.mu.Unlock()
	return r.save(ctx)
}

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

// onNode dials a node and runs fn with its operations, from the version
// its kubelet ran before this upgrade.
func (r *applyRun) onNode(ctx context.Context, name string, fn func(context.Context, *nodeOps) error) error {
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
	return r.onNodeFrom(ctx, name, from, fn)
}

// onNodeFrom is onNode with the old version given.
func (r *applyRun) onNodeFrom(ctx context.Context, name, from string, fn func(context.Context, *nodeOps) error) error {
	if _, err := catalog.ParseReported(from); err != nil {
		return fmt.Errorf("node %s: the version it upgrades from: %w", name, err)
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
	o := &nodeOps{n: n, name: name, stageDir: r.opts.Plan.StageDir, backupDir: r.opts.BackupDir, from: from, to: r.target.Version.String(), facts: f}
	if r.dry {
		o.dry = func(node, command string) { r.would(node, "", command) }
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
	deadline := time.Now().Add(r.opts.ReadyTimeout)
	var last error
	for time.Now().Before(deadline) {
		v, err := o.running(ctx, comp)
		switch {
		case err != nil:
			last = err
		case v != version:
			last = fmt.Errorf("%s runs %q, want %s", comp, v, version)
		case comp == "kube-apiserver" && r.opts.Plan.REST != nil:
			if err := readyz(ctx, r.opts.Plan.REST, r.tgts[o.name].Address); err != nil {
				last = err
			} else {
				return nil
			}
		default:
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("node %s: %s not healthy at %s within %s: %w", o.name, comp, version, r.opts.ReadyTimeout, last)
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

// workloadsStep adds the missing not-ready/unreachable tolerations to
// running pods and, with RestoreLabels, the labels their nodeSelectors
// need; both only add.
func (r *applyRun) workloadsStep(ctx context.Context) error {
	if err := r.setState(ctx, StatePatchingWorkloads); err != nil {
		return err
	}
	nodes := map[string]*corev1.Node{}
	for i := range r.view.nodes {
		nodes[r.view.nodes[i].Name] = &r.view.nodes[i]
	}
	for i := range r.view.pods {
		pod := &r.view.pods[i]
		if pod.Spec.NodeName == "" || isDaemonSetPod(pod) {
			continue
		}
		patch, err := tolerationsPatch(pod.Spec.Tolerations)
		if err != nil {
			return err
		}
		if patch == nil {
			continue
		}
		if r.dry {
			r.would(pod.Spec.NodeName, "add tolerations to pod "+pod.Namespace+"/"+pod.Name, string(patch))
			r.res.Patched = append(r.res.Patched, pod.Namespace+"/"+pod.Name)
			continue
		}
		if _, err := r.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("pod %s/%s: add tolerations: %w", pod.Namespace, pod.Name, err)
		}
		r.res.Patched = append(r.res.Patched, pod.Namespace+"/"+pod.Name)
	}
	if len(r.res.Patched) > 0 {
		r.log.Info("tolerations added", "pods", len(r.res.Patched))
	}
	if !r.opts.RestoreLabels {
		return nil
	}
	want := map[string]map[string]string{}
	for i := range r.view.pods {
		pod := &r.view.pods[i]
		node := nodes[pod.Spec.NodeName]
		if node == nil {
			continue
		}
		for k, v := range pod.Spec.NodeSelector {
			if have, ok := node.Labels[k]; !ok || have != v {
				if want[node.Name] == nil {
					want[node.Name] = map[string]string{}
				}
				if prev, clash := want[node.Name][k]; clash && prev != v {
					return fmt.Errorf("node %s: pods need label %s both as %q and %q", node.Name, k, prev, v)
				}
				want[node.Name][k] = v
			}
		}
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		keys := make([]string, 0, len(want[n]))
		for k := range want[n] {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var kv []string
		for _, k := range keys {
			kv = append(kv, k+"="+want[n][k])
			r.res.Labels = append(r.res.Labels, n+": "+k+"="+want[n][k])
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": want[n]}})
		if err != nil {
			return err
		}
		if r.dry {
			r.would(n, "restore labels "+strings.Join(kv, ", "), string(patch))
			continue
		}
		if _, err := r.client.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("node %s: restore labels: %w", n, err)
		}
		r.event(ctx, n, "LabelsRestored", "kubelift: labels restored for pods' nodeSelectors: "+strings.Join(kv, ", "))
	}
	return nil
}

// tolerationsPatch is the JSON patch that adds the not-ready and
// unreachable NoExecute tolerations (300 s, as DefaultTolerationSeconds
// gives) a pod lacks; nil when it lacks none. Patches only add: existing
// tolerations cannot be changed.
func tolerationsPatch(have []corev1.Toleration) ([]byte, error) {
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	var ops []op
	if have == nil {
		ops = append(ops, op{Op: "add", Path: "/spec/tolerations", Value: []corev1.Toleration{}})
	}
	seconds := int64(300)
	for _, key := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
		if !tolerates(have, key) {
			ops = append(ops, op{Op: "add", Path: "/spec/tolerations/-", Value: corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists,
				Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &seconds}})
		}
	}
	if len(ops) == 0 {
		return nil, nil
	}
	return json.Marshal(ops)
}

// annotationsPatch is a merge patch setting (or, for nil, removing) a
// Node's annotations.
func annotationsPatch(a map[string]any) ([]byte, error) {
	return json.Marshal(map[string]any{"metadata": map[string]any{"annotations": a}})
}

// kubeletsStep moves kubelets once every API server runs the target:
// control-plane nodes one at a time, then workers in a sliding window of
// at most MaxUnavailable nodes (growing 1, 2, 4 ... with Canary).
func (r *applyRun) kubeletsStep(ctx context.Context) error {
	to := r.target.Version.String()
	for _, n := range r.plan.Nodes {
		if n.Role != RoleControlPlane || r.dry { // a dry run moved no API server
			continue
		}
		if err := r.onNode(ctx, n.Name, func(ctx context.Context, o *nodeOps) error {
			v, err := o.running(ctx, "kube-apiserver")
			if err != nil {
				return err
			}
			if v != "" && v != to {
				return fmt.Errorf("node %s: kube-apiserver runs %s: kubelets move only after every API server runs %s", n.Name, v, to)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	if err := r.setState(ctx, StateUpgradingKubelets); err != nil {
		return err
	}
	if !r.dry {
		w, err := watchNodes(ctx, r.client)
		if err != nil {
			return err
		}
		defer w.close()
		r.watch = w
	}
	var cps, workers []string
	for _, n := range r.plan.Nodes {
		switch {
		case n.Role == RoleControlPlane:
			cps = append(cps, n.Name)
		case r.selected(n.Name):
			workers = append(workers, n.Name)
		}
	}
	for _, n := range cps {
		if err := r.upgradeKubelet(ctx, n); err != nil {
			return err
		}
	}
	maxU, err := ParseMaxUnavailable(r.opts.Plan.MaxUnavailable, len(workers))
	if err != nil {
		return err
	}
	return r.window(ctx, workers, maxU)
}

// window upgrades workers with at most limit in flight: a slot frees as
// soon as a node is done; with Canary the limit grows 1, 2, 4 ... while
// nodes succeed. The first failure stops new nodes; those in flight
// finish.
func (r *applyRun) window(ctx context.Context, workers []string, limit int) error {
	width := limit
	if r.opts.Plan.Canary {
		width = 1
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		inFlight int
		done     int
		firstErr error
		freed    = make(chan struct{}, len(workers))
	)
	for i := 0; i < len(workers); {
		mu.Lock()
		stop := firstErr != nil
		if !stop && inFlight < width {
			n := workers[i]
			i++
			inFlight++
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := r.upgradeKubelet(ctx, n)
				mu.Lock()
				inFlight--
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					done++
					if r.opts.Plan.Canary && done >= width {
						width = min(width*2, limit)
					}
				}
				mu.Unlock()
				freed <- struct{}{}
			}()
			continue
		}
		mu.Unlock()
		if stop {
			break
		}
		select {
		case <-freed:
			if r.opts.Soak > 0 {
				select {
				case <-time.After(r.opts.Soak):
				case <-ctx.Done():
				}
			}
		case <-ctx.Done():
			mu.Lock()
			if firstErr == nil {
				firstErr = ctx.Err()
			}
			mu.Unlock()
		}
	}
	wg.Wait()
	return firstErr
}

// upgradeKubelet is one node's kubelet, in named steps: check, back up,
// record containers, hash-skip file, swap and restart, wait Ready at the
// target, verify no container restarted, mark done. Any failure after the
// swap restores the old kubelet.
func (r *applyRun) upgradeKubelet(ctx context.Context, name string) error {
	to := r.target.Version.String()
	st := r.nodeState(name)
	// When the node started, its kubelet was swapped and it was Ready: the
	// log line of a node done says where its time went.
	began := time.Now()
	var swapped, readyAt time.Time
	err := r.onNode(ctx, name, func(ctx context.Context, o *nodeOps) error {
		// check
		v, err := o.running(ctx, "kubelet")
		if err != nil {
			return err
		}
		if v == to && r.dry {
			r.would(name, "kubelet runs "+to+" already: wait for the node Ready and mark it done", "")
			return nil
		}
		if v == to {
			if err := r.watch.until(ctx, name, r.opts.ReadyTimeout, func(n *corev1.Node) bool {
				return nodeReady(n) && n.Status.NodeInfo.KubeletVersion == to
			}); err != nil {
				return fmt.Errorf("node %s: kubelet %s already, but not Ready: %w", name, to, err)
			}
			if err := r.uncordon(ctx, name); err != nil {
				return err
			}
			return r.markDone(ctx, name)
		}
		if r.opts.Hook != nil && r.dry {
			r.would(name, "run the pre-hook", "")
		} else if r.opts.Hook != nil {
			if err := r.opts.Hook(ctx, "pre", name, o.from, to); err != nil {
				return fmt.Errorf("node %s: pre-hook: %w", name, err)
			}
		}
		r.setNode(ctx, name, NodeUpgrading, "kubelet", nil)
		r.event(ctx, name, "UpgradingKubelet", fmt.Sprintf("kubelift: kubelet %s -> %s", o.from, to))
		// drain
		if r.opts.Drain && r.dry {
			r.would(name, "cordon the node and evict its pods (PodDisruptionBudgets hold)", "")
		} else if r.opts.Drain {
			if err := r.drain(ctx, name); err != nil {
				return err
			}
		}
		// record the node's pods (from the API, while the node is worked
		// on over SSH)
		type podsResult struct {
			pods map[types.UID]string
			err  error
		}
		podsCh := make(chan podsResult, 1)
		go func() {
			p, err := r.podsOn(ctx, name)
			podsCh <- podsResult{p, err}
		}()
		// back up
		if err := o.backup(ctx, "kubelet"); err != nil {
			return err
		}
		// record containers
		before, err := o.containers(ctx)
		if err != nil {
			return err
		}
		pr := <-podsCh
		if pr.err != nil {
			return pr.err
		}
		podsBefore := pr.pods
		// hash-skip file, when the hash era changes and the kubelet reads it
		if r.target.Manifest.KubeletHashSkip(archOr(st.Arch)) {
			if era, err := r.eraOf(o.from); err != nil || era != r.target.Release.KubeletHashEra {
				if err := o.writeHashSkip(ctx, r.opts.Plan.Now()); err != nil {
					return err
				}
			}
		}
		// swap and restart
		if err := o.swap(ctx, "kubelet", r.fileSHA("kubelet", st.Arch)); err != nil {
			return r.rollback(ctx, o, "kubelet", err)
		}
		swapped = time.Now()
		if r.dry {
			r.would(name, fmt.Sprintf("wait for the node Ready at %s, settle %s, verify the same containers run and no pod is lost; roll back on failure", to, r.opts.Settle), "")
			if r.opts.Hook != nil {
				r.would(name, "run the post-hook", "")
			}
			return r.markDone(ctx, name)
		}
		// wait Ready at the target
		stopWait := r.timed(&r.res.Waiting)
		err = r.watch.until(ctx, name, r.opts.ReadyTimeout, func(n *corev1.Node) bool {
			return nodeReady(n) && n.Status.NodeInfo.KubeletVersion == to
		})
		stopWait()
		readyAt = time.Now()
		if err != nil {
			return r.rollback(ctx, o, "kubelet", fmt.Errorf("node %s not Ready at %s within %s: %w", name, to, r.opts.ReadyTimeout, err))
		}
		// verify: the kubelet has had time to act on every pod
		stopSettle := r.timed(&r.res.Settling)
		select {
		case <-time.After(r.opts.Settle):
		case <-ctx.Done():
			stopSettle()
			return ctx.Err()
		}
		stopSettle()
		if err := r.verify(ctx, o, before, podsBefore); err != nil {
			var restarted *restartedError
			if errors.As(err, &restarted) {
				// Rolling the kubelet back would restart the same containers
				// once more (the old kubelet's hash of what the new one
				// started differs again): it stays at the target.
				r.log.Error("containers restarted: the kubelet stays at the target, since rolling it back would restart them again", "node", name, "version", to, "containers", restarted.containers)
				r.event(ctx, name, "ContainersRestarted", fmt.Sprintf("kubelift: %v; kubelet left at %s (a rollback would restart them again)", err, to))
				return fmt.Errorf("%w; the kubelet stays at %s: rolling it back would restart them a second time", err, to)
			}
			return r.rollback(ctx, o, "kubelet", err)
		}
		if r.opts.Hook != nil {
			if err := r.opts.Hook(ctx, "post", name, o.from, to); err != nil {
				return r.rollback(ctx, o, "kubelet", fmt.Errorf("node %s: post-hook: %w", name, err))
			}
		}
		// uncordon (only what this run cordoned)
		if err := r.uncordon(ctx, name); err != nil {
			return err
		}
		ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
		return r.markDone(ctx, name, "took", ms(time.Since(began)),
			"before-restart", ms(swapped.Sub(began)), "until-ready", ms(readyAt.Sub(swapped)), "after-ready", ms(time.Since(readyAt)))
	})
	if err != nil {
		// Whatever failed, a cordon of this run's is undone now, not at
		// the run's end.
		if _, mine := r.cordoned.Load(name); mine {
			if uerr := r.uncordon(context.WithoutCancel(ctx), name); uerr != nil {
				err = fmt.Errorf("%w; %w", err, uerr)
			}
		}
		r.setNode(ctx, name, failedStatus(err), "kubelet", err)
		return err
	}
	return nil
}

// failedStatus is the status of a node whose step failed with err:
// rolled back when the step undid itself, else failed.
func failedStatus(err error) string {
	if errors.Is(err, ErrNodeFailed) {
		return NodeRolledBack
	}
	return NodeFailed
}

// timed adds the time until the returned func is called to *sum.
func (r *applyRun) timed(sum *float64) func() {
	began := time.Now()
	return func() {
		r.mu.Lock()
		*sum += time.Since(began).Seconds()
		r.mu.Unlock()
	}
}

func (r *applyRun) eraOf(v string) (string, error) {
	pv, err := catalog.ParseVersion(v)
	if err != nil {
		return "", err
	}
	return r.opts.Plan.Catalog.HashEraFor(pv)
}

// verify: every container that ran before the swap still runs (same IDs),
// and every pod is still there and not failed.
func (r *applyRun) verify(ctx context.Context, o *nodeOps, before map[string]string, podsBefore map[types.UID]string) error {
	after, err := o.containers(ctx)
	if err != nil {
		return err
	}
	var gone []string
	for id, what := range before {
		if _, ok := after[id]; !ok {
			gone = append(gone, what)
		}
	}
	sort.Strings(gone)
	if len(gone) > 0 && !r.opts.Plan.AllowRestarts && !r.opts.Drain {
		return &restartedError{node: o.name, containers: gone}
	}
	podsAfter, err := r.podsOn(ctx, o.name)
	if err != nil {
		return err
	}
	for uid, p := range podsBefore {
		if strings.HasSuffix(p, " Failed") || strings.HasSuffix(p, " Succeeded") {
			continue
		}
		if q, ok := podsAfter[uid]; !ok {
			return fmt.Errorf("node %s: pod %s is gone (evicted?)", o.name, p)
		} else if strings.HasSuffix(q, " Failed") {
			return fmt.Errorf("node %s: pod %s failed", o.name, q)
		}
	}
	return nil
}

// restartedError: containers that ran before the swap do not any more.
type restartedError struct {
	node       string
	containers []string
}

func (e *restartedError) Error() string {
	return fmt.Sprintf("node %s: %d containers restarted: %s", e.node, len(e.containers), strings.Join(e.containers, ", "))
}

// podsOn maps the UIDs of a node's pods to "ns/name PHASE"; pods that had
// already ended are left out. The list is served from the API server's
// watch cache (resourceVersion 0), indexed by node: a consistent list
// from an API server before 1.31 reads every pod of the cluster from etcd
// to keep one node's, twice per node (the scale benchmark's 5000 nodes
// saturated the API server so). The cache trails etcd by the watch's
// latency, milliseconds, far less than the --settle pause before the
// list that verifies.
func (r *applyRun) podsOn(ctx context.Context, node string) (map[types.UID]string, error) {
	l, err := r.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node, ResourceVersion: "0"})
	if err != nil {
		return nil, fmt.Errorf("list pods on %s: %w", node, err)
	}
	out := map[types.UID]string{}
	for _, p := range l.Items {
		out[p.UID] = p.Namespace + "/" + p.Name + " " + string(p.Status.Phase)
	}
	return out, nil
}

// markDone annotates the Node with the version and bundle it was upgraded
// to, and records it done.
func (r *applyRun) markDone(ctx context.Context, name string, attrs ...any) error {
	to := r.target.Version.String()
	patch, err := annotationsPatch(map[string]any{AnnotationUpgradedTo: to, AnnotationBundle: r.target.Record.BundleDigest})
	if err != nil {
		return err
	}
	if r.dry {
		r.would(name, "annotate the node upgraded", string(patch))
		return nil
	}
	if _, err := r.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: mark done: %w", name, err)
	}
	r.setNode(ctx, name, NodeDone, "", nil)
	r.event(ctx, name, "Upgraded", "kubelift: upgraded to "+to)
	r.log.Info("upgraded", append([]any{"node", name, "version", to}, attrs...)...)
	return nil
}

func (r *applyRun) completeStep(ctx context.Context) error {
	for _, n := range r.plan.Nodes {
		if !r.selected(n.Name) && n.Kubelet != r.target.Version.String() {
			r.log.Info("left for a later apply", "node", n.Name)
			return r.setState(ctx, StateUpgradingKubelets) // manual mode: some remain
		}
	}
	return r.setState(ctx, StateComplete)
}

// event records a Kubernetes Event on a Node (best effort): through the
// run's event queue when it has one, so no node waits on it.
func (r *applyRun) event(ctx context.Context, node, reason, msg string) {
	if r.dry {
		return
	}
	now := metav1.NewTime(r.opts.Plan.Now())
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: node + ".kubelift-", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}, Reason: reason, Message: msg,
		Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "kubelift"}, FirstTimestamp: now, LastTimestamp: now, Count: 1}
	if reason == "RollingBack" {
		ev.Type = corev1.EventTypeWarning
	}
	if r.events != nil {
		r.events.post(ev)
		return
	}
	if _, err := r.client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		r.log.Warn("cannot record an event", "node", node, "err", err)
	}
}

// eventQueue posts Events in the background, so that nodes in flight
// never wait on them; they go through the run's client and so its rate
// limit (--kube-qps). Best effort: when the queue is full an event is
// dropped, with a warning.
type eventQueue struct {
	client kubernetes.Interface
	log    *slog.Logger
	ch     chan *corev1.Event
	done   chan struct{}
	// giveUp ends the posting of what is left (close past its wait).
	giveUp context.CancelFunc
}

// newEventQueue starts the queue; its posts outlive ctx's cancellation
// (the events of a failure are worth recording) until close gives up.
func newEventQueue(ctx context.Context, c kubernetes.Interface, log *slog.Logger) *eventQueue {
	q := &eventQueue{client: c, log: log, ch: make(chan *corev1.Event, 4096), done: make(chan struct{})}
	postCtx, giveUp := context.WithCancel(context.WithoutCancel(ctx))
	q.giveUp = giveUp
	go q.run(postCtx)
	return q
}

func (q *eventQueue) run(ctx context.Context) {
	defer close(q.done)
	for ev := range q.ch {
		postCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := q.client.CoreV1().Events(ev.Namespace).Create(postCtx, ev, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
			q.log.Warn("cannot record an event", "node", ev.InvolvedObject.Name, "reason", ev.Reason, "err", err)
		}
		cancel()
	}
}

func (q *eventQueue) post(ev *corev1.Event) {
	select {
	case q.ch <- ev:
	default:
		q.log.Warn("event queue full: event dropped", "node", ev.InvolvedObject.Name, "reason", ev.Reason)
	}
}

// close posts what is queued, waiting at most timeout; what is left
// then is given up, and the queue is gone when close returns.
func (q *eventQueue) close(timeout time.Duration) {
	close(q.ch)
	select {
	case <-q.done:
	case <-time.After(timeout):
		q.log.Warn("events still queued at exit were not recorded")
		q.giveUp()
		<-q.done
	}
	q.giveUp()
}
