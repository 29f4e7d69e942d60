// Package sandbox brings up, on one Linux machine with root, a small
// binary-deployed Kubernetes cluster whose parts are real wherever they
// can be: etcd from Debian (or a cluster of a chosen release, a member
// per control plane; etcd.go), kube-apiserver, kube-controller-manager,
// kube-scheduler and kubelet built from the Go module proxy, a real sshd and
// a service manager per node, Debian's docker-registry as the air gap's
// private registry, and a real container runtime (containerd, runc and a
// CNI bridge; runtime.go), or, for tests that need no processes, a CRI
// stand-in that keeps records.
//
// Every node is a network namespace on a bridge plus a mount namespace in
// which the node's own directories are bind-mounted over /usr/local,
// /etc/kubernetes, /etc/systemd/system, /var/lib/kubelet, /run and friends.
// The bridge lives in the "admin" namespace, the bastion inside the air
// gap: it holds the private registry and is where kubelift runs. Nothing
// routes out of the sandbox. State lives in one directory (Config.Dir); Up
// is idempotent and Down removes everything it made, by pid and by name.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/atomicfile"
	"github.com/kubelift/kubelift/test/env/images"
)

// Config describes the sandbox to bring up.
type Config struct {
	// Dir holds all state (kubeconfig, inventory.yaml, ssh/, registry/,
	// nodes/, env.sh).
	Dir string
	// Name prefixes the network namespaces ("kl" gives kl-admin, kl-cp-1).
	Name string
	// Subnet is the first three octets of the sandbox's /24 ("10.77.0").
	Subnet string
	// ControlPlanes (1 or 3) and Workers count the nodes.
	ControlPlanes, Workers int
	// OldVersion runs at first; NewVersion is built for upgrades (the
	// target). When NewVersion is more than one minor ahead, the control
	// plane of every minor in between (the catalog's hops) is built too,
	// and the stand-in internet serves what `bundle create --from` needs.
	OldVersion, NewVersion string
	// FullHops builds every program of each hop (kubelet, kube-proxy and
	// kubectl too), not only its control plane, and the stand-in internet
	// serves them all: a hop can then be upgraded to on its own (the
	// hop-by-hop benchmark).
	FullHops bool
	// Tool is the kubelift-sandbox program (node init, systemctl, CRI).
	Tool string
	// Runtime is the nodes' container runtime: RuntimeContainerd (the
	// default) or RuntimeStandIn.
	Runtime string
	// RuntimeVersion is containerd's version on every node ("": the
	// default, kube.ContainerdVersion; kube.Containerd17 for containerd
	// 1.7, configured with its own config schema, version 2).
	RuntimeVersion string
	// Workloads creates the demo workloads (Deployments, a DaemonSet, bare
	// pods with and without tolerations, a pod whose nodeSelector no
	// longer matches).
	Workloads bool
	// StaticPod runs a static pod on the last worker (containerd only), as
	// installers do (kubespray's nginx-proxy on every worker): a kubelet
	// of another minor recreates it (kubernetes#116080).
	StaticPod bool
	// Kubeadm builds the cluster with kubeadm (init on cp-1, join on the
	// others; kubeadm.go) instead of binary-deployed units: the control
	// plane and etcd as static pods from images in the private registry,
	// kube-proxy as a DaemonSet, CoreDNS; with three control planes,
	// etcd stacked on each (`kubeadm join --control-plane`).
	Kubeadm bool
	// CoreDNS runs CoreDNS at this version ("v1.11.1") on a binary
	// sandbox (containerd only), as binary installers deploy it
	// (coredns.go); "": none. A kubeadm sandbox runs kubeadm's.
	CoreDNS string
	// Etcd runs, on a binary sandbox, an etcd cluster at this version
	// ("v3.5.35", built from the Go module proxy) with a member on every
	// control plane, as binary installers leave it (etcd.go); "": Debian's
	// etcd, on cp-1 alone. A kubeadm sandbox runs kubeadm's.
	Etcd string
	// EtcdTo is the etcd release ("v3.6.16") the stand-in internet serves
	// where upstream publishes its archive, for `bundle create --etcd`
	// (binary sandboxes only); "": none.
	EtcdTo string
	// APIServerFeatureGates is the API servers' --feature-gates on a
	// binary sandbox ("APIServerTracing=false"); "": none given, each
	// gate at its default.
	APIServerFeatureGates string
	// Log reports progress (nil: silent).
	Log func(format string, args ...any)
}

