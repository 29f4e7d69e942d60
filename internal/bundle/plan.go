package bundle

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/kubelift/kubelift/internal/catalog"
)

// Mirror rewrites a prefix: a registry (or registry/path) for images, a URL
// prefix for files.
type Mirror struct{ From, To string }

// ParseMirror parses FROM=TO.
func ParseMirror(s string) (Mirror, error) {
	from, to, ok := strings.Cut(s, "=")
	if !ok || from == "" || to == "" {
		return Mirror{}, fmt.Errorf("mirror %q: want FROM=TO", s)
	}
	return Mirror{From: strings.TrimSuffix(from, "/"), To: strings.TrimSuffix(to, "/")}, nil
}

// ExtraFile is a user file added with --file NAME=URL[#sha256:HEX].
type ExtraFile struct {
	Name, URL, SHA256 string
}

var fileNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ParseExtraFile parses NAME=URL[#sha256:HEX].
func ParseExtraFile(s string) (ExtraFile, error) {
	n, rest, ok := strings.Cut(s, "=")
	if !ok || !fileNameRE.MatchString(n) {
		return ExtraFile{}, fmt.Errorf("file %q: want NAME=URL[#sha256:HEX] with a plain NAME", s)
	}
	u, sum, _ := strings.Cut(rest, "#")
	if sum != "" {
		hexSum, ok := pinnedSum(sum)
		if !ok {
			return ExtraFile{}, fmt.Errorf("file %q: checksum %q: want sha256: and 64 lowercase hex digits", s, sum)
		}
		sum = hexSum
	}
	pu, err := url.Parse(u)
	if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
		return ExtraFile{}, fmt.Errorf("file %q: %q is not an http(s) URL", s, u)
	}
	return ExtraFile{Name: n, URL: u, SHA256: sum}, nil
}

var sumRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// pinnedSum is the hex digits of a pin written sha256:HEX.
func pinnedSum(s string) (string, bool) {
	hexSum, ok := strings.CutPrefix(s, "sha256:")
	return hexSum, ok && sumRE.MatchString(hexSum)
}

// Plan is what a bundle will contain and where each part comes from: the
// output of `bundle create --dry-run -o json`.
type Plan struct {
	KubernetesVersion string         `json:"kubernetesVersion"`
	Arches            []string       `json:"arches"`
	Images            []PlannedImage `json:"images"`
	Files             []PlannedFile  `json:"files"`
	// Hops are the releases the control plane passes through on the way
	// from CreateOptions.From, oldest first; their images are in Images.
	Hops    []PlannedHop `json:"hops,omitempty"`
	release *catalog.Release
}

// PlannedHop is a release the control plane passes through: its
// control-plane binaries and kubeadm, stored under hops/VERSION/.
type PlannedHop struct {
	Version string        `json:"version"`
	Files   []PlannedFile `json:"files"`
	release *catalog.Release
}

