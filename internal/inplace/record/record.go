// Package record is the upgrade's record in the cluster: the ConfigMap
// kube-system/kubelift-upgrade that says where an upgrade is (its state,
// each node's status and step, the last error), so that any admin machine
// can show or resume it, written by one run at a time and never over
// another run's record.
package record

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/release"
)

// Name is the ConfigMap in kube-system holding the upgrade's state,
// so that any admin machine can show or resume it (kubectl -n kube-system
// get configmap kubelift-upgrade -o jsonpath='{.data.state\.json}').
const Name = "kubelift-upgrade"

// Upgrade states, in the order an upgrade passes them (StarlingX's).
const (
	StateStarted               = "upgrade-started"
	StatePatchingWorkloads     = "patching-workloads"
	StateUpgradingControlPlane = "upgrading-control-plane"
	StateUpgradedControlPlane  = "upgraded-control-plane"
	StateUpgradingKubelets     = "upgrading-kubelets"
	StateComplete              = "upgrade-complete"
	StateFailed                = "upgrade-failed"
	// StateRolledBack: an upgrade undone by rollback.
	StateRolledBack = "upgrade-rolled-back"
)

// Node statuses.
const (
	NodePending    = "pending"
	NodeUpgrading  = "upgrading"
	NodeDone       = "upgraded"
	NodeFailed     = "failed"
	NodeRolledBack = "rolled-back"
	NodeSkipped    = "not selected"
)

// Upgrade is the record of an upgrade.
type Upgrade struct {
	From string `json:"from"`
	To   string `json:"to"`
	// ControlPlane is the cluster's kind (release.KindBinary, release.KindKubeadm): how
	// its control plane is moved.
	ControlPlane string `json:"controlPlane,omitempty"`
	// Hops are the releases the control plane passes through before To
	// (the bundle's), oldest first.
	Hops      []string  `json:"hops,omitempty"`
	Bundle    string    `json:"bundle"`
	State     string    `json:"state"`
	Holder    string    `json:"holder"`
	Started   time.Time `json:"started"`
	Updated   time.Time `json:"updated"`
	LastError string    `json:"lastError,omitempty"`
	Nodes     []Node    `json:"nodes"`
	// Backup is the etcd snapshot taken before the control plane moved.
	Backup string `json:"etcdBackup,omitempty"`
	// Etcd is the move of a binary cluster's etcd members this upgrade
	// makes, recorded before the first member moves: what a rollback
	// puts back.
	Etcd *EtcdMove `json:"etcd,omitempty"`
	// Steps name the steps the nodes' spans index (timeline.go).
	Steps []string `json:"steps,omitempty"`
	// Plan is what the plan found when the run began: its findings the
	// last run's, each node's versions before from the run that first
	// planned it (KeepBefore).
	Plan *Plan `json:"plan,omitempty"`
	// TimelineError says why the timeline read back was dropped (it did
	// not parse); never written.
	TimelineError string `json:"-"`
}

// KeepBefore is plan with each node's versions before as old has them
// (a run that resumes another plans nodes already moved).
func KeepBefore(old, plan *Plan) *Plan {
	if old == nil || plan == nil {
		return plan
	}
	was := map[string]PlannedNode{}
	for _, n := range old.Nodes {
		was[n.Name] = n
	}
	for i, n := range plan.Nodes {
		if o, ok := was[n.Name]; ok {
			plan.Nodes[i] = o
		}
	}
	return plan
}

// Plan is what the record keeps of an upgrade's plan.
type Plan struct {
	Nodes    []PlannedNode `json:"nodes,omitempty"`
	Findings []Finding     `json:"findings,omitempty"`
	// Omitted counts the findings past the first 200, not kept.
	Omitted int `json:"omitted,omitempty"`
}

// PlannedNode is a node's versions as the plan read them, before the
// upgrade: the kubelet, the binaries running there, the runtime.
type PlannedNode struct {
	Name       string            `json:"name"`
	Role       string            `json:"role"`
	Kubelet    string            `json:"kubelet"`
	Components map[string]string `json:"components,omitempty"`
	Runtime    string            `json:"runtime,omitempty"`
}

// Finding is one of the plan's findings, and how the run dealt with it.
type Finding struct {
	Severity   string `json:"severity"`
	Check      string `json:"check"`
	Object     string `json:"object"`
	Node       string `json:"node,omitempty"`
	Message    string `json:"message"`
	Resolution string `json:"resolution"`
}