// Defaults fills unset fields.
func (c *Config) Defaults() {
	if c.Name == "" {
		c.Name = "kl"
	}
	if c.Subnet == "" {
		c.Subnet = "10.77.0"
	}
	if c.ControlPlanes == 0 {
		c.ControlPlanes = 1
	}
	if c.OldVersion == "" {
		c.OldVersion = "v1.30.14"
	}
	if c.NewVersion == "" {
		c.NewVersion = "v1.31.4"
	}
	if c.Runtime == "" {
		c.Runtime = RuntimeContainerd
	}
	if c.Log == nil {
		c.Log = func(string, ...any) {}
	}
}

// Machine is one namespace-backed host of the sandbox.
type Machine struct {
	Name    string `json:"name"`
	Role    string `json:"role"` // admin, control-plane, worker
	Address string `json:"address"`
	NetNS   string `json:"netns"`
	// NetNSMade says this sandbox created NetNS (Down deletes only those).
	NetNSMade bool `json:"netnsMade"`
	// Root is the machine's own file tree (bind-mounted inside it).
	Root string `json:"root"`
	// Pid is its init (the service manager), whose namespaces are the
	// machine's.
	Pid int `json:"pid"`
}

// State is what Up made, saved as state.json for Down and for tests.
type State struct {
	Dir        string `json:"dir"`
	Name       string `json:"name"`
	Subnet     string `json:"subnet"`
	OldVersion string `json:"oldVersion"`
	NewVersion string `json:"newVersion"`
	Runtime    string `json:"runtime"`
	// RuntimeVersion is containerd's version (Config.RuntimeVersion).
	RuntimeVersion string    `json:"runtimeVersion,omitempty"`
	Binaries       Binaries  `json:"binaries"`
	Machines       []Machine `json:"machines"`
	// CgroupsMade says this sandbox made its cgroups (kubelift-NAME in
	// each hierarchy); Down removes them only then, so a second sandbox
	// refused under a name in use never touches the first one's.
	CgroupsMade bool `json:"cgroupsMade,omitempty"`
	// MountPoints were created on the host by older sandboxes (mount points
	// are now made inside overlays); Down removes them when empty.
	MountPoints []string `json:"mountPoints,omitempty"`
	Registry    Registry `json:"registry"`
	Internet    Internet `json:"internet"`
	APIServer   string   `json:"apiServer"`
	// StaticPod is the mirror pod (namespace/name) of the static pod the
	// sandbox runs (Config.StaticPod), "" when none.
	StaticPod string `json:"staticPod,omitempty"`
	// Kubeadm says kubeadm built the cluster (Config.Kubeadm).
	Kubeadm bool `json:"kubeadm,omitempty"`
	// CoreDNS is the version of the CoreDNS a binary sandbox started
	// with (Config.CoreDNS).
	CoreDNS string `json:"coreDNS,omitempty"`
	// Etcd is the version of the etcd cluster a binary sandbox started
	// with (Config.Etcd); "": Debian's, on cp-1.
	Etcd string `json:"etcd,omitempty"`
	// EtcdTo is the etcd release the stand-in internet serves
	// (Config.EtcdTo).
	EtcdTo string `json:"etcdTo,omitempty"`
	// APIServerFeatureGates are the binary API servers' --feature-gates
	// (Config.APIServerFeatureGates).
	APIServerFeatureGates string `json:"apiserverFeatureGates,omitempty"`
	Complete              bool   `json:"complete"`
}

// Registry is the air gap's private registry.
type Registry struct {
	Address  string `json:"address"` // host:port
	CAFile   string `json:"caFile"`
	User     string `json:"user"`
	Password string `json:"password"`
}

// Internet is the stand-in for registry.k8s.io, dl.k8s.io and github.com
// that bundle create reads from: a namespace of its own with no link to
// the air gap (bundles cross by file, as they do on removable media).
type Internet struct {
	NetNS    string `json:"netns"`
	Registry string `json:"registry"` // plain HTTP, inside NetNS
	Files    string `json:"files"`    // http://..., inside NetNS
	// BundleFlags are bundle create's flags that read from here.
	BundleFlags []string `json:"bundleFlags"`
	// UserImages are the team's own images as its CI publishes them here
	// (the shop's, on the real runtime): a bundle carries them with
	// --image, and import pushes them to REGISTRY/library/NAME:TAG, where
	// the shop's pods name them.
	UserImages []string `json:"userImages,omitempty"`
}

