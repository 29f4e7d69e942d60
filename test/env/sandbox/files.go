package sandbox

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/test/env/internet"
	"github.com/kubelift/kubelift/test/env/kube"
)

// The components built for each version (cached by version).
var (
	oldComponents = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"}
	newComponents = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"}
	// hopComponents are what a control-plane node runs at a hop.
	hopComponents = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}
)

// Hops are the releases a control plane passes through from OldVersion
// to NewVersion, as the catalog (and so `bundle create --from`) has them.
func (s *State) Hops() ([]*catalog.Release, error) { return hopsBetween(s.OldVersion, s.NewVersion) }

// hopsBetween are the releases a control plane passes through from oldVersion
// to newVersion.
func hopsBetween(oldVersion, newVersion string) ([]*catalog.Release, error) {
	cat, err := catalog.Default()
	if err != nil {
		return nil, err
	}
	to, err := cat.Lookup(newVersion)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", newVersion, err)
	}
	from, err := catalog.ParseVersion(oldVersion)
	if err != nil {
		return nil, fmt.Errorf("old version %s: %w", oldVersion, err)
	}
	rg, err := catalog.ParseRange(from.MinorString())
	if err != nil {
		return nil, err
	}
	return cat.Hops(rg, to)
}

func buildKubernetes(ctx context.Context, version string, components ...string) (string, error) {
	return kube.Binaries(ctx, version, components...)
}

// Paths inside every machine (its own, bind-mounted over the host's).
const (
	toolPath    = "/usr/local/lib/kubelift-sandbox/kubelift-sandbox"
	criEndpoint = CRIEndpoint
	pkiDir      = "/etc/kubernetes/pki"
	// NodeMonitorGracePeriod is how long the node lifecycle controller
	// waits for a silent kubelet before marking its node NotReady
	// (upstream's default is 40s; short here so tests see evictions soon).
	NodeMonitorGracePeriod = "20s"
	// RegistryUser is the private registry's htpasswd user.
	RegistryUser = "kubelift"
)

// CRIEndpoint is where every node's CRI stand-in listens (crictl's
// default endpoint there).
const CRIEndpoint = "unix:///run/fake-cri/cri.sock"

// BindPaths are the directories every machine has of its own, in the
// order they are mounted (/root and /tmp last: the sandbox's directory
// may live below them).
var BindPaths = []string{
	"/usr/local", "/etc/kubernetes", "/etc/systemd/system", "/etc/ssh", "/etc/docker/registry", "/etc/containerd", "/etc/cni",
	"/var/lib/kubelet", "/var/lib/containerd", "/var/lib/cni", "/var/lib/etcd", "/var/lib/docker-registry", "/var/log", "/opt", "/srv", "/run", "/root", "/tmp",
}

// fsPath is where a machine's path lives on the host.
func (m *Machine) fsPath(p string) string { return filepath.Join(m.Root, p) }

