package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The images kubeadm runs a control plane from, built here from binaries
// built from the Go module proxy, in the shape of upstream's: each program
// at /usr/local/bin on PATH (kubeadm's manifests name the command, not a
// path), etcd and etcdctl likewise, CoreDNS at /coredns as its entrypoint,
// kube-proxy with the iptables it drives (the host's iptables-nft and the
// libraries it loads, as upstream's distroless-iptables image carries its
// own).

// KubeadmSources are the built binaries a version's images are made of.
type KubeadmSources struct {
	// Kubernetes holds kube-apiserver, kube-controller-manager,
	// kube-scheduler and kube-proxy at Version.
	Kubernetes, Version string
	// Etcd holds etcd and etcdctl; EtcdTag is kubeadm's tag for it
	// ("3.5.15-0").
	Etcd, EtcdTag string
	// CoreDNS holds coredns; CoreDNSTag is kubeadm's ("v1.11.3").
	CoreDNS, CoreDNSTag string
}

// KubeadmImages returns, by upstream repository and tag below
// registry.k8s.io ("kube-apiserver:v1.30.14", "coredns/coredns:v1.11.3"),
// the images kubeadm runs at src.Version (pause is Build's).
func KubeadmImages(src KubeadmSources) (map[string]v1.Image, error) {
	out := map[string]v1.Image{}
	for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		img, err := programImage([]string{filepath.Join(src.Kubernetes, c)}, "/usr/local/bin", nil, nil)
		if err != nil {
			return nil, err
		}
		out[c+":"+src.Version] = img
	}
	iptables, err := hostIptables()
	if err != nil {
		return nil, err
	}
	proxy, err := programImage([]string{filepath.Join(src.Kubernetes, "kube-proxy")}, "/usr/local/bin", iptables,
		[]string{"LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu"})
	if err != nil {
		return nil, err
	}
	out["kube-proxy:"+src.Version] = proxy
	etcd, err := programImage([]string{filepath.Join(src.Etcd, "etcd"), filepath.Join(src.Etcd, "etcdctl")}, "/usr/local/bin", nil, nil)
	if err != nil {
		return nil, err
	}
	out["etcd:"+src.EtcdTag] = etcd
	coredns, err := CoreDNS(src.CoreDNS)
	if err != nil {
		return nil, err
	}
	out["coredns/coredns:"+src.CoreDNSTag] = coredns
	return out, nil
}

// CoreDNS is the coredns program in dir as its image: /coredns, the
// entrypoint.
func CoreDNS(dir string) (v1.Image, error) {
	return image(filepath.Join(dir, "coredns"), "/coredns", nil)
}

// entry is one file of a layer: content from a host file, or a symlink.
type entry struct {
	name, src, link string
	mode            int64
}

// programImage is the programs in dir (on PATH), plus extra files, with
// env added; no entrypoint (kubeadm's manifests give the command).
func programImage(programs []string, dir string, extra []entry, env []string) (v1.Image, error) {
	var files []entry
	for _, p := range programs {
		files = append(files, entry{name: path.Join(dir, filepath.Base(p)), src: p, mode: 0o755})
	}
	files = append(files, extra...)
	layer, err := layerOf(files)
	if err != nil {
		return nil, err
	}
	return imageOf(layer, func(c *v1.Config) {
		c.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	})
}

// layerOf writes files into one gzip layer (fast compression: the
// programs are large and the layer is built at every sandbox-up), each
// parent directory once, with fixed times.
func layerOf(files []entry) (v1.Layer, error) {
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	for _, f := range files {
		name := strings.TrimPrefix(f.name, "/")
		var parents []string
		for d := path.Dir(name); d != "." && !dirs[d]; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
			dirs[d] = true
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		if f.link != "" {
			if err := tw.WriteHeader(&tar.Header{Name: name, Linkname: f.link, Mode: 0o777, ModTime: epoch, Typeflag: tar.TypeSymlink, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
			continue
		}
		content, err := os.ReadFile(f.src)
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: f.mode, Size: int64(len(content)), ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(content); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestSpeed))
}

// hostIptables is the host's iptables-nft (Debian's iptables package):
// xtables-nft-multi with the names kube-proxy runs, its extensions, the
// conntrack tool, every library they load (by ldd) and /etc/protocols.
func hostIptables() ([]entry, error) {
	const multi = "/usr/sbin/xtables-nft-multi"
	bins := []string{multi, "/usr/sbin/conntrack"}
	var out []entry
	for _, n := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		out = append(out, entry{name: "/usr/sbin/" + n, link: "xtables-nft-multi"})
	}
	exts, err := filepath.Glob("/usr/lib/x86_64-linux-gnu/xtables/*.so")
	if err != nil || len(exts) == 0 {
		return nil, fmt.Errorf("iptables extensions in /usr/lib/x86_64-linux-gnu/xtables (Debian's iptables): none found")
	}
	libs := map[string]bool{}
	for _, b := range append(bins, exts...) {
		deps, err := ldd(b)
		if err != nil {
			return nil, err
		}
		for _, d := range deps {
			libs[d] = true
		}
	}
	for _, b := range append(bins, exts...) {
		out = append(out, entry{name: b, src: b, mode: 0o755})
	}
	for l := range libs {
		out = append(out, entry{name: l, src: l, mode: 0o755})
	}
	for _, f := range []string{"/etc/protocols", "/etc/services"} {
		if _, err := os.Stat(f); err == nil {
			out = append(out, entry{name: f, src: f, mode: 0o644})
		}
	}
	return out, nil
}

// ldd lists the shared libraries bin loads, by the paths the loader finds
// them at (content read through symlinks).
func ldd(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s (Debian's libc-bin): %w", bin, err)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0]) // the loader itself
		}
	}
	return libs, nil
}
