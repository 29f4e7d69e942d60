package preflight

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/coredns"
	"github.com/kubelift/kubelift/internal/inplace/etcd"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/inplace/window"
	"github.com/kubelift/kubelift/internal/inplace/workloads"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/registry"
)

// Severity of a finding.
type Severity string

// Severities: a blocking finding stops apply; a warning qualifies the
// plan; info says what apply will do about something.
const (
	Blocking Severity = "blocking"
	Warning  Severity = "warning"
	Info     Severity = "info"
)

// Check names a check the plan runs. A finding is matched by its check
// (and, where one check finds several kinds of thing, its Code), never by
// its message.
type Check string

// The checks, in the order findings are listed.
const (
	CheckValues       Check = "values"
	CheckPath         Check = "path"
	CheckSkew         Check = "skew"
	CheckImported     Check = "imported"
	CheckImages       Check = "images"
	CheckKubeadm      Check = "kubeadm"
	CheckSSH          Check = "ssh"
	CheckHealth       Check = "health"
	CheckStaged       Check = "staged"
	CheckDisk         Check = "disk"
	CheckRemovedFlags Check = "removed-flags"
	CheckCgroup       Check = "cgroup"
	CheckRuntime      Check = "runtime"
	CheckCoreDNS      Check = "coredns"
	CheckEtcd         Check = "etcd"
	CheckRemovedAPIs  Check = "removed-apis"
	CheckReadmission  Check = "readmission"
	CheckEviction     Check = "eviction"
	CheckRestarts     Check = "restarts"
)

// Checks the plan runs, in the order findings are listed.
var Checks = []Check{CheckValues, CheckPath, CheckSkew, CheckImported, CheckImages, CheckKubeadm, CheckSSH, CheckHealth, CheckStaged, CheckDisk, CheckRemovedFlags, CheckCgroup, CheckRuntime, CheckEtcd, CheckCoreDNS, CheckRemovedAPIs, CheckReadmission, CheckEviction, CheckRestarts}

// ParseCheck reads a check's name (as --ignore-preflight takes it).
func ParseCheck(s string) (Check, error) {
	for _, c := range Checks {
		if string(c) == s {
			return c, nil
		}
	}
	names := make([]string, len(Checks))
	for i, c := range Checks {
		names[i] = string(c)
	}
	return "", fmt.Errorf("no check %q: the plan runs %s", s, strings.Join(names, ", "))
}

// Codes of findings one check makes of several kinds, where what apply
// does depends on the kind.
const (
	// CodeLabelsMissing: a readmission finding whose pod's nodeSelector
	// names labels its node lacks (apply --restore-labels puts them back).
	CodeLabelsMissing = "labels-missing"
)

// Finding is one thing the plan found, about one object.
type Finding struct {
	Severity Severity `json:"severity"`
	// Check names the check that found it (see Checks).
	Check Check `json:"check"`
	// Code says which kind of finding of its check it is, where that
	// check makes several that apply tells apart.
	Code string `json:"code,omitempty"`
	// Object is what it is about: node/NAME, pod/NS/NAME, apiserver/NODE,
	// version/V, image/REF, api/GROUP/VERSION/RESOURCE,
	// RESOURCE.GROUP/[NAMESPACE/]NAME.
	Object string `json:"object"`
	// Node is the node the object is on, if any.
	Node    string `json:"node,omitempty"`
	Message string `json:"message"`
	Fix     string `json:"fix,omitempty"`
}

// NodeState is a node as the plan found it.
type NodeState struct {
	Name  string `json:"name"`
	Role  string `json:"role"`
	Ready bool   `json:"ready"`
	Arch  string `json:"arch"`
	// Kubelet is the version the Node reports; Components the versions of
	// the running binaries read on the node ("" when not running there).
	Kubelet    string            `json:"kubelet"`
	Components map[string]string `json:"components,omitempty"`
	// Runtime is the container runtime the Node reports ("containerd
	// v2.1.4"; "" when it reports none).
	Runtime string `json:"runtime,omitempty"`
	// RuntimeMove is the move of the node's runtime apply makes before
	// its kubelet ("containerd v1.7.35 -> v2.3.7"; "" for none).
	RuntimeMove string `json:"runtimeMove,omitempty"`
	// ToolsMove says where apply moves the node's CNI plugins and crictl
	// to the bundle's, where it carries the node stack ("" for none).
	ToolsMove string `json:"toolsMove,omitempty"`
	// CRI is what the runtime says of itself over CRI, read on the node
	// ("containerd v2.1.4, CRI v1"; "" when not read), and CgroupDriver
	// the cgroup driver the running kubelet takes (its configuration's,
	// or the runtime's from v1.31).
	CRI          string `json:"cri,omitempty"`
	CgroupDriver string `json:"cgroupDriver,omitempty"`
	// Staged says every file the node needs is staged with the right sha256.
	Staged bool `json:"staged"`
	// StagePath, for a node that is not staged, is how apply would get
	// its files there: "registry" (the node pulls them) or "ssh", with
	// StagePathReason saying why not the registry.
	StagePath       string `json:"stagePath,omitempty"`
	StagePathReason string `json:"stagePathReason,omitempty"`
	// Containers running; Restarts the target kubelet would restart;
	// Protected those the hash-skip file keeps running; Recreated the
	// static pods' containers it starts anew under new pod UIDs.
	Containers int `json:"containers"`
	Restarts   int `json:"restarts"`
	Protected  int `json:"protected"`
	Recreated  int `json:"recreated,omitempty"`
}

