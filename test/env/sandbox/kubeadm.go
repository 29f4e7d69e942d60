package sandbox

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/test/env/images"
	"github.com/kubelift/kubelift/test/env/kube"
)

// A kubeadm sandbox (Config.Kubeadm) is built the way kubeadm's users
// build theirs: every node gets the kubelet, kubeadm, kubectl and
// kubeadm's kubelet unit, the container runtime and nothing else; the
// control plane's images (built here) are pushed to the private registry
// the cluster's imageRepository names; `kubeadm init` runs on cp-1 and
// `kubeadm join` on the other nodes, each from a config file kept in the
// node's /etc/kubernetes. The control plane and etcd are then static pods,
// kube-proxy a DaemonSet and CoreDNS a Deployment, as kubeadm installs
// them. Per node, what the cluster-wide kubelet configuration cannot say
// (the node's cgroup root and address) is a kubeadm patch in
// /etc/kubernetes/patches, which `kubeadm upgrade node --patches` needs
// again.

// The versions of what kubeadm runs beside Kubernetes, as kubeadm 1.30
// and 1.31 name them (cmd/kubeadm/app/constants): etcd 3.5.15-0 and
// CoreDNS v1.11.3 for both; pause 3.9 for 1.30 and 3.10 for 1.31.
const (
	EtcdVersion    = "v3.5.15"
	EtcdTag        = "3.5.15-0"
	CoreDNSVersion = "v1.11.3"
)

// KubeadmImageNamespace is where, below the private registry, the
// cluster's imageRepository points: where `upgrade import --namespace
// library` puts a bundle's images, so that kubeadm finds the next
// version's there (REGISTRY/library/coredns:TAG, the flat CoreDNS path
// kubeadm uses with a custom repository).
const KubeadmImageNamespace = "library"

// ImageRepository is the kubeadm cluster's imageRepository.
func (s *State) ImageRepository() string { return s.Registry.Address + "/" + KubeadmImageNamespace }

// kubeadmKubeletUnit is kubeadm's kubelet.service with its drop-in
// (10-kubeadm.conf) folded in, the program in /usr/local/bin.
const kubeadmKubeletUnit = `[Unit]
Description=kubelet: The Kubernetes Node Agent
After=containerd.service

[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=/usr/local/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`

// kubeadmKubeletConfig is the cluster-wide kubelet configuration kubeadm
// uploads (kubelet-config ConfigMap): the sandbox's choices of
// kubeletConfigCommon and kubeletConfigContainerd but for the per-node
// address and cgroup root, which are patches.
const kubeadmKubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
readOnlyPort: 0
podLogsDir: /var/log/pods
syncFrequency: 10s
nodeStatusUpdateFrequency: 4s
failSwapOn: false
cgroupDriver: cgroupfs
failCgroupV1: false
containerRuntimeEndpoint: ` + containerdEndpoint + `
cgroupsPerQOS: true
imageGCHighThresholdPercent: 100
evictionHard: {nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%", memory.available: "100Mi"}
`

// kubeadmProxyConfig is kube-proxy's configuration as kubeadm deploys it
// (the kube-proxy ConfigMap), with the sandbox's choices (kubeProxyConfig).
const kubeadmProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: ` + ClusterCIDR + `
iptables:
  minSyncPeriod: 1s
conntrack:
  maxPerCore: 0
metricsBindAddress: 127.0.0.1:10249
`

// nodeRegistration is the part of kubeadm's init and join configurations
// that names the node and the kubelet's own flags.
func (s *State) nodeRegistration(m *Machine) string {
	labels := "kubelift.io/sandbox=true"
	if m.Role == "worker" {
		labels += ",kubelift.io/pool=blue"
	}
	return fmt.Sprintf(`nodeRegistration:
  name: %s
  criSocket: %s
  imagePullPolicy: IfNotPresent
  kubeletExtraArgs:
    node-ip: %s
    node-labels: %s
    volume-plugin-dir: /var/lib/kubelet/volume-plugins
    v: "3"
  ignorePreflightErrors: [all]
patches:
  directory: /etc/kubernetes/patches
`, m.Name, containerdEndpoint, m.Address, labels)
}

// kubeadmInitConfig is cp-1's /etc/kubernetes/kubeadm-init.yaml.
// certKey encrypts the certificates `init --upload-certs` shares with
// the control planes that join (kubeadm-certs, for two hours).
func (s *State) kubeadmInitConfig(m *Machine, token, certKey string) string {
	return fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta3
kind: InitConfiguration
bootstrapTokens:
- token: %[1]s
  ttl: 24h0m0s
certificateKey: %[8]s
localAPIEndpoint:
  advertiseAddress: %[2]s
  bindPort: 6443
%[3]s---
apiVersion: kubeadm.k8s.io/v1beta3
kind: ClusterConfiguration
kubernetesVersion: %[4]s
clusterName: kubelift-sandbox
controlPlaneEndpoint: %[9]s
imageRepository: %[5]s
etcd:
  local:
    # Pinned, as air-gapped clusters often pin it: the sandbox builds one
    # etcd (EtcdVersion), and kubeadm keeps a pinned tag across upgrades,
    # so a patch release whose kubeadm names a newer etcd (v1.31.14:
    # 3.5.24-0) leaves etcd as it is; kubelift's plan follows the pin.
    imageTag: %[10]s
networking:
  serviceSubnet: 10.96.0.0/16
  dnsDomain: cluster.local
apiServer:
  extraArgs:
    disable-admission-plugins: DefaultTolerationSeconds
    kubelet-preferred-address-types: InternalIP
controllerManager:
  # node-monitor-grace-period: 2 minutes, not the binary sandbox's 20 s
  # (which its eviction stories need) nor kubeadm's 40 s: a kubeadm
  # control plane (three of them, with their etcd members, in the HA
  # sandbox) on a loaded 2-core machine stalls for longer than a real
  # one (fresh-clone runs saw every node marked NotReady at once, 40 s
  # after the heartbeats stalled, and the shop's Service lose its
  # endpoints for seconds), and a NotReady node's pods leave their
  # Services.
  extraArgs:
    node-monitor-grace-period: 2m0s
    flex-volume-plugin-dir: /var/lib/kubelet/volume-plugins
---
%[6]s---
%[7]s`, token, m.Address, s.nodeRegistration(m), s.OldVersion, s.ImageRepository(), kubeadmKubeletConfig, kubeadmProxyConfig, certKey, s.controlPlaneEndpoint(), EtcdTag)
}

// kubeadmJoinConfig is a joining node's /etc/kubernetes/kubeadm-join.yaml:
// a control-plane node joins as one (its own API server and a member of
// the stacked etcd), with the certificates cp-1 shared under certKey.
func (s *State) kubeadmJoinConfig(m *Machine, token, caHash, certKey string) string {
	controlPlane := ""
	if m.Role == "control-plane" {
		controlPlane = fmt.Sprintf(`controlPlane:
  localAPIEndpoint:
    advertiseAddress: %s
    bindPort: 6443
  certificateKey: %s
`, m.Address, certKey)
	}
	return fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta3
kind: JoinConfiguration
discovery:
  bootstrapToken:
    apiServerEndpoint: %s
    token: %s
    caCertHashes: [%q]
%s%s`, s.controlPlaneEndpoint(), token, caHash, controlPlane, s.nodeRegistration(m))
}

