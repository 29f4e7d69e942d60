package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"k8s.io/apimachinery/pkg/types"
)

// node is one simulated node: its SSH identity and, guarded by mu, its
// files and units.
type node struct {
	spec    NodeSpec
	port    int
	config  *ssh.ServerConfig
	hostKey ssh.Signer

	mu    sync.Mutex
	files map[string]vfile
	dirs  map[string]bool // every directory that exists
	units map[string]*unit
	// created maps the pods bound to the node to the kubelet version
	// that created their containers (and so computed their hashes).
	created  map[types.UID]string
	kubelet  string // the last version the kubelet ran
	received int64
	restarts []Restart
	commands []Command
	// faults are the failures injected by handler name (Fail);
	// restartsContainers and generation: kubelet restarts restart every
	// container (RestartContainers), generation counts them.
	faults             map[string]*fault
	restartsContainers bool
	generation         int
	// crashes maps a unit to the version of its program that exits at
	// once (CrashAt).
	crashes map[string]string
	// blocks hold the next command of a handler until released (Block).
	blocks map[string]*block
	// stopsWith maps a unit to the unit whose restart stops it
	// (StopWhenRestarted).
	stopsWith map[string]string
}

// vfile is a file: its content when small (unit files, what the engine
// writes), else only its sha256 and size (binaries: never a copy per
// node).
type vfile struct {
	data []byte
	sum  string
	size int64
}

func (v vfile) digest() string {
	if v.sum != "" {
		return v.sum
	}
	s := sha256.Sum256(v.data)
	return hex.EncodeToString(s[:])
}

// unit is a systemd service running one program.
type unit struct {
	program string // /usr/local/bin/NAME
	file    string // its unit file
	version string // running ("": not running)
	pid     int64
	cmdline []string
}

// binarySize is the size of the virtual binaries nodes start with.
const binarySize = 100 << 20

// Unit files in the shape kubeadm gives them (as test/env/sandbox's): the
// engine reads their flags. They are the same for every node, so the
// slices are shared; a write replaces a file, never changes one in place.
var (
	kubeletUnitFile = []byte(`[Unit]
Description=kubelet: The Kubernetes Node Agent
After=containerd.service

[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
ExecStart=/usr/local/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
`)
	proxyUnitFile = []byte(`[Unit]
Description=Kubernetes Kube Proxy

[Service]
ExecStart=/usr/local/bin/kube-proxy --config=/etc/kubernetes/kube-proxy.yaml
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`)
	apiserverUnitFile = []byte(`[Unit]
Description=Kubernetes API Server
After=etcd.service

[Service]
ExecStart=/usr/local/bin/kube-apiserver \
  --secure-port=6443 \
  --etcd-servers=https://127.0.0.1:2379 \
  --etcd-cafile=/etc/kubernetes/pki/etcd/ca.crt \
  --etcd-certfile=/etc/kubernetes/pki/apiserver-etcd-client.crt \
  --etcd-keyfile=/etc/kubernetes/pki/apiserver-etcd-client.key \
  --tls-cert-file=/etc/kubernetes/pki/apiserver.crt --tls-private-key-file=/etc/kubernetes/pki/apiserver.key \
  --client-ca-file=/etc/kubernetes/pki/ca.crt \
  --service-account-key-file=/etc/kubernetes/pki/sa.pub \
  --service-account-signing-key-file=/etc/kubernetes/pki/sa.key \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=10.96.0.0/12 \
  --authorization-mode=Node,RBAC \
  --enable-admission-plugins=NodeRestriction \
  --allow-privileged=true
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`)
	controllerManagerUnitFile = []byte(`[Unit]
Description=Kubernetes Controller Manager
After=kube-apiserver.service

[Service]
ExecStart=/usr/local/bin/kube-controller-manager \
  --kubeconfig=/etc/kubernetes/controller-manager.conf \
  --authentication-kubeconfig=/etc/kubernetes/controller-manager.conf \
  --authorization-kubeconfig=/etc/kubernetes/controller-manager.conf \
  --root-ca-file=/etc/kubernetes/pki/ca.crt \
  --service-account-private-key-file=/etc/kubernetes/pki/sa.key \
  --use-service-account-credentials=true \
  --leader-elect=true
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`)
	schedulerUnitFile = []byte(`[Unit]
Description=Kubernetes Scheduler
After=kube-apiserver.service

[Service]
ExecStart=/usr/local/bin/kube-scheduler \
  --kubeconfig=/etc/kubernetes/scheduler.conf \
  --authentication-kubeconfig=/etc/kubernetes/scheduler.conf \
  --authorization-kubeconfig=/etc/kubernetes/scheduler.conf \
  --leader-elect=true
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`)
)

