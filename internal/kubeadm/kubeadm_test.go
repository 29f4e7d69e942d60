package kubeadm

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/kubelift/kubelift/internal/catalog"
)

const sandboxDoc = `apiServer:
  extraArgs:
    disable-admission-plugins: DefaultTolerationSeconds
apiVersion: kubeadm.k8s.io/v1beta3
certificatesDir: /etc/kubernetes/pki
clusterName: kubelift-sandbox
dns: {}
etcd:
  local:
    dataDir: /var/lib/etcd
imageRepository: 10.78.0.1:5000/library
kind: ClusterConfiguration
kubernetesVersion: v1.30.14
`

func release(t *testing.T) *catalog.Release {
	t.Helper()
	c, err := catalog.Default()
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Lookup("v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParse(t *testing.T) {
	c, err := Parse([]byte(sandboxDoc))
	if err != nil {
		t.Fatal(err)
	}
	if c.KubernetesVersion.String() != "v1.30.14" || c.ImageRepository != "10.78.0.1:5000/library" || !c.LocalEtcd || c.EtcdDataDir != "/var/lib/etcd" {
		t.Fatalf("parsed %+v", c)
	}
}

func TestReadKubeletConfig(t *testing.T) {
	cm := func(name, key, doc string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ConfigNamespace, Name: name}, Data: map[string]string{key: doc}}
	}
	cluster := cm(ConfigMapName, ClusterConfigKey, sandboxDoc)
	for _, tc := range []struct {
		name, doc string
		want      string // "" not set, "true", "false", or "error: ..."
	}{
		{"false", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n", "false"},
		{"not set", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n", ""},
		{"not a bool", "kind: KubeletConfiguration\nfailCgroupV1: sometimes\n", "error: configmap kube-system/kubelet-config: kubelet:"},
		{"other kind", "kind: KubeProxyConfiguration\n", `error: configmap kube-system/kubelet-config: kubelet: kind "KubeProxyConfiguration"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Read(context.Background(), fake.NewClientset(cluster, cm(KubeletConfigMapName, KubeletConfigKey, tc.doc)))
			if msg, isErr := strings.CutPrefix(tc.want, "error: "); isErr {
				if err == nil || !strings.Contains(err.Error(), msg) {
					t.Fatalf("err = %v, want %q", err, msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if c.KubeletFailCgroupV1 != nil {
				got = map[bool]string{true: "true", false: "false"}[*c.KubeletFailCgroupV1]
			}
			if got != tc.want {
				t.Errorf("failCgroupV1 = %q, want %q", got, tc.want)
			}
		})
	}
	c, err := Read(context.Background(), fake.NewClientset(cluster))
	if err != nil || c.KubeletFailCgroupV1 != nil {
		t.Errorf("without kubelet-config: %+v, %v", c, err)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ name, from, to, want string }{
		{"version", "kubernetesVersion: v1.30.14", "kubernetesVersion: v1.30.14; rm -rf /", "kubernetesVersion"},
		{"repository", "imageRepository: 10.78.0.1:5000/library", "imageRepository: 'evil repo/$(x)'", "imageRepository"},
		{"data dir", "dataDir: /var/lib/etcd", "dataDir: ../etcd", "etcd.local.dataDir"},
		{"etcd tag", "dataDir: /var/lib/etcd", "dataDir: /var/lib/etcd\n    imageTag: '3.5.9;x'", "etcd.local.imageTag"},
		{"etcd repository", "dataDir: /var/lib/etcd", "dataDir: /var/lib/etcd\n    imageRepository: 'a b'", "etcd.local.imageRepository"},
		{"dns tag", "dns: {}", "dns: {imageTag: '-v1'}", "dns.imageTag"},
		{"kind", "kind: ClusterConfiguration", "kind: InitConfiguration", "not a kubeadm ClusterConfiguration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(strings.Replace(sandboxDoc, tc.from, tc.to, 1)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func TestImages(t *testing.T) {
	rel := release(t)
	want := func(c *Config) map[string]string {
		imgs, err := c.Images(rel)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, im := range imgs {
			out[im.Upstream] = im.Want
		}
		return out
	}
	custom := want(&Config{ImageRepository: "reg:5000/library", LocalEtcd: true})
	for up, w := range map[string]string{
		"registry.k8s.io/kube-apiserver:v1.31.4":          "reg:5000/library/kube-apiserver:v1.31.4",
		"registry.k8s.io/coredns/coredns:v1.11.3":         "reg:5000/library/coredns:v1.11.3", // the flat path of a custom repository
		"registry.k8s.io/etcd:3.5.15-0":                   "reg:5000/library/etcd:3.5.15-0",
		"registry.k8s.io/pause:3.10":                      "reg:5000/library/pause:3.10",
		"registry.k8s.io/kube-proxy:v1.31.4":              "reg:5000/library/kube-proxy:v1.31.4",
		"registry.k8s.io/kube-scheduler:v1.31.4":          "reg:5000/library/kube-scheduler:v1.31.4",
		"registry.k8s.io/kube-controller-manager:v1.31.4": "reg:5000/library/kube-controller-manager:v1.31.4",
	} {
		if custom[up] != w {
			t.Errorf("%s: kubeadm asks for %q, want %q", up, custom[up], w)
		}
	}
	if len(custom) != len(rel.Images) {
		t.Errorf("%d images, want the release's %d", len(custom), len(rel.Images))
	}
	if got := want(&Config{ImageRepository: DefaultImageRepository, LocalEtcd: true})["registry.k8s.io/coredns/coredns:v1.11.3"]; got != "registry.k8s.io/coredns/coredns:v1.11.3" {
		t.Errorf("default repository: coredns %q", got)
	}
	if got := want(&Config{ImageRepository: "r/x", DNSImageRepository: "r/x/coredns", LocalEtcd: true})["registry.k8s.io/coredns/coredns:v1.11.3"]; got != "r/x/coredns/coredns:v1.11.3" {
		t.Errorf("dns.imageRepository: coredns %q", got)
	}
	if _, ok := want(&Config{ImageRepository: "r/x"})["registry.k8s.io/etcd:3.5.15-0"]; ok {
		t.Error("external etcd: kubeadm pulls no etcd image")
	}
	// Pins, as kubeadm's GetEtcdImage and GetDNSImage read them.
	imgs, err := (&Config{ImageRepository: "r/x", LocalEtcd: true, EtcdImageRepository: "r/etcd-mirror", EtcdImageTag: "3.5.9-0", DNSImageTag: "v1.11.1"}).Images(rel)
	if err != nil {
		t.Fatal(err)
	}
	pinned := map[string]string{}
	for _, im := range imgs {
		if im.PinnedBy != "" {
			pinned[im.Want] = im.PinnedBy
		}
	}
	if len(pinned) != 2 || pinned["r/etcd-mirror/etcd:3.5.9-0"] != "etcd.local.imageTag" || pinned["r/x/coredns:v1.11.1"] != "dns.imageTag" {
		t.Errorf("pinned images %v", pinned)
	}
}

// A ClusterConfiguration's pins are read.
func TestParsePins(t *testing.T) {
	doc := strings.Replace(strings.Replace(sandboxDoc, "dataDir: /var/lib/etcd", "dataDir: /var/lib/etcd\n    imageRepository: r/etcd\n    imageTag: 3.5.9-0", 1), "dns: {}", "dns: {imageTag: v1.11.1}", 1)
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if c.EtcdImageRepository != "r/etcd" || c.EtcdImageTag != "3.5.9-0" || c.DNSImageTag != "v1.11.1" {
		t.Errorf("parsed %+v", c)
	}
}

// An UpgradeConfiguration is passed on as is when it is one, in
// v1beta4, and leaves the version and dry run to kubelift.
func TestParseUpgradeConfig(t *testing.T) {
	const good = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: UpgradeConfiguration\ntimeouts:\n  upgradeManifests: 90s\n"
	c, err := ParseUpgradeConfig("f.yaml", []byte(good), "v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	if string(c.Data) != good || len(c.Sum) != 64 {
		t.Errorf("config %+v", c)
	}
	// A node without patches gets the file as it is; one with them, the
	// patches directory in both sections (kubeadm refuses --patches beside
	// --config), unless the file names one.
	data, at, err := c.ForNode("/d", false)
	if err != nil || string(data) != good || at != "/d/upgrade-config-"+c.Sum[:16]+".yaml" {
		t.Errorf("without patches: %q at %s, %v", data, at, err)
	}
	data, at2, err := c.ForNode("/d", true)
	if err != nil || at2 == at || !strings.HasPrefix(at2, "/d/upgrade-config-") {
		t.Fatalf("with patches: at %s, %v", at2, err)
	}
	var doc struct {
		Kind     string
		Timeouts struct{ UpgradeManifests string }
		Apply    struct{ Patches struct{ Directory string } }
		Node     struct{ Patches struct{ Directory string } }
	}
	if err := yaml.Unmarshal(data, &doc); err != nil || doc.Kind != "UpgradeConfiguration" || doc.Timeouts.UpgradeManifests != "90s" ||
		doc.Apply.Patches.Directory != PatchesDir || doc.Node.Patches.Directory != PatchesDir {
		t.Errorf("with patches: %s (%v)", data, err)
	}
	own, err := ParseUpgradeConfig("f.yaml", []byte(good+"node:\n  patches:\n    directory: /srv/p\n"), "v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	if data, _, _ := own.ForNode("/d", true); !strings.Contains(string(data), "directory: /srv/p") || !strings.Contains(string(data), "directory: "+PatchesDir) {
		t.Errorf("the file's own patches directory: %s", data)
	}
	for _, tc := range []struct{ name, doc, want string }{
		{"an older API", "apiVersion: kubeadm.k8s.io/v1beta3\nkind: UpgradeConfiguration\n", "want kind UpgradeConfiguration, apiVersion kubeadm.k8s.io/v1beta4"},
		{"another kind", "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n", `kind "ClusterConfiguration"`},
		{"two documents", good + "---\n" + good, "more than one YAML document"},
		{"another version", good + "apply:\n  kubernetesVersion: v1.32.0\n", `apply.kubernetesVersion "v1.32.0"`},
		{"a dry run", good + "node:\n  dryRun: true\n", "dryRun: true"},
		{"not YAML", "kind: [", "f.yaml"},
		{"too big", good + "#" + strings.Repeat("x", MaxUpgradeConfigSize), "over 65536"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseUpgradeConfig("f.yaml", []byte(tc.doc), "v1.31.4")
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "f.yaml") {
				t.Fatalf("err = %v, want one naming f.yaml and %q", err, tc.want)
			}
		})
	}
}