// kubeadmNodeFiles gives node m what kubeadm's packages and the operator
// put there before `kubeadm init` or `join`: the programs, kubeadm's
// kubelet unit, the per-node kubelet patch, the config file, and on cp-1
// the cluster's CA (kubeadm keeps an existing CA).
func (s *State) kubeadmNodeFiles(m *Machine, caCert, caKey []byte, token, certKey string) error {
	for _, d := range []string{"etc/kubernetes/pki", "etc/kubernetes/manifests", "etc/kubernetes/patches", "var/lib/kubelet", "var/log/pods", "usr/lib/modules"} {
		if err := os.MkdirAll(m.fsPath(d), 0o755); err != nil {
			return err
		}
	}
	for _, b := range []string{"kubelet", "kubeadm", "kubectl"} {
		if err := copyFile(filepath.Join(s.Binaries.Old, b), m.fsPath("usr/local/bin/"+b), 0o755); err != nil {
			return err
		}
	}
	patch := fmt.Sprintf("address: %s\ncgroupRoot: %s\n", m.Address, s.CgroupRoot(*m))
	if err := os.WriteFile(m.fsPath("etc/kubernetes/patches/kubeletconfiguration+merge.yaml"), []byte(patch), 0o644); err != nil {
		return err
	}
	cp1 := s.Nodes()[0]
	if m.Name == cp1.Name {
		if err := os.WriteFile(m.fsPath(pkiDir+"/ca.crt"), caCert, 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(m.fsPath(pkiDir+"/ca.key"), caKey, 0o600); err != nil {
			return err
		}
		if err := os.WriteFile(m.fsPath("etc/kubernetes/kubeadm-init.yaml"), []byte(s.kubeadmInitConfig(m, token, certKey)), 0o600); err != nil {
			return err
		}
	} else {
		hash, err := caCertHash(caCert)
		if err != nil {
			return err
		}
		if err := os.WriteFile(m.fsPath("etc/kubernetes/kubeadm-join.yaml"), []byte(s.kubeadmJoinConfig(m, token, hash, certKey)), 0o600); err != nil {
			return err
		}
	}
	return writeUnit(m, "kubelet.service", kubeadmKubeletUnit, true)
}

// caCertHash is kubeadm's pin of a CA: sha256 of its public key info.
func caCertHash(certPEM []byte) (string, error) {
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return "", fmt.Errorf("CA certificate: no PEM block")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// kubeadmImages builds the images kubeadm runs at version from the built
// binaries in bin, pause and CoreDNS and etcd included.
func kubeadmImages(ctx context.Context, bin, version string, pause v1.Image) (map[string]v1.Image, error) {
	etcd, err := kube.Addon(ctx, "etcd", EtcdVersion)
	if err != nil {
		return nil, err
	}
	coredns, err := kube.Addon(ctx, "coredns", CoreDNSVersion)
	if err != nil {
		return nil, err
	}
	set, err := images.KubeadmImages(images.KubeadmSources{Kubernetes: bin, Version: version, Etcd: etcd, EtcdTag: EtcdTag, CoreDNS: coredns, CoreDNSTag: CoreDNSVersion})
	if err != nil {
		return nil, err
	}
	set["pause:"+kubeadmPause(version)] = pause
	return set, nil
}

// kubeadmPause is the pause tag kubeadm at version names.
func kubeadmPause(version string) string {
	if strings.HasPrefix(version, "v1.30.") {
		return "3.9"
	}
	return images.PauseTag
}

// pushKubeadmImages pushes the old version's images to where the
// cluster's imageRepository points, as the installer of an air-gapped
// kubeadm cluster does before `kubeadm init` (flat paths:
// REGISTRY/library/coredns:TAG).
func (s *State) pushKubeadmImages(ctx context.Context, pause v1.Image) error {
	set, err := kubeadmImages(ctx, s.Binaries.Old, s.OldVersion, pause)
	if err != nil {
		return err
	}
	opts, err := s.RegistryOptions(ctx)
	if err != nil {
		return err
	}
	for repoTag, img := range set {
		flat := repoTag[strings.LastIndex(repoTag, "/")+1:]
		ref, err := parseRef(s.ImageRepository() + "/" + flat)
		if err != nil {
			return err
		}
		if err := remote.Write(ref, img, opts...); err != nil {
			return fmt.Errorf("push %s: %w", ref, err)
		}
	}
	return nil
}

// kubeadmUp runs `kubeadm init` on cp-1, then `kubeadm join` on every
// other node, each inside its machine as an operator's root shell would,
// its output in machines/NODE.kubeadm.log.
func (s *State) kubeadmUp(ctx context.Context, log func(string, ...any)) error {
	nodes := s.Nodes()
	for i, m := range nodes {
		args := []string{"init", "--config", "/etc/kubernetes/kubeadm-init.yaml", "--upload-certs", "--skip-token-print", "--v=1"}
		if i > 0 {
			args = []string{"join", "--config", "/etc/kubernetes/kubeadm-join.yaml", "--v=1"}
		}
		start := time.Now()
		if err := s.kubeadm(ctx, m, 6*time.Minute, args...); err != nil {
			return err
		}
		log("kubeadm %s on %s (%s)", args[0], m.Name, time.Since(start).Round(time.Second))
	}
	return nil
}

// kubeadm runs kubeadm on machine m with a time limit, its output in
// machines/NAME.kubeadm.log (appended); an error carries the output's tail.
func (s *State) kubeadm(ctx context.Context, m Machine, limit time.Duration, args ...string) error {
	logPath := filepath.Join(s.Dir, "machines", m.Name+".kubeadm.log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	fmt.Fprintf(f, "\n$ kubeadm %s\n", strings.Join(args, " "))
	cmd := s.Command(m, "/usr/local/bin/kubeadm", args...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		err = fmt.Errorf("%w after %s", ctx.Err(), limit)
		<-done
	}
	if err != nil {
		data, _ := os.ReadFile(logPath)
		if len(data) > 3000 {
			data = data[len(data)-3000:]
		}
		return fmt.Errorf("kubeadm %s on %s: %v\n%s\n--- kubelet log tail:\n%s", args[0], m.Name, err, data, s.UnitLog(m, "kubelet", 2000))
	}
	return nil
}

// waitAddons waits until kubeadm's addons run: every kube-proxy pod and
// every CoreDNS replica available (a CoreDNS pod that started before
// kube-proxy wrote its rules retries its first list after 30 s).
func (s *State) waitAddons(ctx context.Context) error {
	client, err := s.Client()
	if err != nil {
		return err
	}
	var last string
	err = poll(ctx, 3*time.Minute, func() (bool, error) {
		ds, err := client.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		dep, err := client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("kube-proxy %d of %d available, coredns %d of %d", ds.Status.NumberAvailable, ds.Status.DesiredNumberScheduled, dep.Status.AvailableReplicas, dep.Status.Replicas)
		return ds.Status.DesiredNumberScheduled == int32(len(s.Nodes())) && ds.Status.NumberAvailable == ds.Status.DesiredNumberScheduled &&
			dep.Status.Replicas > 0 && dep.Status.AvailableReplicas == dep.Status.Replicas, nil
	})
	if err != nil {
		return fmt.Errorf("kubeadm's addons (last: %s): %w", last, err)
	}
	return nil
}
