package sandbox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kubelift/kubelift/test/env/images"
)

// The real container runtime of a node: containerd with runc and the CNI
// bridge, in the node's own mount namespace (the init's), so that
// containerd, its shims, runc, the CNI plugins and the kubelet see the
// same mounts (a pod's network namespace is a bind mount in containerd's
// mount namespace). See docs/sandbox.md.

// Runtimes a sandbox can run.
const (
	// RuntimeContainerd is containerd, runc and CNI: real processes.
	RuntimeContainerd = "containerd"
	// RuntimeStandIn is the CRI stand-in (records, no processes), for
	// tests that need thousands of containers or none of their processes.
	RuntimeStandIn = "stand-in"
)

const containerdEndpoint = "unix:///run/containerd/containerd.sock"

// cniPlugins are the CNI plugins a node's bridge network runs, copied
// from Debian's containernetworking-plugins into the node's /opt/cni/bin.
var cniPlugins = []string{"bridge", "host-local", "loopback", "portmap"}

// runtimeBinaries are the runtime's programs and where a node has them.
var runtimeBinaries = map[string]string{
	"containerd": "usr/local/bin/containerd", "containerd-shim-runc-v2": "usr/local/bin/containerd-shim-runc-v2",
	"ctr": "usr/local/bin/ctr", "crictl": "usr/local/bin/crictl", "runc": "usr/local/sbin/runc",
}

// containerdUnit is containerd's own unit (containerd.service upstream),
// without what the stand-in cannot do (Type=notify, Delegate, limits).
const containerdUnit = `[Unit]
Description=containerd container runtime
Documentation=https://containerd.io

[Service]
ExecStart=/usr/local/bin/containerd
KillMode=process
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
`

// containerdConfig is the node's /etc/containerd/config.toml (version 3,
// containerd 2.x): cgroupfs, the pause image pinned, the registry's hosts
// under certs.d with its credentials (hosts.toml has no field for them),
// and pod network namespaces under containerd's own state directory.
// registry.configs.*.auth is deprecated, but containerd's docs/cri/registry.md
// says it stays until a secret store replaces it, and it is the only way
// to credential containerd's own pulls: the pause image is pulled by
// containerd with no pod and so no imagePullSecrets (what air-gapped
// installers such as kubespray write, too).
// restrict_oom_score_adj: the machines this runs on may lack
// CAP_SYS_RESOURCE (seen: writing -998, the pause container's score, to
// oom_score_adj fails), so no container's score goes below containerd's.
// A containerd 1.x (version "v1.*") gets the same in its own schema,
// version 2, where one CRI plugin holds it all.
func containerdConfig(version, registry, user, password string) string {
	if strings.HasPrefix(version, "v1.") {
		return fmt.Sprintf(containerd1Config, registry, user, password)
	}
	return fmt.Sprintf(`version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "registry.k8s.io/pause:3.10"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "/etc/containerd/certs.d"
  [plugins.'io.containerd.cri.v1.images'.registry.configs.'%[1]s'.auth]
    username = %[2]q
    password = %[3]q

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
`, registry, user, password)
}

// containerd1Config is containerdConfig for containerd 1.x: version 2,
// the CRI plugin io.containerd.grpc.v1.cri (containerd's docs/cri/config.md
// at v1.7).
const containerd1Config = `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "/etc/containerd/certs.d"
    [plugins."io.containerd.grpc.v1.cri".registry.configs."%[1]s".auth]
      username = %[2]q
      password = %[3]q
`

// hostsTOML sends every pull for a registry (the private one itself, or
// registry.k8s.io mirrored to it, paths kept) to the private registry,
// trusting its CA. server must be the private registry: containerd always
// falls back to server, and registry.k8s.io is not reachable.
func hostsTOML(registry string) string {
	return fmt.Sprintf("server = \"https://%[1]s\"\n\n[host.\"https://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"/etc/containerd/certs.d/%[1]s/ca.crt\"\n", registry)
}

// cniConfig is the node's bridge network: its own pod CIDR, the bridge
// the gateway, no masquerading (pods are reached by their addresses;
// other nodes route the CIDR to this node).
func cniConfig(podCIDR string) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "kubelift",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, podCIDR)
}

