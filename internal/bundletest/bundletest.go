// Package bundletest builds the outside world for kubelift's unit tests: an
// in-memory registry (go-containerregistry's, over httptest) holding
// images that share a base layer, one of them a multi-arch index, a file
// server publishing checksums, and a catalog naming them.
package bundletest

import (
	"crypto/sha256"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubelift/kubelift/internal/catalog"
)

// World is a source registry, a file server and a catalog naming them.
type World struct {
	// Registry is the in-memory registry's host:port.
	Registry string
	// Files is the file server's URL.
	Files string
	// Digests maps each image reference to its upstream digest.
	Digests map[string]string
	Catalog *catalog.Catalog

	mu   sync.Mutex
	hits map[string]int
}

// Version is the Kubernetes version in the test catalog.
const Version = "v1.31.4"

// HopVersion is the release of the minor before Version in the test
// catalog: the hop of a bundle made --from v1.29.
const HopVersion = "v1.30.14"

// New starts the servers (stopped when the test ends).
func New(t *testing.T) *World {
	t.Helper()
	regSrv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(regSrv.Close)
	u, _ := url.Parse(regSrv.URL)
	w := &World{Registry: u.Host, Digests: map[string]string{}, hits: map[string]int{}}

	base, err := random.Layer(4096, types.DockerLayer)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(arch string) v1.Image {
		top, _ := random.Layer(2048, types.DockerLayer)
		img, err := mutate.AppendLayers(empty.Image, base, top)
		if err != nil {
			t.Fatal(err)
		}
		cf, _ := img.ConfigFile()
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", arch
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			t.Fatal(err)
		}
		return img
	}
	push := func(ref string, img v1.Image) {
		r, _ := name.ParseReference(ref)
		if err := remote.Write(r, img); err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		w.Digests[ref] = d.String()
	}
	push(w.Registry+"/kube-apiserver:"+Version, mk("amd64"))
	push(w.Registry+"/kube-apiserver:"+HopVersion, mk("amd64"))
	push(w.Registry+"/kube-proxy:"+Version, mk("amd64"))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: mk("amd64"), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: mk("arm64"), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: mk("s390x"), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "s390x"}}},
	)
	r, _ := name.ParseReference(w.Registry + "/coredns/coredns:v1.11.3")
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatal(err)
	}
	d, _ := idx.Digest()
	w.Digests[w.Registry+"/coredns/coredns:v1.11.3"] = d.String()

	content := map[string]string{"/v1.31.4/amd64/kubelet": "kubelet amd64 binary", "/v1.31.4/amd64/kubeadm": "kubeadm amd64 binary",
		"/v1.31.4/arm64/kubelet": "kubelet arm64 binary", "/v1.31.4/arm64/kubeadm": "kubeadm arm64 binary", "/extra/tool": "extra tool",
		"/v1.30.14/amd64/kubeadm": "kubeadm v1.30.14 amd64", "/v1.30.14/amd64/kube-apiserver": "kube-apiserver v1.30.14 amd64",
		"/v1.30.14/amd64/kubelet":                                "kubelet v1.30.14 amd64 (never bundled as a hop)",
		"/containerd/v2.3.7/containerd-2.3.7-linux-amd64.tar.gz": "containerd v2.3.7 amd64 archive", "/runc/v1.5.2/runc.amd64": "runc v1.5.2 amd64",
		"/etcd/v3.5.15/etcd-v3.5.15-linux-amd64.tar.gz": "etcd v3.5.15 amd64 archive", "/etcd/v3.6.16/etcd-v3.6.16-linux-amd64.tar.gz": "etcd v3.6.16 amd64 archive"}
	files := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if b, ok := strings.CutSuffix(p, ".sha256"); ok {
			if c, ok := content[b]; ok {
				fmt.Fprintf(rw, "%x  %s\n", sha256.Sum256([]byte(c)), filepath.Base(b))
				return
			}
		}
		c, ok := content[p]
		if !ok {
			http.NotFound(rw, r)
			return
		}
		w.mu.Lock()
		w.hits[p]++
		w.mu.Unlock()
		io.WriteString(rw, c)
	}))
	t.Cleanup(files.Close)
	w.Files = files.URL

	cat := fmt.Sprintf(`schemaVersion: 1
arches: [amd64, arm64]
kubeletHashEras: [{era: name-image, from: v1.28.0}]
versions:
  - version: v1.30.14
    kubeletHashEra: name-image
    upgradeFrom: [v1.29]
    downgradeTo: []
    removedKubeletFlags: []
    removedAPIs: []
    images:
      - %[1]s/kube-apiserver:v1.30.14
      - %[1]s/coredns/coredns:v1.11.3
    files:
      - name: kubelet
        url: %[2]s/v1.30.14/{arch}/kubelet
      - name: kubeadm
        url: %[2]s/v1.30.14/{arch}/kubeadm
      - name: kube-apiserver
        url: %[2]s/v1.30.14/{arch}/kube-apiserver
  - version: v1.31.4
    kubeletHashEra: name-image
    upgradeFrom: [v1.30]
    downgradeTo: []
    removedKubeletFlags: []
    removedAPIs: []
    images:
      - %[1]s/kube-apiserver:v1.31.4
      - %[1]s/kube-proxy:v1.31.4
      - %[1]s/coredns/coredns:v1.11.3
    files:
      - name: kubelet
        url: %[2]s/v1.31.4/{arch}/kubelet
      - name: kubeadm
        url: %[2]s/v1.31.4/{arch}/kubeadm
    nodeStack:
      - name: containerd
        version: v2.3.7
        url: %[2]s/containerd/v2.3.7/containerd-2.3.7-linux-{arch}.tar.gz
      - name: runc
        version: v1.5.2
        url: %[2]s/runc/v1.5.2/runc.{arch}
      - name: etcd
        version: v3.5.15
        url: %[2]s/etcd/v3.5.15/etcd-v3.5.15-linux-{arch}.tar.gz
`, w.Registry, w.Files)
	if w.Catalog, err = catalog.Parse("test-catalog.yaml", []byte(cat)); err != nil {
		t.Fatal(err)
	}
	return w
}

// Hits returns how often a file server path was downloaded.
func (w *World) Hits(path string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hits[path]
}
