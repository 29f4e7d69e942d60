// Package fleet plays many simulated Kubernetes nodes over SSH for the
// engine's scale tests: one process hosts an SSH server per node, each on
// its own loopback address with its own host key, and answers the shell
// scripts kubelift's in-place engine (internal/inplace) sends, so that the
// engine runs unmodified against thousands of nodes. The Node objects
// themselves live in a real API server (KWOK plays them there); the fleet
// only patches a Node's status when its kubelet restarts, renews the
// Leases of the nodes whose kubelet runs where KWOK does not
// (Config.LeaseRenew), and reads the Pods bound to each node to answer
// `crictl ps`.
//
// The fleet emulates the engine's commands, not a shell: each command is
// matched against a short list of named handlers (handlers.go), one per
// script the engine sends, and a command none of them recognises fails
// with exit status 127 and "fleet: NODE: command not played: ..." so that
// a script the engine gained and the fleet lacks is obvious.
package fleet

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/nodeaccess"
)

// NodeSpec is one simulated node: its Kubernetes name, the loopback
// address its SSH server listens on, and the versions it starts with.
type NodeSpec struct {
	Name    string
	Address string // a 127.0.0.0/8 address, without the port
	// ControlPlane nodes also run kube-apiserver, kube-controller-manager
	// and kube-scheduler as units.
	ControlPlane bool
	// KubeletVersion is the kubelet the node starts with ("v1.30.14");
	// ControlPlaneVersion its control plane's (default KubeletVersion).
	KubeletVersion      string
	ControlPlaneVersion string
	// KubeProxy nodes run kube-proxy as a unit (at KubeletVersion), its
	// health endpoint answering 200 while it runs.
	KubeProxy bool
}

// Binary says what a file with a given sha256 is: a program of
// Component at Version, which prints "Kubernetes VERSION" when run with
// --version and which a unit of that component can run.
type Binary struct {
	Component, Version string
}

// Config configures a Fleet.
type Config struct {
	// Dir receives the client key (id_ed25519), known_hosts and
	// inventory.yaml. Host keys stay in memory.
	Dir string
	// Client reaches the API server holding the nodes' Node objects and
	// Pods (nil: no patches, and no containers).
	Client kubernetes.Interface
	// Binaries maps sha256 (hex) to what a file with that content is:
	// the binaries a test stages, so that a swapped-in kubelet starts at
	// its version. The fleet adds the binaries its nodes start with.
	Binaries map[string]Binary
	// Catalog gives each kubelet version's container hash era (nil: the
	// embedded one).
	Catalog *catalog.Catalog
	// Port every node's SSH server listens on; 0 tries 22 and, where 22
	// cannot be bound, one free port for all.
	Port int
	// Log reports what the fleet could not do (a failed patch, a command
	// not played); nil discards it.
	Log func(format string, args ...any)
	// LeaseRenew, when set, makes each node's running kubelet renew the
	// node's Lease in kube-node-lease as a kubelet does: when it starts,
	// then every LeaseRenew (a kubelet's default: 10 s). A kubelet that
	// does not run renews nothing. 0: no Leases (KWOK plays them).
	LeaseRenew time.Duration
}

// Fleet is a running set of simulated nodes. Close stops it.
type Fleet struct {
	cfg      Config
	ctx      context.Context
	cancel   context.CancelFunc
	binaries sync.Map // sha256 -> Binary
	nodes    map[string]*node
	order    []*node
	pods     *podIndex
	hashers  *hashers
	stream   *streamCache
	nextPID  atomic.Int64

	inventory, knownHosts, key string
	clientKey                  ssh.PublicKey

	wg        sync.WaitGroup
	mu        sync.Mutex // conns, listeners, closed
	listeners []net.Listener
	conns     map[net.Conn]struct{}
	closed    bool

	connections atomic.Int64
	handled     sync.Map // handler name -> *atomic.Int64
	patchErrors atomic.Int64
}

// Stats are what the fleet has served so far.
type Stats struct {
	// Commands counts the commands each handler played, by its name;
	// "not played" counts those none recognised.
	Commands map[string]int64
	// Connections is the SSH connections accepted (logged in or not).
	Connections int64
	// StageCacheHits and StageCacheMisses count staged streams whose
	// content was known (only hashed) or decompressed.
	StageCacheHits, StageCacheMisses int64
	// PatchErrors counts Node status patches and Lease renewals that
	// failed.
	PatchErrors int64
	// Nodes are per node, by name.
	Nodes map[string]NodeStats
}