const crictlConfig = "runtime-endpoint: " + containerdEndpoint + "\nimage-endpoint: " + containerdEndpoint + "\ntimeout: 10\n"

// kubeletConfigContainerd manages cgroups for real, below the node's own
// cgroup root (made by the sandbox in every hierarchy, removed by Down).
// Disk-pressure eviction is off: the nodes share the host's disk.
const kubeletConfigContainerd = `containerRuntimeEndpoint: ` + containerdEndpoint + `
cgroupRoot: %s
cgroupsPerQOS: true
imageGCHighThresholdPercent: 100
evictionHard: {nodefs.available: "0%%", nodefs.inodesFree: "0%%", imagefs.available: "0%%", memory.available: "100Mi"}
%sstaticPodPath: /etc/kubernetes/manifests
`

// cgroupHierarchies are the cgroup v1 hierarchies the kubelet needs a
// node's cgroup root in (and the pods' cgroups land in).
var cgroupHierarchies = []string{"cpu", "cpuacct", "cpuset", "memory", "pids", "systemd", "devices", "freezer", "blkio"}

// CgroupRoot is the node's cgroup root, relative to each hierarchy.
func (s *State) CgroupRoot(m Machine) string { return "/kubelift-" + s.Name + "/" + m.Name }

// ClusterCIDR holds every node's pod network.
const ClusterCIDR = "10.244.0.0/16"

// PodCIDR is the node's pod network (10.244.N.0/24 of ClusterCIDR, N its
// place among the nodes, from 1).
func (s *State) PodCIDR(m Machine) string {
	for i, n := range s.Nodes() {
		if n.Name == m.Name {
			return fmt.Sprintf("10.244.%d.0/24", i+1)
		}
	}
	return ""
}

// runtimeFiles gives node m containerd, runc, crictl, ctr, the CNI
// plugins and their configuration.
func (s *State) runtimeFiles(m *Machine) error {
	for _, d := range []string{"var/lib/containerd", "var/lib/cni", "etc/cni/net.d", "opt/cni/bin", "etc/kubernetes/manifests"} {
		if err := os.MkdirAll(m.fsPath(d), 0o755); err != nil {
			return err
		}
	}
	for name, dst := range runtimeBinaries {
		if err := copyFile(filepath.Join(s.Binaries.Runtime, name), m.fsPath(dst), 0o755); err != nil {
			return err
		}
	}
	for _, p := range cniPlugins {
		if err := copyFile(filepath.Join("/usr/lib/cni", p), m.fsPath("opt/cni/bin/"+p), 0o755); err != nil {
			return fmt.Errorf("CNI plugin %s (Debian's containernetworking-plugins): %w", p, err)
		}
	}
	reg := s.Registry.Address
	files := map[string]string{
		"etc/containerd/config.toml":                        containerdConfig(s.RuntimeVersion, reg, s.Registry.User, s.Registry.Password),
		"etc/containerd/certs.d/" + reg + "/hosts.toml":     hostsTOML(reg),
		"etc/containerd/certs.d/registry.k8s.io/hosts.toml": hostsTOML(reg),
		"etc/cni/net.d/10-kubelift.conflist":                cniConfig(s.PodCIDR(*m)),
		".overlay/etc/upper/crictl.yaml":                    crictlConfig,
		"var/lib/kubelet/config.yaml":                       fmt.Sprintf(kubeletConfigCommon, m.Address) + fmt.Sprintf(kubeletConfigContainerd, s.CgroupRoot(*m), s.clusterDNSConfig()),
	}
	if s.Kubeadm {
		delete(files, "var/lib/kubelet/config.yaml") // kubeadm writes it
	}
	for path, content := range files {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(path, "config.toml") {
			mode = 0o600 // the registry's password
		}
		if err := os.MkdirAll(filepath.Dir(m.fsPath(path)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(m.fsPath(path), []byte(content), mode); err != nil {
			return err
		}
	}
	if err := copyFile(s.Registry.CAFile, m.fsPath("etc/containerd/certs.d/"+reg+"/ca.crt"), 0o644); err != nil {
		return err
	}
	return writeUnit(m, "containerd.service", containerdUnit, true)
}

// makeCgroups makes every node's cgroup root in each hierarchy (cpuset's
// with its parent's CPUs and memory nodes, which a new cpuset lacks).
func (s *State) makeCgroups() error {
	for _, m := range s.Nodes() {
		for _, h := range cgroupHierarchies {
			base := filepath.Join("/sys/fs/cgroup", h)
			if _, err := os.Stat(base); err != nil {
				continue
			}
			dir := base
			for _, part := range strings.Split(strings.Trim(s.CgroupRoot(m), "/"), "/") {
				dir = filepath.Join(dir, part)
				if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
					return fmt.Errorf("cgroup %s: %w", dir, err)
				}
				if h == "cpuset" {
					for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
						v, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
						if err != nil {
							return err
						}
						if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
							return fmt.Errorf("cgroup %s: %w", filepath.Join(dir, f), err)
						}
					}
				}
			}
		}
	}
	return nil
}

