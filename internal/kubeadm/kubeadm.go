// Package kubeadm is what kubelift knows of clusters kubeadm built: it
// reads the cluster's ClusterConfiguration from the kubeadm-config
// ConfigMap and what of the kubelets' configuration kubelift checks from
// kubelet-config (refusing what does not parse), names the images `kubeadm
// upgrade` will pull for a release under the cluster's imageRepository
// (as kubeadm's own images.go does, CoreDNS's path included), says the
// kubeadm commands an upgrade runs on each node, reads the static pod
// manifests kubeadm writes and keeps (manifest.go), and puts back what
// `kubeadm upgrade apply` changed in the cluster when it is rolled back.
package kubeadm

import (
	"context"
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kubelift/kubelift/internal/catalog"
)

// Where kubeadm keeps the cluster's configuration.
const (
	ConfigNamespace = "kube-system"
	ConfigMapName   = "kubeadm-config"
	// ClusterConfigKey is the ConfigMap's key holding the
	// ClusterConfiguration document.
	ClusterConfigKey = "ClusterConfiguration"
	// KubeletConfigMapName holds the KubeletConfiguration (key
	// KubeletConfigKey) that `kubeadm upgrade node` writes to each node's
	// /var/lib/kubelet/config.yaml.
	KubeletConfigMapName = "kubelet-config"
	KubeletConfigKey     = "kubelet"
)

// Paths kubeadm uses on a node.
const (
	// ManifestDir holds the static pods of the control plane and etcd.
	ManifestDir = "/etc/kubernetes/manifests"
	// PatchesDir is where kubeadm's documentation keeps --patches files;
	// kubelift passes it to every `kubeadm upgrade` when the node has it
	// (kubeadm does not remember the directory init or join used).
	PatchesDir = "/etc/kubernetes/patches"
	// TmpDir is where kubeadm keeps what an upgrade replaced on the node:
	// the static pod manifests it moved aside, in
	// BackupManifestsPrefix+TIME (one directory per run), and etcd's data
	// in kubeadm-backup-etcd-TIME when it upgraded etcd.
	TmpDir                = "/etc/kubernetes/tmp"
	BackupManifestsPrefix = "kubeadm-backup-manifests-"
	// DefaultEtcdDataDir and DefaultCertDir are kubeadm's defaults.
	DefaultEtcdDataDir = "/var/lib/etcd"
	DefaultCertDir     = "/etc/kubernetes/pki"
)

// DefaultImageRepository is kubeadm's imageRepository when none is set.
const DefaultImageRepository = "registry.k8s.io"

// Config is what kubelift reads of a cluster's ClusterConfiguration,
// each value parsed.
type Config struct {
	// KubernetesVersion is the version kubeadm last set up or upgraded to.
	KubernetesVersion catalog.Version
	// ImageRepository is where kubeadm pulls the control plane from.
	ImageRepository string
	// DNSImageRepository overrides it for CoreDNS ("" when not set), and
	// DNSImageTag the tag (dns.imageTag).
	DNSImageRepository string
	DNSImageTag        string
	// LocalEtcd says etcd is a static pod kubeadm manages; EtcdDataDir is
	// its data directory. EtcdImageRepository and EtcdImageTag override
	// where its image comes from (etcd.local.imageRepository, imageTag):
	// a pinned tag stays across kubeadm upgrades.
	LocalEtcd           bool
	EtcdDataDir         string
	EtcdImageRepository string
	EtcdImageTag        string
	// CertificatesDir holds the cluster's PKI (etcd's under etcd/).
	CertificatesDir string
	// KubeletFailCgroupV1 is failCgroupV1 in the kubelet-config
	// ConfigMap: nil when it is not set there (or there is no such
	// ConfigMap).
	KubeletFailCgroupV1 *bool
}

// clusterConfiguration is the part of kubeadm's ClusterConfiguration
// (v1beta3 and v1beta4 alike) kubelift reads.
type clusterConfiguration struct {
	APIVersion        string `json:"apiVersion"`
	Kind              string `json:"kind"`
	KubernetesVersion string `json:"kubernetesVersion"`
	ImageRepository   string `json:"imageRepository"`
	CertificatesDir   string `json:"certificatesDir"`
	DNS               struct {
		ImageRepository string `json:"imageRepository"`
		ImageTag        string `json:"imageTag"`
	} `json:"dns"`
	Etcd struct {
		Local *struct {
			DataDir         string `json:"dataDir"`
			ImageRepository string `json:"imageRepository"`
			ImageTag        string `json:"imageTag"`
		} `json:"local"`
		External *struct{} `json:"external"`
	} `json:"etcd"`
}