// Step is one step of the ordered plan: a phase and the nodes it works on
// at once.
type Step struct {
	Phase string `json:"phase"`
	// Version is what a control-plane step moves to: a hop, or the target.
	Version string   `json:"version,omitempty"`
	Nodes   []string `json:"nodes,omitempty"`
	// Components are swapped on each node, in order.
	Components []string `json:"components,omitempty"`
}

// Phases of an upgrade, in order.
const (
	PhaseControlPlane = "control-plane"
	PhaseTolerations  = "patch-tolerations"
	PhaseKubelets     = "kubelets"
)

// Plan is what an upgrade would do and what stands in its way.
type Plan struct {
	To string `json:"to"`
	// ControlPlane is the cluster's kind, which says how its control
	// plane is moved ("binary": systemd units whose programs are swapped).
	ControlPlane string   `json:"controlPlane"`
	From         []string `json:"from"`
	// Hops are the releases the control plane passes through before To
	// (the bundle's, from bundle create --from); kubelets go straight to
	// To.
	Hops  []string    `json:"hops,omitempty"`
	Nodes []NodeState `json:"nodes"`
	// Steps are the upgrade's order; the workers' kubelet steps are the
	// waves of Window (when every node takes as long).
	Steps    []Step        `json:"steps"`
	Window   window.Window `json:"window"`
	Findings []Finding     `json:"findings"`
	// HashSkipKubelet says the bundled kubelet honours the hash-skip file.
	HashSkipKubelet bool `json:"hashSkipKubelet"`
	Blocked         bool `json:"blocked"`
	// WorkloadGate lists the workloads fully available now, which apply
	// holds each node to (none with NoWorkloadGate).
	WorkloadGate []string `json:"workloadGate,omitempty"`
	// CoreDNS is a binary cluster's CoreDNS move (kubeadm moves its own).
	CoreDNS *coredns.Planned `json:"coreDNS,omitempty"`
	// Etcd is a binary cluster's etcd move, where the bundle carries
	// etcd (bundle create --etcd); kubeadm moves its own.
	Etcd *etcd.Planned `json:"etcd,omitempty"`
}

// ErrBlocked means the plan has blocking findings.
var ErrBlocked = errors.New("the upgrade is blocked")

// PlanOptions configure BuildPlan.
type PlanOptions struct {
	Client kubernetes.Interface
	// Dynamic lists objects of removed API versions (nil: not counted).
	Dynamic dynamic.Interface
	// REST reaches the API server; each control-plane node's /readyz is
	// read at that node's address with it (nil: not checked).
	REST   *rest.Config
	Target *release.Release
	// Catalog knows the source versions (their downgrade rules and hash
	// eras); the embedded one by default.
	Catalog *catalog.Catalog
	// Access reaches the private registry to check images.
	Access registry.Access
	// StageVia, StageCodec and NodeCredentials say how missing files
	// reach the nodes (stage.Options' Via, Codec and NodeCredentials).
	StageVia, StageCodec, NodeCredentials string
	Connector                             nodeaccess.Connector
	// Inventory overrides where nodes are reached (nil: none).
	Inventory *nodeaccess.Inventory
	Parallel  int
	StageDir  string
	// MaxUnavailable bounds the workers upgraded at once: N or P%.
	MaxUnavailable string
	// Canary grows worker batches 1, 2, 4 ... up to MaxUnavailable.
	Canary bool
	// AllowRestarts makes predicted container restarts a warning.
	AllowRestarts bool
	// HealthWindow is how long a health probe (an API server's /readyz,
	// a leader's lease) may fail before it is a finding: probes are
	// repeated with backoff within it (default 30s).
	// NoWorkloadGate turns the workload gate off (gate.go).
	NoWorkloadGate bool
	HealthWindow   time.Duration
	// HealthBackoff is the first pause between probes (500ms) and
	// HealthBackoffCap the longest (5s).
	HealthBackoff, HealthBackoffCap time.Duration
	Now                             func() time.Time
	Log                             *slog.Logger
}