// CgroupDirs are the cgroups of the sandbox called name that exist, in
// every hierarchy, not only those it made (runc also makes the pods'
// cgroups in the unified one of a hybrid host), and at the top of a
// cgroup v2 host.
func CgroupDirs(name string) []string {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "kubelift-"+name))
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", "kubelift-"+name)); err == nil {
		dirs = append(dirs, filepath.Join("/sys/fs/cgroup", "kubelift-"+name))
	}
	return dirs
}

// removeCgroups kills every process left in the sandbox's cgroups (the
// containers, once their shims are gone) and removes the cgroups,
// deepest first.
func removeCgroups(name string) error {
	var errs []string
	for _, top := range CgroupDirs(name) {
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for attempt := 0; attempt < 50; attempt++ {
			left := 0
			for _, d := range dirs {
				data, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
				for _, f := range strings.Fields(string(data)) {
					if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
						_ = syscall.Kill(pid, syscall.SIGKILL)
						left++
					}
				}
			}
			if left == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := syscall.Rmdir(dirs[i]); err != nil && !os.IsNotExist(err) {
				errs = append(errs, fmt.Sprintf("%s: %v", dirs[i], err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("cgroups left: %s", strings.Join(errs, "; "))
	}
	return nil
}

// Where the images the nodes run live in the private registry. pause
// keeps its upstream path (nodes pull registry.k8s.io/pause through the
// mirror); the shop's images are the team's own.
const (
	ShopAppImage     = "library/shop-app:1.4.2"
	ShopSidecarImage = "library/envoy:v1.31"
)

// pushImages builds pause and the shop's server and pushes them to the
// private registry, as the cluster's installer and the team's CI did
// before kubelift ever ran.
func (s *State) pushImages(ctx context.Context) (*images.Set, error) {
	set, err := images.Build(ctx, filepath.Join(s.Dir, "images"), s.OldVersion)
	if err != nil {
		return nil, err
	}
	opts, err := s.RegistryOptions(ctx)
	if err != nil {
		return nil, err
	}
	for path, img := range map[string]v1.Image{"pause:" + images.PauseTag: set.Pause, ShopAppImage: set.Shop, ShopSidecarImage: set.Shop} {
		ref, err := parseRef(s.Registry.Address + "/" + path)
		if err != nil {
			return nil, err
		}
		if err := remote.Write(ref, img, opts...); err != nil {
			return nil, fmt.Errorf("push %s: %w", ref, err)
		}
	}
	return set, nil
}

// RegistryOptions reach the private registry from the admin machine as
// its user, trusting its CA.
func (s *State) RegistryOptions(ctx context.Context) ([]remote.Option, error) {
	caPEM, err := os.ReadFile(s.Registry.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return []remote.Option{remote.WithContext(ctx),
		remote.WithAuth(&authn.Basic{Username: s.Registry.User, Password: s.Registry.Password}),
		remote.WithTransport(&http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DialContext: s.NetNS().DialContext})}, nil
}

func parseRef(r string) (name.Reference, error) { return name.ParseReference(r) }