// EtcdMove is an etcd move's versions.
type EtcdMove struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Node is one node's part of the upgrade.
type Node struct {
	Name      string    `json:"name"`
	Role      string    `json:"role"`
	Status    string    `json:"status"`
	Step      string    `json:"step,omitempty"`
	LastError string    `json:"lastError,omitempty"`
	Updated   time.Time `json:"updated"`
	// Spans are the node's steps with their times (Upgrade.Timeline).
	Spans []Span `json:"spans,omitempty"`
	// Containers is what verify found of the containers that ran before
	// the kubelet's swap.
	Containers *Containers `json:"containers,omitempty"`
}

// Containers counts a node's containers that ran before its kubelet's
// swap: those still running (same IDs and processes), those restarted,
// and those of static pods recreated by design (a kubelet of another
// minor gives them new UIDs).
type Containers struct {
	Before    int `json:"before"`
	Kept      int `json:"kept"`
	Restarted int `json:"restarted"`
	Recreated int `json:"recreated,omitempty"`
}

// SetNode records node's status and step (and the error that ended it):
// the timeline enters the step while the node upgrades, and ends the
// step in flight when it stops upgrading.
func (s *Upgrade) SetNode(name, role, status, step string, err error, now time.Time) {
	e := s.Node(name, role)
	e.Status, e.Step, e.Updated, e.LastError = status, step, now, ""
	if err != nil {
		e.LastError = err.Error()
	}
	switch {
	case status != NodeUpgrading:
		s.end(e, now)
	case step != "" && step != StepKubelet:
		// The kubelet's own steps are its spans (the runbook's walk).
		s.Begin(name, role, step, now)
	}
}

// StepKubelet is a node's step while its kubelet moves.
const StepKubelet = "kubelet"

// Node returns the entry of a node, adding it when missing.
func (s *Upgrade) Node(name, role string) *Node {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i]
		}
	}
	s.Nodes = append(s.Nodes, Node{Name: name, Role: role, Status: NodePending})
	return &s.Nodes[len(s.Nodes)-1]
}

// Read reads the upgrade's state; nil when there has been none.
func Read(ctx context.Context, c kubernetes.Interface) (*Upgrade, error) {
	cm, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("configmap kube-system/%s: %w", Name, err)
	}
	return Decode(cm)
}

// Decode reads the record from its ConfigMap (Read's, or a watch's),
// refusing what does not parse.
func Decode(cm *corev1.ConfigMap) (*Upgrade, error) {
	var s Upgrade
	if err := json.Unmarshal([]byte(cm.Data["state.json"]), &s); err != nil {
		return nil, fmt.Errorf("configmap kube-system/%s: state.json: %w", Name, err)
	}
	if err := s.checkTimeline(); err != nil {
		// Only the report and status --watch read the timeline: a resume
		// or a rollback goes on without it.
		s.TimelineError = fmt.Sprintf("configmap kube-system/%s: state.json: %v", Name, err)
		s.Steps = nil
		for i := range s.Nodes {
			s.Nodes[i].Spans = nil
		}
	}
	return &s, nil
}

// Write stores the state (create or update) unconditionally: for
// tools and tests. A run writes through its Writer, which writes only
// while the run holds the lock and never over another run's record.
func Write(ctx context.Context, c kubernetes.Interface, s *Upgrade) error {
	return (&Writer{Client: c}).Write(ctx, func() ([]byte, error) { return Marshal(s) })
}

// ErrTaken means the record was written by another run since this
// run's last write: the run has lost the lock, and leaves the record as
// the other run wrote it.
var ErrTaken = errors.New("the upgrade record was written by another run")

// Writer stores one run's state. Each write is one PUT carrying the
// resourceVersion the last one returned (a GET only first and after a
// conflict), so the cost of a write does not grow with the nodes in
// flight; applyRun coalesces the per-node updates on top of it.
//
// A run's writer (holder set) writes only while fence says the run holds
// the upgrade lock, and never over a record another holder wrote since
// its own last write: a conflict is read again, and written over only
// when the record still names this holder.
type Writer struct {
	Client kubernetes.Interface
	Holder string
	Fence  func(context.Context) error
	mu     sync.Mutex // serialises writes, so a snapshot never overtakes a newer one
	cm     *corev1.ConfigMap
	wrote  bool
}