// View is the cluster as the plan read it: its Nodes and running Pods,
// what each node said of itself (Facts), how staging would reach the
// nodes that lack files (Paths), which nodes SSH could not reach, where
// each node is reached, and kubeadm's configuration.
type View struct {
	Nodes []corev1.Node
	Pods  []corev1.Pod
	Facts map[string]*nodefacts.Facts
	// Paths says, for nodes that lack files, how staging would get them
	// there (stage.Path): the path and the reason.
	Paths     map[string][2]string
	SSH       map[string]error
	Addresses []nodeaccess.Address
	// Kubeadm is the cluster's kubeadm configuration (nil: kubeadm did
	// not build it).
	Kubeadm *kubeadm.Config
	// nodeIdx indexes nodes by name (built once, by node).
	indexOnce sync.Once
	nodeIdx   map[string]int
}

// Runtime is the container runtime node name runs: what the runtime
// said of itself over CRI where the node was read, else what its Node
// reports (a value that does not parse is an error naming node, field
// and value); the zero Runtime when neither says.
func (v *View) Runtime(name string) (nodefacts.Runtime, error) {
	if f := v.Facts[name]; f != nil && f.CRI != nil {
		return f.CRI.Runtime, nil
	}
	n := v.Node(name)
	if n == nil {
		return nodefacts.Runtime{}, nil
	}
	return release.NodeRuntime(n)
}

// node is the Node named name, or nil.
func (v *View) Node(name string) *corev1.Node {
	v.indexOnce.Do(func() {
		v.nodeIdx = make(map[string]int, len(v.Nodes))
		for i := range v.Nodes {
			v.nodeIdx[v.Nodes[i].Name] = i
		}
	})
	if i, ok := v.nodeIdx[name]; ok {
		return &v.Nodes[i]
	}
	return nil
}

// BuildPlan reads the cluster and its nodes and returns the plan. It
// changes nothing. A plan with blocking findings is returned with
// ErrBlocked.
func BuildPlan(ctx context.Context, opts PlanOptions) (*Plan, error) {
	if err := opts.Defaults(); err != nil {
		return nil, err
	}
	v, err := Read(ctx, opts)
	if err != nil {
		return nil, err
	}
	return Evaluate(ctx, opts, v)
}

// Defaults fills what was left unset.
func (opts *PlanOptions) Defaults() error {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.StageDir == "" {
		opts.StageDir = release.DefaultStageDir
	}
	if opts.HealthWindow == 0 {
		opts.HealthWindow = 30 * time.Second
	}
	if opts.HealthBackoff == 0 {
		opts.HealthBackoff = 500 * time.Millisecond
	}
	if opts.HealthBackoffCap == 0 {
		opts.HealthBackoffCap = 5 * time.Second
	}
	if opts.Catalog == nil {
		c, err := catalog.Default()
		if err != nil {
			return err
		}
		opts.Catalog = c
	}
	return nil
}

// NodeFrom is the version a node upgrades from: its kubelet's before this
// upgrade (state's, else what facts read), the plan's From where that
// says nothing or says the target already.
func (p *Plan) NodeFrom(state *NodeState, facts *nodefacts.Facts, target string) string {
	from := ""
	if facts != nil {
		from = facts.Components["kubelet"]
	}
	if state != nil && state.Kubelet != "" {
		from = state.Kubelet
	}
	if len(p.From) > 0 && (from == "" || from == target) {
		from = p.From[0]
	}
	return from
}