// HopFiles are the files of a hop's release a bundle carries: what a
// control-plane node runs (kubeadm for kubeadm clusters). Kubelets,
// kube-proxy and the node tools go straight to the target.
var HopFiles = []string{"kubeadm", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// hopImages are the images of a hop's release a bundle carries: all of
// them, since `kubeadm upgrade apply` at each minor moves the control
// plane, etcd, CoreDNS and the kube-proxy DaemonSet to that minor's.
func hopImages(rel *catalog.Release) []string { return rel.Images }

// PlannedImage is an image to fetch.
type PlannedImage struct {
	Ref      string `json:"ref"`
	PullFrom string `json:"pullFrom"`
}

// PlannedFile is a file to fetch. SHA256 is empty when not pinned (then the
// upstream .sha256 file is fetched too).
type PlannedFile struct {
	Name string `json:"name"`
	// Version is a node-stack part's (containerd v2.3.7).
	Version string `json:"version,omitempty"`
	Arch    string `json:"arch,omitempty"`
	URL     string `json:"url"`
	SHA256  string `json:"sha256"`
	Path    string `json:"-"`
	source  string
}

// MakePlan resolves the catalog entry, user additions and mirrors into a Plan.
// It contacts nothing.
func MakePlan(opts *CreateOptions) (*Plan, error) {
	rel, err := opts.Catalog.Lookup(opts.KubernetesVersion)
	if err != nil {
		return nil, err
	}
	if rel.Withdrawn {
		return nil, fmt.Errorf("%s: %s is withdrawn in the catalog", opts.Catalog.Source, rel.Version)
	}
	arches := opts.Arches
	if len(arches) == 0 {
		arches = []string{"amd64"}
	}
	for _, a := range arches {
		if !opts.Catalog.SupportsArch(a) {
			return nil, fmt.Errorf("arch %q: the catalog has %s", a, strings.Join(opts.Catalog.Arches, ", "))
		}
	}
	p := &Plan{KubernetesVersion: rel.Version, Arches: arches, release: rel}
	var hops []*catalog.Release
	if opts.From != "" {
		from, err := catalog.ParseRange(opts.From)
		if err != nil {
			return nil, fmt.Errorf("--from: %w", err)
		}
		if hops, err = opts.Catalog.Hops(from, rel); err != nil {
			return nil, err
		}
	}
	refs := append([]string{}, rel.Images...)
	for _, h := range hops {
		refs = append(refs, hopImages(h)...)
	}
	seen := map[string]bool{}
	for _, ref := range append(refs, opts.ExtraImages...) {
		norm, err := NormalizeRef(ref)
		if err != nil {
			return nil, fmt.Errorf("image %q: %w", ref, err)
		}
		if seen[norm] {
			continue
		}
		seen[norm] = true
		p.Images = append(p.Images, PlannedImage{Ref: norm, PullFrom: rewrite(norm, opts.RegistryMirrors)})
	}
	paths := map[string]string{}
	if opts.KubeletBinary != "" && len(arches) != 1 {
		return nil, errors.New("--kubelet-binary is built for one arch: pass a single --arch")
	}
	replacedKubelet := false
	for _, arch := range arches {
		for _, f := range rel.Files {
			u := f.URLFor(arch)
			base := path.Base(mustPath(u))
			pf := PlannedFile{Name: f.Name, Arch: arch, URL: rewrite(u, opts.URLMirrors), SHA256: f.SHA256[arch],
				Path: path.Join("bin", "linux", arch, base), source: u}
			if f.Name == "kubelet" && opts.KubeletBinary != "" {
				abs, err := filepath.Abs(opts.KubeletBinary)
				if err != nil {
					return nil, err
				}
				pf.URL, pf.source, pf.SHA256 = "file://"+abs, "file://"+abs, ""
				replacedKubelet = true
			}
			if prev, dup := paths[pf.Path]; dup {
				return nil, fmt.Errorf("files %s and %s would both be stored as %s", prev, f.Name, pf.Path)
			}
			paths[pf.Path] = f.Name
			p.Files = append(p.Files, pf)
		}
	}
	if opts.KubeletBinary != "" && !replacedKubelet {
		return nil, fmt.Errorf("--kubelet-binary: the catalog lists no kubelet for %s", rel.Version)
	}
	parts, err := stackParts(opts, rel, arches)
	if err != nil {
		return nil, err
	}
	for _, arch := range arches {
		for _, part := range parts {
			u := part.File().URLFor(arch)
			pf := PlannedFile{Name: part.Name, Version: part.Version, Arch: arch, URL: rewrite(u, opts.URLMirrors), SHA256: part.SHA256[arch],
				Path: path.Join("bin", "linux", arch, path.Base(mustPath(u))), source: u}
			if prev, dup := paths[pf.Path]; dup {
				return nil, fmt.Errorf("files %s and %s would both be stored as %s", prev, part.Name, pf.Path)
			}
			paths[pf.Path] = part.Name
			p.Files = append(p.Files, pf)
		}
	}
	for _, f := range opts.ExtraFiles {
		pf := PlannedFile{Name: f.Name, URL: rewrite(f.URL, opts.URLMirrors), SHA256: f.SHA256, Path: path.Join("files", f.Name), source: f.URL}
		if prev, dup := paths[pf.Path]; dup {
			return nil, fmt.Errorf("--file %s: name already used by %s", f.Name, prev)
		}
		paths[pf.Path] = f.Name
		p.Files = append(p.Files, pf)
	}
	sort.SliceStable(p.Files, func(i, j int) bool { return p.Files[i].Path < p.Files[j].Path })
	for _, h := range hops {
		ph := PlannedHop{Version: h.Version, release: h}
		for _, arch := range arches {
			for _, f := range h.Files {
				if !slices.Contains(HopFiles, f.Name) {
					continue
				}
				u := f.URLFor(arch)
				ph.Files = append(ph.Files, PlannedFile{Name: f.Name, Arch: arch, URL: rewrite(u, opts.URLMirrors), SHA256: f.SHA256[arch],
					Path: path.Join("hops", h.Version, "bin", "linux", arch, path.Base(mustPath(u))), source: u})
			}
		}
		p.Hops = append(p.Hops, ph)
	}
	return p, nil
}

// allFiles is every file of the plan, the hops' after the target's.
func (p *Plan) allFiles() []PlannedFile {
	all := append([]PlannedFile{}, p.Files...)
	for _, h := range p.Hops {
		all = append(all, h.Files...)
	}
	return all
}

func mustPath(u string) string {
	pu, err := url.Parse(u)
	if err != nil {
		return u
	}
	return pu.Path
}

// NormalizeRef returns a reference with its registry spelled out, using
// docker.io (not index.docker.io) for Docker Hub.
func NormalizeRef(ref string) (string, error) {
	r, err := name.ParseReference(ref, name.WeakValidation)
	if err != nil {
		return "", err
	}
	s := r.Name()
	if rest, ok := strings.CutPrefix(s, name.DefaultRegistry+"/"); ok {
		s = "docker.io/" + rest
	}
	return s, nil
}

// rewrite applies the longest mirror whose FROM is s or a prefix of s ending
// at a "/" boundary (so registry.k8s.io does not match registry.k8s.io.evil).
func rewrite(s string, mirrors []Mirror) string {
	best := -1
	for i, m := range mirrors {
		if s == m.From || strings.HasPrefix(s, m.From+"/") {
			if best < 0 || len(m.From) > len(mirrors[best].From) {
				best = i
			}
		}
	}
	if best < 0 {
		return s
	}
	return mirrors[best].To + strings.TrimPrefix(s, mirrors[best].From)
}

// stackParts are the node-stack parts the bundle carries: containerd and
// runc with NodeStack, etcd with Etcd (the paired one, or the version
// asked for, pinned where a sum is given).
func stackParts(opts *CreateOptions, rel *catalog.Release, arches []string) ([]catalog.StackPart, error) {
	var parts []catalog.StackPart
	if opts.NodeStack {
		for _, part := range rel.NodeStack {
			if part.Name != catalog.StackEtcd {
				parts = append(parts, part)
			}
		}
		if len(parts) == 0 {
			return nil, fmt.Errorf("--node-stack: %s pairs no runtime with %s (its nodeStack lists no containerd)", opts.Catalog.Source, rel.Version)
		}
	}
	if opts.Etcd == "" {
		return parts, nil
	}
	version, sum, _ := strings.Cut(opts.Etcd, "#")
	if version == "paired" {
		version = ""
	}
	part, err := rel.EtcdAt(version)
	if err != nil {
		return nil, fmt.Errorf("--etcd %s: %w", opts.Etcd, err)
	}
	if sum != "" {
		hexSum, ok := pinnedSum(sum)
		if !ok {
			return nil, fmt.Errorf("--etcd %s: checksum %q: want sha256: and 64 lowercase hex digits", opts.Etcd, sum)
		}
		if len(arches) != 1 {
			return nil, fmt.Errorf("--etcd %s: a checksum pins one file: bundle one --arch", opts.Etcd)
		}
		part.SHA256 = map[string]string{arches[0]: hexSum}
	}
	return append(parts, part), nil
}