func (s *State) makeFiles(cfg Config) error {
	pki := filepath.Join(s.Dir, "pki")
	ca, err := internet.NewCA(pki)
	if err != nil {
		return err
	}
	var cpIPs []net.IP
	for _, m := range s.Nodes() {
		if m.Role == "control-plane" {
			cpIPs = append(cpIPs, net.ParseIP(m.Address))
		}
	}
	// Every certificate, by the name the node files use: servers with their
	// names and addresses, clients with their user and groups.
	type cert struct {
		name, user string
		groups     []string
		dns        []string
		ips        []net.IP
	}
	certs := []cert{
		{name: "apiserver", dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
			ips: append([]net.IP{net.ParseIP("10.96.0.1"), net.ParseIP("127.0.0.1")}, cpIPs...)},
		{name: "registry", dns: []string{"registry.sandbox"}, ips: []net.IP{net.ParseIP(s.Admin().Address)}},
		{name: "admin", user: "admin", groups: []string{"system:masters"}},
		{name: "apiserver-kubelet-client", user: "apiserver-kubelet-client", groups: []string{"kubeadm:cluster-admins", "system:masters"}},
		{name: "controller-manager", user: "system:kube-controller-manager"},
		{name: "scheduler", user: "system:kube-scheduler"},
		// kube-proxy's user, bound to system:node-proxier by the API
		// server's bootstrap policy.
		{name: "kube-proxy", user: "system:kube-proxy"},
	}
	for _, m := range s.Nodes() {
		certs = append(certs, cert{name: "node-" + m.Name, user: "system:node:" + m.Name, groups: []string{"system:nodes"}})
	}
	issued := map[string][2]string{}
	for _, c := range certs {
		var crt, key string
		if c.user == "" {
			crt, key, err = ca.Issue(pki, c.name, c.dns, c.ips)
		} else {
			crt, key, err = ca.IssueClient(pki, c.user, c.groups)
		}
		if err != nil {
			return fmt.Errorf("certificate %s: %w", c.name, err)
		}
		issued[c.name] = [2]string{crt, key}
	}
	if err := kube.WriteServiceAccountKey(filepath.Join(pki, "sa.key"), filepath.Join(pki, "sa.pub")); err != nil {
		return err
	}

	// The operator's view: an admin kubeconfig and the registry's details.
	if err := os.WriteFile(filepath.Join(s.Dir, "kubeconfig"),
		[]byte(kube.Kubeconfig(s.APIServer, ca.CertFile, issued["admin"][0], issued["admin"][1], "kubelift-admin")), 0o600); err != nil {
		return err
	}
	password, err := randomHex(12)
	if err != nil {
		return err
	}
	s.Registry = Registry{Address: s.Admin().Address + ":5000", CAFile: filepath.Join(s.Dir, "registry", "ca.crt"), User: RegistryUser, Password: password}
	regDir := filepath.Join(s.Dir, "registry")
	if err := os.MkdirAll(regDir, 0o700); err != nil {
		return err
	}
	for name, content := range map[string]string{"address": s.Registry.Address + "\n", "user": s.Registry.User + "\n", "password": password + "\n"} {
		if err := os.WriteFile(filepath.Join(regDir, name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	if err := copyFile(ca.CertFile, s.Registry.CAFile, 0o644); err != nil {
		return err
	}

	// SSH: a client key for the operator; a host key per node, pinned in
	// known_hosts under the node's name and address.
	sshDir := filepath.Join(s.Dir, "ssh")
	if err := os.MkdirAll(sshDir, 0o700); err != nil {
		return err
	}
	if err := sshKeygen(filepath.Join(sshDir, "id_ed25519"), "kubelift-sandbox-operator"); err != nil {
		return err
	}
	clientPub, err := os.ReadFile(filepath.Join(sshDir, "id_ed25519.pub"))
	if err != nil {
		return err
	}
	var knownHosts strings.Builder
	var caCert, caKey []byte
	var token, certKey string
	if s.Kubeadm {
		if caCert, err = os.ReadFile(ca.CertFile); err != nil {
			return err
		}
		if caKey, err = ca.KeyPEM(); err != nil {
			return err
		}
		a, err := randomHex(3)
		if err != nil {
			return err
		}
		b, err := randomHex(8)
		if err != nil {
			return err
		}
		token = a + "." + b // kubeadm's [a-z0-9]{6}.[a-z0-9]{16}
		// The key kubeadm encrypts the shared certificates with in
		// kubeadm-certs (init --upload-certs) for the control planes
		// that join: 32 bytes, hex.
		if certKey, err = randomHex(32); err != nil {
			return err
		}
	}

	for i := range s.Machines {
		m := &s.Machines[i]
		if err := os.MkdirAll(m.Root, 0o755); err != nil {
			return err
		}
		for _, d := range []string{"usr/local/bin", "usr/local/sbin", "usr/local/lib/kubelift-sandbox", "etc/systemd/system/multi-user.target.wants",
			"var/log", "run", "tmp", "root/.ssh"} {
			if err := os.MkdirAll(m.fsPath(d), 0o755); err != nil {
				return err
			}
		}
		_ = os.Chmod(m.fsPath("tmp"), 0o1777)
		_ = os.Chmod(m.fsPath("root"), 0o700)
		_ = os.Chmod(m.fsPath("root/.ssh"), 0o700)
		if err := copyFile(cfg.Tool, m.fsPath(toolPath), 0o755); err != nil {
			return err
		}
		for _, name := range []string{"systemctl", "systemd-run"} {
			if err := os.Symlink(toolPath, m.fsPath("usr/local/sbin/"+name)); err != nil {
				return err
			}
		}
		if cfg.Runtime == RuntimeStandIn {
			if err := os.Symlink(toolPath, m.fsPath("usr/local/bin/crictl")); err != nil {
				return err
			}
		}
		if m.Role == "admin" {
			if err := s.adminFiles(m, issued["registry"]); err != nil {
				return err
			}
			if s.Kubeadm && s.HA() {
				if err := s.lbFiles(m); err != nil {
					return err
				}
			}
			continue
		}
		if m.Role == "internet" {
			if err := s.internetFiles(m); err != nil {
				return err
			}
			continue
		}
		if s.Kubeadm {
			if err := s.kubeadmNodeFiles(m, caCert, caKey, token, certKey); err != nil {
				return err
			}
		} else if err := s.nodeFiles(m, ca.CertFile, pki, issued); err != nil {
			return err
		}
		if cfg.Runtime == RuntimeContainerd {
			if err := s.runtimeFiles(m); err != nil {
				return err
			}
		} else if err := writeUnit(m, "fake-cri.service", criUnit, true); err != nil {
			return err
		}
		if err := os.WriteFile(m.fsPath("root/.ssh/authorized_keys"), clientPub, 0o600); err != nil {
			return err
		}
		if err := os.MkdirAll(m.fsPath("etc/ssh"), 0o755); err != nil {
			return err
		}
		if err := sshKeygen(m.fsPath("etc/ssh/ssh_host_ed25519_key"), "root@"+m.Name); err != nil {
			return err
		}
		hostPub, err := os.ReadFile(m.fsPath("etc/ssh/ssh_host_ed25519_key.pub"))
		if err != nil {
			return err
		}
		f := strings.Fields(string(hostPub))
		fmt.Fprintf(&knownHosts, "%s,%s %s %s\n", m.Name, m.Address, f[0], f[1])
		if err := os.WriteFile(m.fsPath("etc/ssh/sshd_config"), []byte(fmt.Sprintf(sshdConfig, m.Address)), 0o644); err != nil {
			return err
		}
		if err := writeUnit(m, "ssh.service", sshUnit, true); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(sshDir, "known_hosts"), []byte(knownHosts.String()), 0o644); err != nil {
		return err
	}
	if err := s.writeInventory(); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "versions"), []byte(fmt.Sprintf("old=%s\nnew=%s\n", s.OldVersion, s.NewVersion)), 0o644); err != nil {
		return err
	}
	if err := s.writeEnv(); err != nil {
		return err
	}
	return nil
}

func (s *State) adminFiles(m *Machine, tls [2]string) error {
	for _, d := range []string{"etc/docker/registry", "var/lib/docker-registry"} {
		if err := os.MkdirAll(m.fsPath(d), 0o755); err != nil {
			return err
		}
	}
	if err := copyFile(tls[0], m.fsPath("etc/docker/registry/tls.crt"), 0o644); err != nil {
		return err
	}
	if err := copyFile(tls[1], m.fsPath("etc/docker/registry/tls.key"), 0o600); err != nil {
		return err
	}
	if err := internet.WriteHtpasswd(m.fsPath("etc/docker/registry/htpasswd"), s.Registry.User, s.Registry.Password); err != nil {
		return err
	}
	secret, err := randomHex(16)
	if err != nil {
		return err
	}
	if err := os.WriteFile(m.fsPath("etc/docker/registry/config.yml"), []byte(registryConfig(s.Registry.Address, secret, true)), 0o600); err != nil {
		return err
	}
	return writeUnit(m, "docker-registry.service", fmt.Sprintf(registryUnit, "the air gap's private registry"), true)
}

func (s *State) nodeFiles(m *Machine, caFile, pki string, issued map[string][2]string) error {
	cp1 := s.Nodes()[0]
	for _, d := range []string{"etc/kubernetes/pki", "var/lib/kubelet", "var/log/pods", "opt/cni/bin"} {
		if err := os.MkdirAll(m.fsPath(d), 0o755); err != nil {
			return err
		}
	}
	copies := map[string]string{caFile: "ca.crt"}
	node := issued["node-"+m.Name]
	copies[node[0]], copies[node[1]] = "kubelet-client.crt", "kubelet-client.key"
	copies[issued["kube-proxy"][0]], copies[issued["kube-proxy"][1]] = "kube-proxy.crt", "kube-proxy.key"
	bins := []string{"kubelet", "kube-proxy", "kubectl"}
	if m.Role == "control-plane" {
		bins = append(bins, "kube-apiserver", "kube-controller-manager", "kube-scheduler")
		for _, n := range []string{"apiserver", "admin", "apiserver-kubelet-client", "controller-manager", "scheduler"} {
			copies[issued[n][0]], copies[issued[n][1]] = n+".crt", n+".key"
		}
		copies[filepath.Join(pki, "sa.key")], copies[filepath.Join(pki, "sa.pub")] = "sa.key", "sa.pub"
	}
	for src, name := range copies {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".key") {
			mode = 0o600
		}
		if err := copyFile(src, m.fsPath(pkiDir+"/"+name), mode); err != nil {
			return err
		}
	}
	for _, b := range bins {
		if err := copyFile(filepath.Join(s.Binaries.Old, b), m.fsPath("usr/local/bin/"+b), 0o755); err != nil {
			return err
		}
	}
	server := "https://" + cp1.Address + ":6443"
	local := "https://" + m.Address + ":6443"
	if m.Role == "control-plane" {
		server = local
	}
	confs := map[string]string{
		"kubelet.conf":    kube.Kubeconfig(server, pkiDir+"/ca.crt", pkiDir+"/kubelet-client.crt", pkiDir+"/kubelet-client.key", "system:node:"+m.Name),
		"kube-proxy.conf": kube.Kubeconfig(server, pkiDir+"/ca.crt", pkiDir+"/kube-proxy.crt", pkiDir+"/kube-proxy.key", "system:kube-proxy"),
		"kube-proxy.yaml": fmt.Sprintf(kubeProxyConfig, m.Name, m.Address, ClusterCIDR),
	}
	if m.Role == "control-plane" {
		confs["admin.conf"] = kube.Kubeconfig(local, pkiDir+"/ca.crt", pkiDir+"/admin.crt", pkiDir+"/admin.key", "kubernetes-admin")
		confs["controller-manager.conf"] = kube.Kubeconfig(local, pkiDir+"/ca.crt", pkiDir+"/controller-manager.crt", pkiDir+"/controller-manager.key", "system:kube-controller-manager")
		confs["scheduler.conf"] = kube.Kubeconfig(local, pkiDir+"/ca.crt", pkiDir+"/scheduler.crt", pkiDir+"/scheduler.key", "system:kube-scheduler")
	}
	for name, c := range confs {
		if err := os.WriteFile(m.fsPath("etc/kubernetes/"+name), []byte(c), 0o600); err != nil {
			return err
		}
	}
	if err := os.WriteFile(m.fsPath("var/lib/kubelet/config.yaml"), []byte(fmt.Sprintf(kubeletConfigCommon, m.Address)+fmt.Sprintf(kubeletConfigStandIn, criEndpoint)), 0o644); err != nil {
		return err
	}
	labels := "kubelift.io/sandbox=true"
	if m.Role == "worker" {
		labels += ",kubelift.io/pool=blue"
	}
	flags := fmt.Sprintf("KUBELET_ARGS=\"--hostname-override=%s --node-ip=%s --volume-plugin-dir=/var/lib/kubelet/volume-plugins --node-labels=%s --v=3\"\n",
		m.Name, m.Address, labels)
	if err := os.WriteFile(m.fsPath("var/lib/kubelet/kubelet-flags.env"), []byte(flags), 0o644); err != nil {
		return err
	}
	if err := writeUnit(m, "kubelet.service", kubeletUnit, true); err != nil {
		return err
	}
	if err := writeUnit(m, "kube-proxy.service", kubeProxyUnit, true); err != nil {
		return err
	}
	if m.Role != "control-plane" {
		return nil
	}
	if err := s.etcdFiles(m); err != nil {
		return err
	}
	leader := fmt.Sprint(s.controlPlanes() > 1)
	if err := writeUnit(m, "kube-apiserver.service", fmt.Sprintf(apiserverUnit, m.Address, s.etcdServers(m), s.apiserverExtraFlags()), true); err != nil {
		return err
	}
	if err := writeUnit(m, "kube-controller-manager.service", fmt.Sprintf(controllerManagerUnit, m.Address, leader, NodeMonitorGracePeriod), true); err != nil {
		return err
	}
	return writeUnit(m, "kube-scheduler.service", fmt.Sprintf(schedulerUnit, m.Address, leader), true)
}

func (s *State) controlPlanes() int {
	n := 0
	for _, m := range s.Machines {
		if m.Role == "control-plane" {
			n++
		}
	}
	return n
}

// apiserverExtraFlags are the binary API servers' flags beyond the unit's
// own: Config.APIServerFeatureGates.
func (s *State) apiserverExtraFlags() string {
	if s.APIServerFeatureGates == "" {
		return ""
	}
	return " --feature-gates=" + s.APIServerFeatureGates
}