// Evaluate runs every check over what was read.
func Evaluate(ctx context.Context, opts PlanOptions, v *View) (*Plan, error) {
	t := opts.Target
	kind := release.KindBinary
	if v.Kubeadm != nil {
		kind = release.KindKubeadm
	}
	p := &Plan{To: t.Version.String(), ControlPlane: kind, HashSkipKubelet: t.Manifest.KubeletHashSkip("amd64")}
	for _, h := range t.Hops {
		p.Hops = append(p.Hops, h.Version.String())
	}
	pc := &planCheck{opts: opts, view: v, plan: p, target: t, kind: kind}
	pc.index()
	pc.nodeStates()
	steps, window, err := pc.steps()
	if err != nil {
		return nil, err
	}
	p.Steps, p.Window = steps, window
	pc.path()
	pc.imported()
	pc.images(ctx)
	pc.kubeadmImages(ctx)
	pc.sshReach()
	pc.health(ctx)
	pc.staged()
	pc.removedFlags()
	pc.cgroupV1()
	pc.runtime()
	pc.tools()
	pc.cgroupDriver()
	pc.etcd()
	pc.coreDNS(ctx)
	pc.removedAPIs(ctx)
	pc.readmission()
	pc.eviction()
	pc.restarts()
	if !opts.NoWorkloadGate {
		gate, err := workloads.FullyAvailable(ctx, opts.Client)
		if err != nil {
			return nil, err
		}
		p.WorkloadGate = gate
	}
	sort.SliceStable(p.Findings, func(i, j int) bool {
		return checkOrder(p.Findings[i].Check) < checkOrder(p.Findings[j].Check)
	})
	for _, f := range p.Findings {
		if f.Severity == Blocking {
			p.Blocked = true
		}
	}
	if p.Blocked {
		return p, ErrBlocked
	}
	return p, nil
}

func checkOrder(c Check) int {
	for i, x := range Checks {
		if x == c {
			return i
		}
	}
	return len(Checks)
}

// listCluster lists nodes and running pods (paged), and where to reach
// each node.
func ListCluster(ctx context.Context, c kubernetes.Interface, inv *nodeaccess.Inventory) ([]corev1.Node, []corev1.Pod, []nodeaccess.Address, error) {
	nodes, err := cluster.ListNodes(ctx, c)
	if err != nil {
		return nil, nil, nil, err
	}
	pods, err := cluster.ListPods(ctx, c)
	if err != nil {
		return nil, nil, nil, err
	}
	tgts, err := nodeaccess.Addresses(nodes, inv)
	if err != nil {
		return nil, nil, nil, err
	}
	return nodes, pods, tgts, nil
}

// readCluster lists the cluster and reads every node over SSH, a bounded
// number at once.
func Read(ctx context.Context, opts PlanOptions) (*View, error) {
	nodes, pods, tgts, err := ListCluster(ctx, opts.Client, opts.Inventory)
	if err != nil {
		return nil, err
	}
	kc, err := kubeadm.Read(ctx, opts.Client)
	if err != nil {
		return nil, err
	}
	v := &View{Nodes: nodes, Pods: pods, Facts: map[string]*nodefacts.Facts{}, Paths: map[string][2]string{}, Addresses: tgts, Kubeadm: kc}
	kind := release.KindBinary
	if kc != nil {
		kind = release.KindKubeadm
	}
	arch := map[string]string{}
	runtimes := map[string]nodefacts.Runtime{}
	for _, n := range nodes {
		arch[n.Name] = n.Status.NodeInfo.Architecture
		// one that does not parse is the plan's to refuse (values)
		runtimes[n.Name], _ = nodefacts.ParseRuntime(n.Name, n.Status.NodeInfo.ContainerRuntimeVersion)
	}
	var mu sync.Mutex
	opts.Log.Info("reading the nodes", "nodes", len(tgts))
	v.SSH = nodeaccess.ForEach(ctx, opts.Connector, tgts, opts.Parallel, func(ctx context.Context, t nodeaccess.Address, n nodeaccess.Node) error {
		f, err := nodefacts.Read(ctx, n, t.Name, opts.StageDir, opts.Target.Version.String())
		if err != nil {
			return err
		}
		// A node that lacks files: how apply would stage them.
		var path [2]string
		if missingFiles(opts.Target, f, kind, t.Role, runtimes[t.Name], arch[t.Name]) {
			p, why, err := stage.Path(ctx, n, t, opts.Target, arch[t.Name], stage.Options{Source: stage.RegistrySource{Access: opts.Access}, StageDir: opts.StageDir,
				Kind: kind, Via: opts.StageVia, Codec: opts.StageCodec, NodeCredentials: opts.NodeCredentials})
			if err != nil {
				p, why = stage.ViaNone, err.Error()
			}
			path = [2]string{p, why}
		}
		mu.Lock()
		v.Facts[t.Name] = f
		if path[0] != "" {
			v.Paths[t.Name] = path
		}
		mu.Unlock()
		return nil
	})
	return v, nil
}
