// Package upgradeapi is kubelift.dev/v1alpha1's Upgrade: an in-place
// upgrade declared in the cluster (the version, the policy apply's flags
// express, a maintenance window, paused) and its status as the
// controller reports it. It holds the types, their checks, and reading
// and writing them through the dynamic client; the definition is
// manifests/upgrade-crd.yaml.
package upgradeapi

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/window"
)

// Group, Version and Kind of the resource.
const (
	Group   = "kubelift.dev"
	Version = "v1alpha1"
	Kind    = "Upgrade"
)

// Resource is the Upgrades' group, version and resource.
var Resource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "upgrades"}

// Phases an Upgrade passes.
const (
	// Pending: written, not yet taken up by the controller.
	Pending = "Pending"
	// Waiting: another Upgrade runs (status.waitingFor names it).
	Waiting = "Waiting"
	Running = "Running"
	// Paused: spec.paused, or outside spec.window; the nodes in flight
	// finished, the next waits.
	Paused   = "Paused"
	Complete = "Complete"
	Failed   = "Failed"
)

// Upgrade is an in-place upgrade declared in the cluster.
type Upgrade struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              Spec   `json:"spec"`
	Status            Status `json:"status,omitempty"`
}

// Spec is what to upgrade to, and how: the policy apply's flags express.
type Spec struct {
	Version string `json:"version"`
	// Bundle is the digest of the imported bundle Version comes from
	// ("": the newest imported bundle of it that verifies).
	Bundle          string             `json:"bundle,omitempty"`
	MaxUnavailable  string             `json:"maxUnavailable,omitempty"`
	Canary          bool               `json:"canary,omitempty"`
	Nodes           []string           `json:"nodes,omitempty"`
	Selector        string             `json:"selector,omitempty"`
	Settle          string             `json:"settle,omitempty"`
	ReadyTimeout    string             `json:"readyTimeout,omitempty"`
	Drain           bool               `json:"drain,omitempty"`
	DrainTimeout    string             `json:"drainTimeout,omitempty"`
	RestoreLabels   bool               `json:"restoreLabels,omitempty"`
	AllowRestarts   bool               `json:"allowRestarts,omitempty"`
	IgnorePreflight []string           `json:"ignorePreflight,omitempty"`
	Paused          bool               `json:"paused,omitempty"`
	Window          *MaintenanceWindow `json:"window,omitempty"`
	// Attempt, raised, retries a failed Upgrade with the same policy
	// (apply --in-cluster raises it).
	Attempt int64 `json:"attempt,omitempty"`
}

// Status is where the controller says how the Upgrade goes.
type Status struct {
	Phase   string `json:"phase,omitempty"`
	Message string `json:"message,omitempty"`
	// WaitingFor names the Upgrade that runs while this one waits.
	WaitingFor string `json:"waitingFor,omitempty"`
	From       string `json:"from,omitempty"`
	To         string `json:"to,omitempty"`
	Bundle     string `json:"bundle,omitempty"`
	// Progress is the nodes whose kubelet runs To, of all: "3/4".
	Progress string `json:"progress,omitempty"`
	// Current is the node being upgraded, or the node that failed.
	Current string `json:"current,omitempty"`
	// Controller is the controller's pod that runs it.
	Controller         string        `json:"controller,omitempty"`
	ObservedGeneration int64         `json:"observedGeneration,omitempty"`
	Started            *metav1.Time  `json:"started,omitempty"`
	Updated            *metav1.Time  `json:"updated,omitempty"`
	Completed          *metav1.Time  `json:"completed,omitempty"`
	Findings           []Finding     `json:"findings,omitempty"`
	Nodes              []NodeStatus  `json:"nodes,omitempty"`
	LastError          *FailedAction `json:"lastError,omitempty"`
}

// Finding is one of the plan's findings.
type Finding struct {
	Severity string `json:"severity"`
	Check    string `json:"check"`
	Object   string `json:"object,omitempty"`
	Message  string `json:"message"`
}

// NodeStatus is one node's part, from the run's record.
type NodeStatus struct {
	Name   string `json:"name"`
	Role   string `json:"role,omitempty"`
	Status string `json:"status,omitempty"`
	Step   string `json:"step,omitempty"`
	// Version is the kubelet version the Node reports.
	Version   string       `json:"version,omitempty"`
	LastError string       `json:"lastError,omitempty"`
	Updated   *metav1.Time `json:"updated,omitempty"`
}

// FailedAction is why an Upgrade failed: the node and step, when one
// failed, and the reason.
type FailedAction struct {
	Node   string `json:"node,omitempty"`
	Step   string `json:"step,omitempty"`
	Reason string `json:"reason"`
}

// Done says whether the phase is an end: Complete, or Failed for the
// generation it was observed at (a changed spec retries it).
func (u *Upgrade) Done() bool {
	switch u.Status.Phase {
	case Complete:
		return true
	case Failed:
		return u.Status.ObservedGeneration == u.Generation
	}
	return false
}

// Durations are the spec's durations, parsed, with apply's defaults.
type Durations struct {
	Settle, ReadyTimeout, DrainTimeout time.Duration
}