func (s *State) path() string { return filepath.Join(s.Dir, "state.json") }

func (s *State) save() error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(s.path(), append(data, '\n'), 0o644)
}

// Load reads the state of a sandbox in dir.
func Load(dir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return nil, fmt.Errorf("no sandbox in %s: %w", dir, err)
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "state.json"), err)
	}
	return &s, nil
}

// Machine returns the machine called name.
func (s *State) Machine(name string) (*Machine, error) {
	for i := range s.Machines {
		if s.Machines[i].Name == name {
			return &s.Machines[i], nil
		}
	}
	return nil, fmt.Errorf("sandbox: no machine %q", name)
}

// Nodes returns the Kubernetes nodes (control planes first).
func (s *State) Nodes() []Machine {
	var out []Machine
	for _, m := range s.Machines {
		if m.Role == "control-plane" {
			out = append(out, m)
		}
	}
	for _, m := range s.Machines {
		if m.Role == "worker" {
			out = append(out, m)
		}
	}
	return out
}

// Admin returns the admin machine (bridge, registry, where tools run).
func (s *State) Admin() Machine {
	m, _ := s.Machine("admin")
	return *m
}

// alive says whether every machine's init still runs.
func (s *State) alive() bool {
	for _, m := range s.Machines {
		if m.Pid == 0 || !Running(m.Pid) {
			return false
		}
	}
	return len(s.Machines) > 0
}

// Running says whether pid runs; a zombie (dead, not yet reaped by its
// parent) does not.
func Running(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	i := strings.LastIndexByte(string(data), ')')
	return i > 0 && i+2 < len(data) && data[i+2] != 'Z'
}