// Write stores what snapshot returns, taken once the previous write is
// done. The fence is asked again before each attempt.
func (w *Writer) Write(ctx context.Context, snapshot func() ([]byte, error)) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	fence := func() error {
		if w.Fence == nil {
			return nil
		}
		return w.Fence(ctx)
	}
	if err := fence(); err != nil {
		return fmt.Errorf("configmap kube-system/%s: not written: %w", Name, err)
	}
	data, err := snapshot()
	if err != nil {
		return err
	}
	cms := w.Client.CoreV1().ConfigMaps("kube-system")
	// A conflict (another writer, or a cached copy gone stale) or a
	// ConfigMap deleted under us: read it again and write once more. A
	// transient failure: the same, a moment later (an update whose answer
	// was lost is read back first: its holder is this run's).
	gone := func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsNotFound(err) }
	attempt := 0
	var fenced error // the lock lost between two attempts
	err = cluster.OnTransient(ctx, cluster.TransientRetry, gone, func() error {
		if attempt++; attempt > 1 {
			if fenced = fence(); fenced != nil {
				return fenced
			}
		}
		if w.cm == nil {
			cm, err := cms.Get(ctx, Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: Name, Namespace: "kube-system",
					Labels: map[string]string{"app.kubernetes.io/managed-by": "kubelift"}}, Data: map[string]string{"state.json": string(data)}}
				created, err := cms.Create(ctx, cm, metav1.CreateOptions{})
				if err != nil {
					return err
				}
				w.cm, w.wrote = created, true
				return nil
			}
			if err != nil {
				return err
			}
			if h := recordHolder(cm); w.wrote && w.Holder != "" && h != w.Holder {
				return fmt.Errorf("%w (%s) since this run's last write: left as it is", ErrTaken, h)
			}
			w.cm = cm
		}
		cm := w.cm.DeepCopy()
		cm.Data = map[string]string{"state.json": string(data)}
		updated, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
		if err != nil {
			w.cm = nil
			return err
		}
		w.cm, w.wrote = updated, true
		return nil
	})
	if fenced != nil {
		return fmt.Errorf("configmap kube-system/%s: not written: %w", Name, fenced)
	}
	if err != nil {
		return fmt.Errorf("configmap kube-system/%s: %w", Name, err)
	}
	return nil
}

// recordHolder is the holder a stored record names ("" when it names
// none or does not parse).
func recordHolder(cm *corev1.ConfigMap) string {
	var s struct {
		Holder string `json:"holder"`
	}
	_ = json.Unmarshal([]byte(cm.Data["state.json"]), &s)
	return s.Holder
}

// Status is the recorded upgrade with each node's kubelet version read
// live from its Node.
type Status struct {
	*Upgrade
	Kubelets map[string]string `json:"kubelets"`
	// APIServer is the version the API server answering says it runs;
	// APIServerErr why it could not be read (status goes on without it).
	APIServer    string `json:"apiServer,omitempty"`
	APIServerErr string `json:"apiServerError,omitempty"`
}

// ReadStatus reads the recorded upgrade and the kubelet version each
// Node reports now; nil when no upgrade has run in the cluster.
func ReadStatus(ctx context.Context, c kubernetes.Interface) (*Status, error) {
	st, err := Read(ctx, c)
	if err != nil || st == nil {
		return nil, err
	}
	nodes, err := cluster.ListNodes(ctx, c)
	if err != nil {
		return nil, err
	}
	live := make(map[string]string, len(nodes))
	for _, n := range nodes {
		live[n.Name] = n.Status.NodeInfo.KubeletVersion
	}
	out := &Status{Upgrade: st, Kubelets: live}
	if v, err := c.Discovery().ServerVersion(); err != nil {
		out.APIServerErr = err.Error()
	} else {
		out.APIServer = v.GitVersion
	}
	return out, nil
}

// ControlPlaneInFlight returns the control-plane nodes a recorded kubeadm
// upgrade to to was moving when its run stopped (kubeadm, detached, may
// still be restarting their components); none for a binary cluster, whose
// parts move only while kubelift runs, or without a record (u nil).
func (u *Upgrade) ControlPlaneInFlight(to string) map[string]bool {
	if u == nil || u.To != to || u.ControlPlane != release.KindKubeadm {
		return nil
	}
	var moving map[string]bool
	for _, n := range u.Nodes {
		if n.Role == release.RoleControlPlane && n.Status == NodeUpgrading {
			if moving == nil {
				moving = map[string]bool{}
			}
			moving[n.Name] = true
		}
	}
	return moving
}