// Read reads the cluster's kubeadm configuration; (nil, nil) when the
// cluster has no kubeadm-config ConfigMap (kubeadm did not build it).
func Read(ctx context.Context, c kubernetes.Interface) (*Config, error) {
	cm, err := c.CoreV1().ConfigMaps(ConfigNamespace).Get(ctx, ConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read configmap %s/%s: %w", ConfigNamespace, ConfigMapName, err)
	}
	doc, ok := cm.Data[ClusterConfigKey]
	if !ok {
		return nil, fmt.Errorf("configmap %s/%s has no %s", ConfigNamespace, ConfigMapName, ClusterConfigKey)
	}
	cfg, err := Parse([]byte(doc))
	if err != nil {
		return nil, fmt.Errorf("configmap %s/%s: %w", ConfigNamespace, ConfigMapName, err)
	}
	kcm, err := c.CoreV1().ConfigMaps(ConfigNamespace).Get(ctx, KubeletConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return cfg, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read configmap %s/%s: %w", ConfigNamespace, KubeletConfigMapName, err)
	}
	if cfg.KubeletFailCgroupV1, err = parseKubeletConfig([]byte(kcm.Data[KubeletConfigKey])); err != nil {
		return nil, fmt.Errorf("configmap %s/%s: %s: %w", ConfigNamespace, KubeletConfigMapName, KubeletConfigKey, err)
	}
	return cfg, nil
}

// parseKubeletConfig reads failCgroupV1 of a KubeletConfiguration.
func parseKubeletConfig(doc []byte) (*bool, error) {
	var kc struct {
		Kind         string `json:"kind"`
		FailCgroupV1 *bool  `json:"failCgroupV1"`
	}
	if err := yaml.Unmarshal(doc, &kc); err != nil {
		return nil, err
	}
	if kc.Kind != "KubeletConfiguration" {
		return nil, fmt.Errorf("kind %q: not a KubeletConfiguration", kc.Kind)
	}
	return kc.FailCgroupV1, nil
}

// Parse reads a ClusterConfiguration document; a field that does not
// parse is refused, named with its value.
func Parse(doc []byte) (*Config, error) {
	var cc clusterConfiguration
	if err := yaml.Unmarshal(doc, &cc); err != nil {
		return nil, fmt.Errorf("%s: %w", ClusterConfigKey, err)
	}
	if cc.Kind != "ClusterConfiguration" || !strings.HasPrefix(cc.APIVersion, "kubeadm.k8s.io/") {
		return nil, fmt.Errorf("%s: kind %q apiVersion %q: not a kubeadm ClusterConfiguration", ClusterConfigKey, cc.Kind, cc.APIVersion)
	}
	v, err := catalog.ParseReported(cc.KubernetesVersion)
	if err != nil {
		return nil, fmt.Errorf("%s kubernetesVersion: %w", ClusterConfigKey, err)
	}
	cfg := &Config{KubernetesVersion: v, ImageRepository: cc.ImageRepository, DNSImageRepository: cc.DNS.ImageRepository, DNSImageTag: cc.DNS.ImageTag,
		LocalEtcd: cc.Etcd.External == nil, EtcdDataDir: DefaultEtcdDataDir, CertificatesDir: DefaultCertDir}
	if cfg.ImageRepository == "" {
		cfg.ImageRepository = DefaultImageRepository
	}
	if l := cc.Etcd.Local; l != nil {
		if l.DataDir != "" {
			cfg.EtcdDataDir = l.DataDir
		}
		cfg.EtcdImageRepository, cfg.EtcdImageTag = l.ImageRepository, l.ImageTag
	}
	for field, repo := range map[string]string{"imageRepository": cfg.ImageRepository, "dns.imageRepository": cfg.DNSImageRepository, "etcd.local.imageRepository": cfg.EtcdImageRepository} {
		if repo == "" {
			continue
		}
		if _, err := name.NewRepository(repo+"/x", name.WeakValidation); err != nil {
			return nil, fmt.Errorf("%s %s %q: not a registry path: %w", ClusterConfigKey, field, repo, err)
		}
	}
	for field, tag := range map[string]string{"dns.imageTag": cfg.DNSImageTag, "etcd.local.imageTag": cfg.EtcdImageTag} {
		if tag != "" && !imageTagRE.MatchString(tag) {
			return nil, fmt.Errorf("%s %s %q: not an image tag", ClusterConfigKey, field, tag)
		}
	}
	if cc.CertificatesDir != "" {
		cfg.CertificatesDir = cc.CertificatesDir
	}
	for field, p := range map[string]string{"etcd.local.dataDir": cfg.EtcdDataDir, "certificatesDir": cfg.CertificatesDir} {
		if !path.IsAbs(p) || path.Clean(p) != p || strings.ContainsAny(p, "\n\x00") {
			return nil, fmt.Errorf("%s %s %q: not a clean absolute path", ClusterConfigKey, field, p)
		}
	}
	return cfg, nil
}