// NodeStats are what one node has served.
type NodeStats struct {
	// BytesReceived is the staged (compressed) bytes read from stdin.
	BytesReceived int64
	// Restarts are the unit restarts, in order.
	Restarts []Restart
	// Commands are the commands played, in order.
	Commands []Command
}

// Command is one command a node played.
type Command struct {
	Handler      string
	Began, Ended time.Time
	Code         int
}

// Restart is one `systemctl restart` of a unit.
type Restart struct {
	Unit string
	// Version is what the unit runs after it ("": it did not start).
	Version string
	At      time.Time
}

// KubeletRestarts counts the kubelet's restarts.
func (s NodeStats) KubeletRestarts() int {
	n := 0
	for _, r := range s.Restarts {
		if r.Unit == "kubelet" {
			n++
		}
	}
	return n
}

// OldBinarySHA is the sha256 of the virtual binary of component at
// version that nodes start with: the hash of a fixed string, since its
// content is never read.
func OldBinarySHA(component, version string) string {
	sum := sha256.Sum256([]byte("kubelift fleet " + component + " " + version))
	return hex.EncodeToString(sum[:])
}

// Start starts a node for each spec, listening until Close (or until ctx
// is done), and writes the client key, known_hosts and inventory to
// cfg.Dir.
func Start(ctx context.Context, cfg Config, nodes []NodeSpec) (*Fleet, error) {
	if cfg.Dir == "" {
		return nil, errors.New("fleet: no directory for the key, known_hosts and inventory")
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	if cfg.Catalog == nil {
		c, err := catalog.Default()
		if err != nil {
			return nil, fmt.Errorf("fleet: catalog: %w", err)
		}
		cfg.Catalog = c
	}
	ctx, cancel := context.WithCancel(ctx)
	f := &Fleet{cfg: cfg, ctx: ctx, cancel: cancel, nodes: make(map[string]*node, len(nodes)), conns: map[net.Conn]struct{}{},
		hashers: &hashers{cat: cfg.Catalog, by: map[string]*hasherEntry{}}, stream: &streamCache{}}
	f.nextPID.Store(1000)
	for sum, b := range cfg.Binaries {
		f.binaries.Store(sum, b)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
		}
	}()
	if err := f.writeClientKey(); err != nil {
		return nil, err
	}
	for _, s := range nodes {
		if s.Name == "" || net.ParseIP(s.Address) == nil {
			return nil, fmt.Errorf("fleet: node %q: needs a name and an IP address (got %q)", s.Name, s.Address)
		}
		if _, dup := f.nodes[s.Name]; dup {
			return nil, fmt.Errorf("fleet: node %s given twice", s.Name)
		}
		n, err := f.newNode(s)
		if err != nil {
			return nil, err
		}
		f.nodes[s.Name] = n
		f.order = append(f.order, n)
	}
	if cfg.Client != nil {
		p, err := startPodIndex(ctx, cfg.Client, f.podBound)
		if err != nil {
			return nil, err
		}
		f.pods = p
	}
	if err := f.listen(); err != nil {
		return nil, err
	}
	if err := f.writeFiles(); err != nil {
		return nil, err
	}
	if cfg.LeaseRenew > 0 && cfg.Client != nil {
		f.wg.Add(1)
		go f.renewLeases()
	}
	ok = true
	return f, nil
}

// Inventory is the path of the inventory file naming every node's address
// and port, the key and known_hosts (for --inventory).
func (f *Fleet) Inventory() string { return f.inventory }

// KnownHosts is the path of the known_hosts file holding every node's host key.
func (f *Fleet) KnownHosts() string { return f.knownHosts }

// Key is the path of the client's private key, which every node accepts
// for root.
func (f *Fleet) Key() string { return f.key }

// Close stops every listener, connection and goroutine of the fleet.
func (f *Fleet) Close() {
	f.cancel()
	f.mu.Lock()
	f.closed = true
	for _, l := range f.listeners {
		l.Close()
	}
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	if f.pods != nil {
		f.pods.stop()
	}
	f.wg.Wait()
}

