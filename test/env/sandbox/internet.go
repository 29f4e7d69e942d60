package sandbox

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/test/env/images"
	"github.com/kubelift/kubelift/test/env/internet"
	"github.com/kubelift/kubelift/test/env/kube"
)

// Where the stand-in internet serves, inside its own namespace.
const (
	internetRegistry = "127.0.0.1:5000"
	internetFiles    = "127.0.0.1:8080"
)

const filesUnit = `[Unit]
Description=HTTP file server playing dl.k8s.io and github.com (each file with its .sha256)

[Service]
ExecStart=` + toolPath + ` serve-files --dir /srv/files --listen ` + internetFiles + `
Restart=on-failure

[Install]
WantedBy=multi-user.target
`

// internetFiles writes the stand-in internet's machine: its registry's
// configuration, its units, and s.Internet (the flags that point bundle
// create at it). What it serves, serveFiles writes once the target is
// built.
func (s *State) internetFiles(m *Machine) error {
	for _, d := range []string{"etc/docker/registry", "var/lib/docker-registry", "srv/files"} {
		if err := os.MkdirAll(m.fsPath(d), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(m.fsPath("etc/docker/registry/config.yml"), []byte(registryConfig(internetRegistry, "kubelift-sandbox-internet", false)), 0o644); err != nil {
		return err
	}
	sets, err := s.servedSets()
	if err != nil {
		return err
	}
	hosts := map[string]bool{}
	for _, set := range sets {
		for _, f := range set.files {
			u, err := url.Parse(f.URLFor("amd64"))
			if err != nil {
				return err
			}
			hosts[u.Host] = true
		}
	}
	s.Internet = Internet{NetNS: m.NetNS, Registry: internetRegistry, Files: "http://" + internetFiles,
		BundleFlags: []string{"--registry-mirror", "registry.k8s.io=" + internetRegistry, "--insecure-registry", internetRegistry}}
	var hs []string
	for h := range hosts {
		hs = append(hs, h)
	}
	sort.Strings(hs)
	for _, h := range hs {
		s.Internet.BundleFlags = append(s.Internet.BundleFlags, "--url-mirror", "https://"+h+"=http://"+internetFiles+"/"+h)
	}
	if err := writeUnit(m, "source-registry.service", fmt.Sprintf(registryUnit, "playing registry.k8s.io"), true); err != nil {
		return err
	}
	return writeUnit(m, "files.service", filesUnit, true)
}

// servedSet is one release's files the stand-in internet serves, and
// where their content comes from (nil content: a labelled stand-in).
type servedSet struct {
	version string
	files   []catalog.File
	content func(name string) ([]byte, error)
}

// servedSets are the new version's catalog entry for amd64, its node
// stack's (stackFile), every hop's, and etcd's release archive at
// Config.EtcdTo (etcdServedSet). The kubelet and kubectl are the real
// builds, and so are containerd, runc, the CNI plugins, crictl (toolFile)
// and etcd; the other files are labelled stand-ins.
func (s *State) servedSets() ([]servedSet, error) {
	rel, err := catalogRelease(s.NewVersion)
	if err != nil {
		return nil, fmt.Errorf("stand-in internet: %w", err)
	}
	hops, err := s.Hops()
	if err != nil {
		return nil, fmt.Errorf("stand-in internet: %w", err)
	}
	// The programs the sandbox builds are served for real; the rest
	// (kubeadm, kube-proxy; the CNI and crictl archives of a stand-in
	// runtime's sandbox; at a hop, all but the control plane) are
	// stand-ins.
	built := func(dir func() (string, error)) func(string) ([]byte, error) {
		return func(name string) ([]byte, error) {
			d, err := dir()
			if err != nil {
				return nil, err
			}
			data, err := os.ReadFile(filepath.Join(d, name))
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil
			}
			return data, err
		}
	}
	newFile := built(func() (string, error) {
		if s.Binaries.New == "" {
			return "", fmt.Errorf("stand-in internet: %s was not built", s.NewVersion)
		}
		return s.Binaries.New, nil
	})
	sets := []servedSet{{rel.Version, rel.Files, func(name string) ([]byte, error) {
		if data, err := s.toolFile(name); data != nil || err != nil {
			return data, err
		}
		return newFile(name)
	}}}
	var stack []catalog.File
	for _, p := range rel.NodeStack {
		stack = append(stack, p.File())
	}
	sets = append(sets, servedSet{rel.Version, stack, func(name string) ([]byte, error) { return s.stackFile(rel, name) }})
	for _, h := range hops {
		sets = append(sets, servedSet{h.Version, h.Files, built(func() (string, error) {
			dir, ok := s.Binaries.Hops[h.Version]
			if !ok {
				return "", fmt.Errorf("stand-in internet: hop %s was not built", h.Version)
			}
			return dir, nil
		})})
	}
	return append(sets, s.etcdServedSet()...), nil
}

// serveFiles writes, in the stand-in internet's tree, every file of
// servedSets at its upstream path (/srv/files/HOST/PATH, with
// PATH.sha256).
func (s *State) serveFiles(m *Machine) error {
	sets, err := s.servedSets()
	if err != nil {
		return err
	}
	for _, set := range sets {
		for _, f := range set.files {
			u, err := url.Parse(f.URLFor("amd64"))
			if err != nil {
				return err
			}
			dst := m.fsPath(filepath.Join("srv/files", u.Host, u.Path))
			data, err := set.content(f.Name)
			if err != nil {
				return err
			}
			if data == nil {
				data = []byte(fmt.Sprintf("kubelift sandbox stand-in for %s %s (%s)\n", f.Name, set.version, u))
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(dst, data, 0o644); err != nil {
				return err
			}
			if err := os.WriteFile(dst+".sha256", []byte(fmt.Sprintf("%x\n", sha256.Sum256(data))), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// stackFile is the content the stand-in internet serves for part name of
// rel's node stack: containerd's release archive (bin/ with containerd,
// its shim and ctr, as upstream's tar.gz lays them out) and runc, from
// the runtime the sandbox built (Binaries.Stack) where the catalog names
// that version; etcd's release archive where it names Config.EtcdTo (the
// same URL etcdServedSet serves); nil (a stand-in) for the rest.
func (s *State) stackFile(rel *catalog.Release, name string) ([]byte, error) {
	part, _ := rel.StackPart(name)
	switch {
	case name == catalog.StackEtcd && s.EtcdTo != "" && part.Version == s.EtcdTo:
		return etcdArchive(s.Binaries.EtcdTo, s.EtcdTo)
	case s.Binaries.Stack == "":
		return nil, nil
	case name == catalog.StackContainerd && part.Version == kube.ContainerdVersion:
		return tarGz(s.Binaries.Stack, "bin", "containerd", "containerd-shim-runc-v2", "ctr")
	case name == catalog.StackRunc && part.Version == kube.RuncVersion:
		return os.ReadFile(filepath.Join(s.Binaries.Stack, "runc"))
	}
	return nil, nil
}

// toolFile is the content the stand-in internet serves for the new
// release's tools, where the sandbox has real ones (nil: none):
//   - cni-plugins: the CNI plugins the sandbox built at the catalog's
//     version (Binaries.CNI) with the project's LICENSE and README.md,
//     laid out as upstream's archive (./NAME);
//   - crictl: the crictl the sandbox built (kube.CrictlVersion: cri-tools
//     at the catalog's version, v1.31.0 for v1.31, is not on the module
//     proxy), as upstream's archive holds it (crictl at its root). The
//     nodes run a build of the same, so a tools move finds it the same.
func (s *State) toolFile(name string) ([]byte, error) {
	switch {
	case name == "cni-plugins" && s.Binaries.CNI != "":
		return tarGz(s.Binaries.CNI, ".", append(append([]string{}, cniPlugins...), "LICENSE", "README.md")...)
	case name == "crictl" && s.Binaries.Stack != "":
		return tarGz(s.Binaries.Stack, "", "crictl")
	}
	return nil, nil
}

// tarGz is a gzipped tar of dir's files names, each with its mode, under
// prefix/ (a directory entry first), or at the root for prefix "".
func tarGz(dir, prefix string, names ...string) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if prefix != "" {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: prefix + "/", Mode: 0o755}); err != nil {
			return nil, err
		}
		prefix += "/"
	}
	for _, n := range names {
		fi, err := os.Stat(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: prefix + n, Mode: int64(fi.Mode().Perm()), Size: int64(len(data))}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// seedInternet pushes an image for every image of the new version's
// catalog entry (amd64 and arm64, as multi-arch indexes) into the source
// registry, from inside the internet's namespace. With built (the real
// runtime), pause is the real one (amd64): a bundle carries it, import
// pushes it where the nodes pull pause from, and a pod sandbox started
// after that must still start.
func (s *State) seedInternet(ctx context.Context, built *images.Set) error {
	m, err := s.Machine("internet")
	if err != nil {
		return err
	}
	ns := m.Net()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: ns.DialContext}}
	for _, u := range []string{"http://" + internetRegistry + "/v2/", "http://" + internetFiles + "/"} {
		if err := poll(ctx, time.Minute, func() (bool, error) {
			resp, err := hc.Get(u)
			if err != nil {
				return false, nil
			}
			resp.Body.Close()
			return resp.StatusCode < 500, nil
		}); err != nil {
			return fmt.Errorf("stand-in internet %s: %w\n%s", u, err, s.UnitLog(*m, "source-registry", 2000))
		}
	}
	rel, err := catalogRelease(s.NewVersion)
	if err != nil {
		return err
	}
	tr := remote.WithTransport(&http.Transport{DialContext: ns.DialContext})
	repos := internet.ReleaseRepos(rel)
	hops, err := s.Hops()
	if err != nil {
		return err
	}
	seed := slices.Clone(repos)
	for _, h := range hops { // a hop's images are stand-ins: the binary control plane runs none
		for _, r := range internet.ReleaseRepos(h) {
			if !slices.Contains(seed, r) { // pause, etcd or CoreDNS may be the target's too
				seed = append(seed, r)
			}
		}
	}
	if _, err = internet.Seed(ctx, internetRegistry, seed,
		internet.ImageShape{Arches: []string{"amd64", "arm64"}, BaseBytes: 8 << 20, UniqueBytes: 2 << 20}, tr); err != nil {
		return err
	}
	if built == nil {
		return nil
	}
	pause := "pause:" + images.PauseTag
	if !slices.Contains(repos, pause) {
		return fmt.Errorf("stand-in internet: %s's catalog entry has no %s (the pause image the sandbox builds)", s.NewVersion, pause)
	}
	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: built.Pause, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}}), types.DockerManifestList)
	ref, err := name.ParseReference(internetRegistry+"/"+pause, name.Insecure)
	if err != nil {
		return err
	}
	if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx), tr); err != nil {
		return fmt.Errorf("stand-in internet: push the real %s: %w", pause, err)
	}
	// A real image (amd64) where the catalog names repoTag.
	push := func(repoTag string, img v1.Image) error {
		idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index,
			mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}}), types.OCIImageIndex)
		ref, err := name.ParseReference(internetRegistry+"/"+repoTag, name.Insecure)
		if err != nil {
			return err
		}
		if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx), tr); err != nil {
			return fmt.Errorf("stand-in internet: push the real %s: %w", repoTag, err)
		}
		return nil
	}
	if s.Kubeadm {
		// What kubeadm runs at the new version, for real (amd64): a bundle
		// carries these, and `kubeadm upgrade` runs them.
		set, err := kubeadmImages(ctx, s.Binaries.New, s.NewVersion, built.Pause)
		if err != nil {
			return err
		}
		for repoTag, img := range set {
			if repoTag == "etcd:"+EtcdTag && !slices.Contains(repos, repoTag) {
				continue // pinned (kubeadmInitConfig): kubeadm keeps the etcd it runs, already in the private registry
			}
			if !slices.Contains(repos, repoTag) {
				return fmt.Errorf("stand-in internet: %s's catalog entry has no %s (an image kubeadm runs)", s.NewVersion, repoTag)
			}
			if err := push(repoTag, img); err != nil {
				return err
			}
		}
	}
	if err := s.seedCoreDNS(ctx, push); err != nil {
		return err
	}
	// The team's images, where its CI publishes them (team/NAME:TAG).
	for _, img := range []string{ShopAppImage, ShopSidecarImage} {
		r := internetRegistry + "/team/" + path.Base(img)
		ref, err := name.ParseReference(r, name.Insecure)
		if err != nil {
			return err
		}
		if err := remote.Write(ref, built.Shop, remote.WithContext(ctx), tr); err != nil {
			return fmt.Errorf("stand-in internet: push %s: %w", r, err)
		}
		s.Internet.UserImages = append(s.Internet.UserImages, r)
	}
	return nil
}

// ServeFiles serves dir over HTTP on addr until ctx ends (the stand-in
// for dl.k8s.io and github.com releases).
func ServeFiles(ctx context.Context, dir, addr string) error {
	srv := &http.Server{Addr: addr, Handler: http.FileServer(http.Dir(dir)), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.ListenAndServe(); err != nil && !strings.Contains(err.Error(), "Server closed") {
		return err
	}
	return nil
}