// Check refuses a spec the run could not follow, naming the field and
// its value; it returns the spec's durations.
func (s *Spec) Check() (Durations, error) {
	d := Durations{Settle: 15 * time.Second, ReadyTimeout: 5 * time.Minute, DrainTimeout: 2 * time.Minute}
	if _, err := catalog.ParseVersion(s.Version); err != nil {
		return d, fmt.Errorf("spec.version %q: %w", s.Version, err)
	}
	if s.Bundle != "" && !validDigest(s.Bundle) {
		return d, fmt.Errorf("spec.bundle %q: want sha256:64 hex digits", s.Bundle)
	}
	if s.MaxUnavailable != "" {
		if _, err := window.ParseMaxUnavailable(s.MaxUnavailable, 1); err != nil {
			return d, fmt.Errorf("spec.maxUnavailable: %w", err)
		}
	}
	if len(s.Nodes) > 0 && s.Selector != "" {
		return d, fmt.Errorf("spec.nodes and spec.selector exclude each other")
	}
	if _, err := labels.Parse(s.Selector); err != nil {
		return d, fmt.Errorf("spec.selector %q: %w", s.Selector, err)
	}
	for _, n := range s.Nodes {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			return d, fmt.Errorf("spec.nodes: %q: %s", n, strings.Join(errs, "; "))
		}
	}
	for _, f := range []struct {
		name, value string
		into        *time.Duration
		zero        bool // may be 0
	}{{"settle", s.Settle, &d.Settle, true}, {"readyTimeout", s.ReadyTimeout, &d.ReadyTimeout, false}, {"drainTimeout", s.DrainTimeout, &d.DrainTimeout, false}} {
		if f.value == "" {
			continue
		}
		v, err := time.ParseDuration(f.value)
		if err != nil || v < 0 || (v == 0 && !f.zero) {
			return d, fmt.Errorf("spec.%s %q: want a positive duration such as 30s", f.name, f.value)
		}
		*f.into = v
	}
	if s.Window != nil {
		if err := s.Window.check(); err != nil {
			return d, fmt.Errorf("spec.window: %w", err)
		}
	}
	return d, nil
}

func validDigest(d string) bool {
	hex, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hex) != 64 {
		return false
	}
	for _, c := range hex {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Client reads and writes Upgrades.
type Client struct {
	Dynamic dynamic.Interface
}

func (c Client) res() dynamic.ResourceInterface { return c.Dynamic.Resource(Resource) }

// Get reads the Upgrade name; nil when there is none.
func (c Client) Get(ctx context.Context, name string) (*Upgrade, error) {
	obj, err := c.res().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("upgrade %s: %w", name, err)
	}
	return FromUnstructured(obj)
}

// List reads every Upgrade, oldest first.
func (c Client) List(ctx context.Context) ([]*Upgrade, error) {
	list, err := c.res().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("upgrades: %w", err)
	}
	out := make([]*Upgrade, 0, len(list.Items))
	for i := range list.Items {
		u, err := FromUnstructured(&list.Items[i])
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	SortOldestFirst(out)
	return out, nil
}

// Create writes a new Upgrade.
func (c Client) Create(ctx context.Context, u *Upgrade) (*Upgrade, error) {
	obj, err := toUnstructured(u)
	if err != nil {
		return nil, err
	}
	got, err := c.res().Create(ctx, obj, metav1.CreateOptions{FieldManager: "kubelift"})
	if err != nil {
		return nil, fmt.Errorf("upgrade %s: %w", u.Name, err)
	}
	return FromUnstructured(got)
}

// Update writes u's metadata and spec (resourceVersion checked).
func (c Client) Update(ctx context.Context, u *Upgrade) (*Upgrade, error) {
	obj, err := toUnstructured(u)
	if err != nil {
		return nil, err
	}
	got, err := c.res().Update(ctx, obj, metav1.UpdateOptions{FieldManager: "kubelift"})
	if err != nil {
		return nil, fmt.Errorf("upgrade %s: %w", u.Name, err)
	}
	return FromUnstructured(got)
}

// UpdateStatus writes u's status (resourceVersion checked).
func (c Client) UpdateStatus(ctx context.Context, u *Upgrade) (*Upgrade, error) {
	obj, err := toUnstructured(u)
	if err != nil {
		return nil, err
	}
	got, err := c.res().UpdateStatus(ctx, obj, metav1.UpdateOptions{FieldManager: "kubelift-controller"})
	if err != nil {
		return nil, fmt.Errorf("upgrade %s: status: %w", u.Name, err)
	}
	return FromUnstructured(got)
}

// FromUnstructured reads an Upgrade as the API returned it, refusing
// one that does not parse (naming it).
func FromUnstructured(obj *unstructured.Unstructured) (*Upgrade, error) {
	var u Upgrade
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &u); err != nil {
		return nil, fmt.Errorf("upgrade %s: %w", obj.GetName(), err)
	}
	return &u, nil
}

func toUnstructured(u *Upgrade) (*unstructured.Unstructured, error) {
	u.APIVersion, u.Kind = Group+"/"+Version, Kind
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(u)
	if err != nil {
		return nil, fmt.Errorf("upgrade %s: %w", u.Name, err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// SortOldestFirst orders Upgrades by creation, then name: the order the
// controller takes them in.
func SortOldestFirst(us []*Upgrade) {
	slices.SortFunc(us, func(a, b *Upgrade) int {
		if c := a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}