// Stats returns what the fleet has served so far.
func (f *Fleet) Stats() Stats {
	s := Stats{Commands: map[string]int64{}, Connections: f.connections.Load(), PatchErrors: f.patchErrors.Load(),
		StageCacheHits: f.stream.hits.Load(), StageCacheMisses: f.stream.misses.Load(), Nodes: make(map[string]NodeStats, len(f.nodes))}
	f.handled.Range(func(k, v any) bool {
		s.Commands[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	for _, n := range f.order {
		n.mu.Lock()
		s.Nodes[n.spec.Name] = NodeStats{BytesReceived: n.received, Restarts: append([]Restart(nil), n.restarts...), Commands: append([]Command(nil), n.commands...)}
		n.mu.Unlock()
	}
	return s
}

// Running is the version node's unit runs ("": not running, or no such
// node or unit).
func (f *Fleet) Running(node, unit string) string {
	n := f.nodes[node]
	if n == nil {
		return ""
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if u := n.units[unit]; u != nil {
		return u.version
	}
	return ""
}

// File returns the sha256 of the file at path on node, and whether it
// exists.
func (f *Fleet) File(node, p string) (string, bool) {
	n := f.nodes[node]
	if n == nil {
		return "", false
	}
	v, ok := n.file(p)
	if !ok {
		return "", false
	}
	return v.digest(), true
}

// ReadFile returns the content of a small file on node (one the engine
// wrote, such as the hash-skip file), and whether it exists as such.
func (f *Fleet) ReadFile(node, p string) ([]byte, bool) {
	n := f.nodes[node]
	if n == nil {
		return nil, false
	}
	v, ok := n.file(p)
	if !ok || v.data == nil {
		return nil, false
	}
	return append([]byte(nil), v.data...), true
}

// PreStage places files (name -> sha256) under dir/version on node as if
// staged, without sending them: a benchmark stages a sample of the nodes
// for real and pre-stages the others.
func (f *Fleet) PreStage(node, dir, version string, files map[string]string) error {
	n := f.nodes[node]
	if n == nil {
		return fmt.Errorf("fleet: no node %s", node)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for name, sum := range files {
		n.put(path.Join(dir, version, name), vfile{sum: sum})
	}
	return nil
}

// RegisterBinary says what a file with sha256 sum is (as Config.Binaries).
func (f *Fleet) RegisterBinary(sum string, b Binary) { f.binaries.Store(sum, b) }

func (f *Fleet) binary(sum string) (Binary, bool) {
	v, ok := f.binaries.Load(sum)
	if !ok {
		return Binary{}, false
	}
	return v.(Binary), true
}

func (f *Fleet) count(handler string) {
	v, ok := f.handled.Load(handler)
	if !ok {
		v, _ = f.handled.LoadOrStore(handler, new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(1)
}

// writeClientKey makes the key every node accepts.
func (f *Fleet) writeClientKey() error {
	if err := os.MkdirAll(f.cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	block, err := ssh.MarshalPrivateKey(key, "kubelift fleet client")
	if err != nil {
		return err
	}
	f.key = filepath.Join(f.cfg.Dir, "id_ed25519")
	if err := os.WriteFile(f.key, pem.EncodeToMemory(block), 0o600); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	f.clientKey, err = ssh.NewPublicKey(pub)
	return err
}

// writeFiles writes known_hosts and the inventory once every node listens.
func (f *Fleet) writeFiles() error {
	var kh strings.Builder
	inv := nodeaccess.Inventory{APIVersion: nodeaccess.InventoryAPIVersion, Kind: nodeaccess.InventoryKind,
		SSH: nodeaccess.SSHConfig{IdentityFile: f.key, User: "root", Port: f.commonPort()}}
	f.knownHosts = filepath.Join(f.cfg.Dir, "known_hosts")
	inv.SSH.KnownHostsFile = f.knownHosts
	for _, n := range f.order {
		addr := net.JoinHostPort(n.spec.Address, strconv.Itoa(n.port))
		kh.WriteString(knownhosts.Line([]string{knownhosts.Normalize(addr)}, n.hostKey.PublicKey()))
		kh.WriteByte('\n')
		nc := nodeaccess.NodeConfig{Name: n.spec.Name, Address: n.spec.Address}
		if n.port != inv.SSH.Port {
			nc.Port = n.port
		}
		if n.spec.ControlPlane {
			nc.Role = "control-plane"
		}
		inv.Nodes = append(inv.Nodes, nc)
	}
	if err := os.WriteFile(f.knownHosts, []byte(kh.String()), 0o644); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	data, err := yaml.Marshal(inv)
	if err != nil {
		return err
	}
	f.inventory = filepath.Join(f.cfg.Dir, "inventory.yaml")
	if err := os.WriteFile(f.inventory, data, 0o644); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	return nil
}

// commonPort is the port most nodes listen on.
func (f *Fleet) commonPort() int {
	count := map[int]int{}
	for _, n := range f.order {
		count[n.port]++
	}
	ports := make([]int, 0, len(count))
	for p := range count {
		ports = append(ports, p)
	}
	sort.Slice(ports, func(i, j int) bool {
		return count[ports[i]] > count[ports[j]] || count[ports[i]] == count[ports[j]] && ports[i] < ports[j]
	})
	if len(ports) == 0 {
		return 22
	}
	return ports[0]
}