// imageTagRE is an image tag as the OCI distribution spec allows it.
var imageTagRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// Image is one image kubeadm pulls: the upstream reference a bundle
// carries and the name kubeadm asks the cluster's registry for.
// PinnedBy names the ClusterConfiguration field that pins its tag
// (etcd.local.imageTag, dns.imageTag): kubeadm then pulls that tag, not
// the bundle's, and the registry holds the user's image, not the
// bundle's.
type Image struct {
	Upstream string `json:"upstream"`
	Want     string `json:"want"`
	PinnedBy string `json:"pinnedBy,omitempty"`
}

// Images are the images `kubeadm upgrade apply` to a release pulls, as
// kubeadm names them under the cluster's repositories: each control-plane
// image, kube-proxy, etcd (when local) and pause as REPO/NAME:TAG, and
// CoreDNS as DNSREPO/coredns:TAG, or REPO/coredns:TAG with a custom
// repository, or registry.k8s.io/coredns/coredns:TAG with the default
// one (kubeadm's GetDNSImage). The tags are the release's catalog
// images', but where etcd.local.imageTag or dns.imageTag pins one (and
// etcd.local.imageRepository moves etcd's), as kubeadm's GetEtcdImage
// and GetDNSImage have it.
func (c *Config) Images(rel *catalog.Release) ([]Image, error) {
	var out []Image
	for _, ref := range rel.Images {
		up, err := name.NewTag(ref, name.WeakValidation)
		if err != nil {
			return nil, fmt.Errorf("catalog %s image %q: %w", rel.Version, ref, err)
		}
		base := path.Base(up.RepositoryStr())
		repo, tag, pinned := c.ImageRepository, up.TagStr(), ""
		switch {
		case base == "etcd" && !c.LocalEtcd:
			continue
		case base == "etcd":
			if c.EtcdImageRepository != "" {
				repo = c.EtcdImageRepository
			}
			if c.EtcdImageTag != "" {
				tag, pinned = c.EtcdImageTag, "etcd.local.imageTag"
			}
		case base == "coredns":
			switch {
			case c.DNSImageRepository != "":
				repo = c.DNSImageRepository
			case c.ImageRepository == DefaultImageRepository:
				repo = DefaultImageRepository + "/coredns"
			}
			if c.DNSImageTag != "" {
				tag, pinned = c.DNSImageTag, "dns.imageTag"
			}
		}
		out = append(out, Image{Upstream: ref, Want: repo + "/" + base + ":" + tag, PinnedBy: pinned})
	}
	return out, nil
}

// Commands of an upgrade, as kubelift runs them on a node with the
// target's kubeadm (ARGS after the program). patches passes --patches
// PatchesDir (the node has it and no --config says it: kubeadm refuses
// the flag beside --config); config, when not "", is the node's
// UpgradeConfiguration file (--config).

// ApplyArgs upgrades the first control-plane node: the control plane and
// etcd's static pods, the cluster's configuration, the kubelet's
// configuration, and the CoreDNS and kube-proxy addons.
func ApplyArgs(version string, patches bool, config string) []string {
	return withOptions([]string{"upgrade", "apply", version, "--yes"}, patches, config)
}

// NodeArgs upgrades any other node: its static pods on a control-plane
// node, and its kubelet's configuration.
func NodeArgs(patches bool, config string) []string {
	return withOptions([]string{"upgrade", "node"}, patches, config)
}

func withOptions(args []string, patches bool, config string) []string {
	if config != "" {
		return append(args, "--config", config)
	}
	if patches {
		args = append(args, "--patches", PatchesDir)
	}
	return args
}