// ControlPlaneUnits are the units control-plane nodes run besides the kubelet.
var ControlPlaneUnits = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}

func (f *Fleet) newNode(s NodeSpec) (*node, error) {
	if s.KubeletVersion == "" {
		return nil, fmt.Errorf("fleet: node %s: no kubelet version", s.Name)
	}
	if s.ControlPlaneVersion == "" {
		s.ControlPlaneVersion = s.KubeletVersion
	}
	cfg, key, err := f.serverConfig()
	if err != nil {
		return nil, err
	}
	n := &node{spec: s, config: cfg, hostKey: key, files: map[string]vfile{}, dirs: map[string]bool{"/": true},
		units: map[string]*unit{}, created: map[types.UID]string{}}
	add := func(name, version string, unitFile []byte) {
		sum := OldBinarySHA(name, version)
		f.binaries.LoadOrStore(sum, Binary{Component: name, Version: version})
		u := &unit{program: "/usr/local/bin/" + name, file: "/etc/systemd/system/" + name + ".service"}
		n.put(u.program, vfile{sum: sum, size: binarySize})
		n.put(u.file, vfile{data: unitFile})
		n.units[name] = u
		f.start(n, name, u)
	}
	n.put("/var/lib/kubelet/kubeadm-flags.env", vfile{data: []byte(fmt.Sprintf("KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock --node-ip=%s --hostname-override=%s\"\n",
		s.Address, s.Name))})
	n.put("/var/lib/kubelet/config.yaml", vfile{data: []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n")})
	add("kubelet", s.KubeletVersion, kubeletUnitFile)
	if s.KubeProxy {
		add("kube-proxy", s.KubeletVersion, proxyUnitFile)
	}
	if s.ControlPlane {
		for i, file := range [][]byte{apiserverUnitFile, controllerManagerUnitFile, schedulerUnitFile} {
			add(ControlPlaneUnits[i], s.ControlPlaneVersion, file)
		}
	}
	return n, nil
}

// put writes a file, making its directories. The caller holds n.mu.
func (n *node) put(p string, v vfile) {
	n.files[p] = v
	n.mkdirAll(path.Dir(p))
}

func (n *node) mkdirAll(dir string) {
	for d := path.Clean(dir); !n.dirs[d]; d = path.Dir(d) {
		n.dirs[d] = true
	}
}

// file is the file at p, read under the node's lock.
func (n *node) file(p string) (vfile, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	v, ok := n.files[p]
	return v, ok
}

func (n *node) exists(p string) bool {
	_, ok := n.files[p]
	return ok || n.dirs[p]
}

// list returns the names of the files directly in dir, sorted as a C
// locale glob sorts them.
func (n *node) list(dir string) []string {
	var names []string
	prefix := strings.TrimSuffix(dir, "/") + "/"
	for p := range n.files {
		if rest, ok := strings.CutPrefix(p, prefix); ok && !strings.Contains(rest, "/") {
			names = append(names, rest)
		}
	}
	sort.Strings(names)
	return names
}

// versionOf is the first line `PROGRAM --version 2>&1` prints.
func (f *Fleet) versionOf(n *node, p string) string {
	v, ok := n.files[p]
	if !ok {
		return "sh: 1: " + p + ": not found"
	}
	if b, ok := f.binary(v.digest()); ok {
		return "Kubernetes " + b.Version
	}
	return "sh: 1: " + p + ": Exec format error"
}

// start starts unit: it runs the version of the binary at its program
// path, if that is a binary of its component; else it does not start, as
// a kubelet that exits at once. The caller holds n.mu.
func (f *Fleet) start(n *node, name string, u *unit) {
	u.version, u.pid, u.cmdline = "", 0, nil
	v, ok := n.files[u.program]
	if !ok {
		return
	}
	b, ok := f.binary(v.digest())
	if !ok || b.Component != name || n.crashes[name] == b.Version {
		return
	}
	u.version, u.pid = b.Version, f.nextPID.Add(1)
	u.cmdline = n.execStart(u.file)
	if name == "kubelet" {
		n.kubelet = b.Version
	}
}

// restart is `systemctl restart NAME`. A kubelet that started reports its
// new version to the API server as a restarting kubelet does: NotReady
// until KWOK's stage (someone else's) brings the Node Ready again. One
// that did not start reports nothing.
func (f *Fleet) restart(n *node, name string) error {
	n.mu.Lock()
	u := n.units[name]
	if u == nil {
		n.mu.Unlock()
		return fmt.Errorf("Failed to restart %s.service: Unit %s.service not found.", name, name)
	}
	f.start(n, name, u)
	for other, trigger := range n.stopsWith {
		if o := n.units[other]; trigger == name && o != nil {
			o.version, o.pid, o.cmdline = "", 0, nil
		}
	}
	version := u.version
	if name == "kubelet" && n.restartsContainers && version != "" {
		n.generation++
	}
	n.restarts = append(n.restarts, Restart{Unit: name, Version: version, At: time.Now()})
	n.mu.Unlock()
	if name == "kubelet" && version != "" && f.cfg.Client != nil {
		f.patchRestarting(n.spec.Name, version)
		if f.cfg.LeaseRenew > 0 {
			f.renewLease(n.spec.Name)
		}
	}
	return nil
}

// patchRestarting marks the Node NotReady, reporting the kubelet version.
func (f *Fleet) patchRestarting(name, version string) {
	now := time.Now().UTC().Format(time.RFC3339)
	patch := map[string]any{"status": map[string]any{
		"conditions": []map[string]any{{"type": "Ready", "status": "False", "reason": "KubeletRestarting",
			"message": "kubelet " + version + " is starting (kubelift fleet)", "lastHeartbeatTime": now, "lastTransitionTime": now}},
		"nodeInfo": map[string]any{"kubeletVersion": version},
	}}
	data, _ := json.Marshal(patch)
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	if _, err := f.cfg.Client.CoreV1().Nodes().PatchStatus(ctx, name, data); err != nil {
		f.patchErrors.Add(1)
		f.cfg.Log("fleet: node %s: patch status after the kubelet restart: %v", name, err)
	}
}

// execStart is the command line a unit starts: its ExecStart words, with
// $VAR and ${VAR} replaced by the words of its Environment= values and
// EnvironmentFile= files. The caller holds n.mu.
func (n *node) execStart(file string) []string {
	text := strings.ReplaceAll(string(n.files[file].data), "\\\n", " ")
	env := map[string]string{}
	var exec []string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "Environment="):
			for _, w := range unitWords(strings.TrimPrefix(line, "Environment=")) {
				if k, v, ok := strings.Cut(w, "="); ok {
					env[k] = v
				}
			}
		case strings.HasPrefix(line, "EnvironmentFile="):
			p := strings.TrimPrefix(strings.TrimPrefix(line, "EnvironmentFile="), "-")
			for _, l := range strings.Split(string(n.files[p].data), "\n") {
				if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok && !strings.HasPrefix(k, "#") {
					env[k] = strings.Trim(v, `"'`)
				}
			}
		case strings.HasPrefix(line, "ExecStart="):
			exec = unitWords(strings.TrimPrefix(line, "ExecStart="))
		}
	}
	var args []string
	for _, w := range exec {
		if name, ok := strings.CutPrefix(w, "$"); ok {
			args = append(args, strings.Fields(env[strings.Trim(name, "{}")])...)
			continue
		}
		args = append(args, w)
	}
	return args
}

// unitWords splits a unit file value into words, honouring double quotes.
func unitWords(s string) []string {
	var words []string
	var b strings.Builder
	quoted, in := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, in = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if in {
				words = append(words, b.String())
				b.Reset()
				in = false
			}
		default:
			b.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, b.String())
	}
	return words
}