// Up brings the sandbox up, or makes sure the one in cfg.Dir is up, and
// waits until every node is Ready.
func Up(ctx context.Context, cfg Config) (*State, error) {
	cfg.Defaults()
	if cfg.Runtime != RuntimeContainerd && cfg.Runtime != RuntimeStandIn {
		return nil, fmt.Errorf("sandbox: runtime %q: want %s or %s", cfg.Runtime, RuntimeContainerd, RuntimeStandIn)
	}
	if cfg.Workers < 0 || (cfg.ControlPlanes != 1 && cfg.ControlPlanes != 3) {
		return nil, fmt.Errorf("sandbox: control planes must be 1 or 3 and workers >= 0 (got %d and %d)", cfg.ControlPlanes, cfg.Workers)
	}
	if cfg.Kubeadm && cfg.Runtime != RuntimeContainerd {
		return nil, fmt.Errorf("sandbox: a kubeadm sandbox runs the containerd runtime (got %s)", cfg.Runtime)
	}
	if cfg.CoreDNS != "" && (cfg.Kubeadm || cfg.Runtime != RuntimeContainerd) {
		return nil, errors.New("sandbox: CoreDNS of a chosen version runs on a binary sandbox with the containerd runtime (a kubeadm sandbox runs kubeadm's)")
	}
	if err := checkEtcd(cfg); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("sandbox: needs root (network and mount namespaces, bind mounts)")
	}
	// The nodes run what this host builds, while the catalog's files,
	// the internet's pause and the images name linux/amd64.
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("sandbox: builds linux/amd64 nodes from this host's binaries; this host is %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	cfg.Dir = dir
	if s, err := Load(dir); err == nil {
		if s.Complete && s.alive() && s.matches(cfg) {
			cfg.Log("sandbox in %s is up; checking that its nodes are Ready", dir)
			if err := s.waitNodesReady(ctx, cfg.Log); err != nil {
				return nil, err
			}
			return s, nil
		}
		cfg.Log("sandbox in %s is incomplete or different; removing it first", dir)
		if err := Down(ctx, dir, cfg.Log); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	s := &State{Dir: dir, Name: cfg.Name, Subnet: cfg.Subnet, OldVersion: cfg.OldVersion, NewVersion: cfg.NewVersion, Runtime: cfg.Runtime, RuntimeVersion: cfg.RuntimeVersion, Kubeadm: cfg.Kubeadm, CoreDNS: cfg.CoreDNS,
		Etcd: cfg.Etcd, EtcdTo: cfg.EtcdTo, APIServerFeatureGates: cfg.APIServerFeatureGates}
	if err := s.up(ctx, cfg); err != nil {
		err = fmt.Errorf("sandbox up: %w (state kept in %s for 'sandbox-down' and the unit logs under machines/NODE/var/log/units/)", err, dir)
		if _, merr := s.Machine("admin"); merr == nil && s.Kubeadm && s.HA() {
			// what the API servers' balancer saw (a test's harness
			// removes the state; CI keeps only this)
			err = fmt.Errorf("%w\nthe load balancer's log, last lines:\n%s", err, s.UnitLog(s.Admin(), "kube-apiserver-lb", 2000))
		}
		return nil, err
	}
	return s, nil
}

func (s *State) matches(cfg Config) bool {
	cps, workers := 0, 0
	for _, m := range s.Machines {
		switch m.Role {
		case "control-plane":
			cps++
		case "worker":
			workers++
		}
	}
	return s.Name == cfg.Name && s.Subnet == cfg.Subnet && s.OldVersion == cfg.OldVersion && s.NewVersion == cfg.NewVersion && s.Runtime == cfg.Runtime && s.RuntimeVersion == cfg.RuntimeVersion && s.Kubeadm == cfg.Kubeadm && s.CoreDNS == cfg.CoreDNS &&
		s.Etcd == cfg.Etcd && s.EtcdTo == cfg.EtcdTo && s.APIServerFeatureGates == cfg.APIServerFeatureGates &&
		cps == cfg.ControlPlanes && workers == cfg.Workers && (s.StaticPod != "") == (cfg.StaticPod && cfg.Workloads)
}

func (s *State) up(ctx context.Context, cfg Config) error {
	start := time.Now()
	var err error
	if s.Binaries, err = buildBoot(ctx, cfg); err != nil {
		return err
	}
	if err := buildAddons(ctx, cfg, &s.Binaries); err != nil {
		return err
	}
	cfg.Log("what the nodes boot on is ready (%s); %s builds while they boot", time.Since(start).Round(time.Second), cfg.NewVersion)
	// The target is needed only by the stand-in internet, last: the
	// nodes boot while it builds. A boot that fails waits for the build
	// all the same, so that no build script outlives Up.
	target := startTarget(ctx, cfg)
	defer target()

	s.Machines = append(s.Machines, Machine{Name: "admin", Role: "admin", Address: cfg.Subnet + ".1", NetNS: cfg.Name + "-admin"},
		Machine{Name: "internet", Role: "internet", Address: "127.0.0.1", NetNS: cfg.Name + "-internet"})
	for i := 1; i <= cfg.ControlPlanes; i++ {
		s.Machines = append(s.Machines, Machine{Name: fmt.Sprintf("cp-%d", i), Role: "control-plane", Address: fmt.Sprintf("%s.%d", cfg.Subnet, 10+i)})
	}
	for i := 1; i <= cfg.Workers; i++ {
		s.Machines = append(s.Machines, Machine{Name: fmt.Sprintf("worker-%d", i), Role: "worker", Address: fmt.Sprintf("%s.%d", cfg.Subnet, 20+i)})
	}
	for i := range s.Machines {
		m := &s.Machines[i]
		if m.NetNS == "" {
			m.NetNS = cfg.Name + "-" + m.Name
		}
		m.Root = filepath.Join(s.Dir, "machines", m.Name)
	}
	// The operator's kubeconfig names the control-plane endpoint, as
	// kubeadm's admin.conf does: the load balancer with three kubeadm
	// control planes, else cp-1.
	s.APIServer = "https://" + s.controlPlaneEndpoint()
	if err := s.save(); err != nil { // from here on, Down can clean up
		return err
	}

	cfg.Log("network: bridge in %s (%s.1/24), one namespace per node", s.Admin().NetNS, cfg.Subnet)
	err = s.makeNetwork()
	if serr := s.save(); serr != nil { // what was made, for Down
		return errors.Join(err, serr)
	}
	if err != nil {
		return err
	}
	cfg.Log("certificates, ssh keys, unit files and node file trees")
	if err := s.makeFiles(cfg); err != nil {
		return err
	}
	if err := s.save(); err != nil {
		return err
	}
	if cfg.Runtime == RuntimeContainerd {
		if left := CgroupDirs(s.Name); len(left) > 0 {
			return fmt.Errorf("cgroups %v exist already: another sandbox uses the name %q (pick another with --name)", left, s.Name)
		}
		s.CgroupsMade = true
		err := s.makeCgroups()
		if serr := s.save(); serr != nil {
			return errors.Join(err, serr)
		}
		if err != nil {
			return err
		}
	}
	if cfg.Kubeadm {
		cfg.Log("booting %d machines (service manager, sshd, %s; kubeadm's kubelet unit, waiting for kubeadm)", len(s.Machines), cfg.Runtime)
	} else {
		cfg.Log("booting %d machines (service manager, sshd, %s, kubelet and kube-proxy %s; etcd and the control plane on cp nodes)", len(s.Machines), cfg.Runtime, cfg.OldVersion)
	}
	for i := range s.Machines {
		if err := s.boot(&s.Machines[i], cfg.Tool); err != nil {
			return err
		}
		if err := s.save(); err != nil {
			return err
		}
	}
	var built *images.Set
	if cfg.Kubeadm {
		// kubeadm's nodes pull the control plane from the private
		// registry: it is filled before `kubeadm init`.
		if err := s.waitRegistry(ctx); err != nil {
			return err
		}
		cfg.Log("images: the control plane's, etcd's, CoreDNS's, pause and the shop's server, built here and pushed to %s", s.ImageRepository())
		if built, err = s.pushImages(ctx); err != nil {
			return err
		}
		if err := s.pushKubeadmImages(ctx, built.Pause); err != nil {
			return err
		}
		if err := s.kubeadmUp(ctx, cfg.Log); err != nil {
			return err
		}
	}
	if err := s.waitAPIServer(ctx); err != nil {
		return err
	}
	cfg.Log("kube-apiserver %s ready (%s)", s.APIServer, time.Since(start).Round(time.Second))
	if err := s.waitNodesReady(ctx, cfg.Log); err != nil {
		return err
	}
	if err := s.labelNodes(ctx); err != nil {
		return err
	}
	if cfg.Kubeadm {
		if err := s.waitAddons(ctx); err != nil {
			return err
		}
		cfg.Log("kubeadm's addons run: kube-proxy on every node, CoreDNS")
	}
	if err := s.waitRegistry(ctx); err != nil {
		return err
	}
	if cfg.Runtime == RuntimeContainerd && built == nil {
		cfg.Log("images: pause and the shop's server, built here and pushed to the private registry")
		if built, err = s.pushImages(ctx); err != nil {
			return err
		}
	}
	if s.CoreDNS != "" {
		cfg.Log("CoreDNS %s, as a binary installer deploys it (kubeadm's manifests, from the private registry)", s.CoreDNS)
		if err := s.deployCoreDNS(ctx); err != nil {
			return err
		}
	}
	if s.Binaries.New, s.Binaries.Hops, err = target(); err != nil {
		return err
	}
	cfg.Log("Kubernetes %s ready (%s)", cfg.NewVersion, time.Since(start).Round(time.Second))
	if err := s.save(); err != nil {
		return err
	}
	inet, err := s.Machine("internet")
	if err != nil {
		return err
	}
	if err := s.serveFiles(inet); err != nil {
		return err
	}
	cfg.Log("the stand-in internet: seeding %s's images and serving its files (real kubelet, kube-proxy and kubectl; the real pause)", cfg.NewVersion)
	if err := s.seedInternet(ctx, built); err != nil {
		return err
	}
	if cfg.Workloads {
		cfg.Log("workloads: Deployments, a DaemonSet and bare pods (some without tolerations, one with a nodeSelector its node no longer matches)")
		if err := s.createWorkloads(ctx); err != nil {
			return err
		}
		if cfg.StaticPod {
			if cfg.Runtime != RuntimeContainerd {
				return errors.New("sandbox: a static pod needs the containerd runtime")
			}
			cfg.Log("a static pod on the last worker")
			if err := s.createStaticPod(ctx); err != nil {
				return err
			}
		}
	}
	s.Complete = true
	if err := s.save(); err != nil {
		return err
	}
	cfg.Log("sandbox up in %s: %d nodes Ready at %s", time.Since(start).Round(time.Second), len(s.Nodes()), cfg.OldVersion)
	return nil
}
