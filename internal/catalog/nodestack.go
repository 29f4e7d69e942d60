package catalog

import (
	"fmt"
	"net/url"
	"strings"
)

// A release's nodeStack is what runs under and beside its kubelet that a
// bundle carries when asked (`bundle create --node-stack`), each part at
// the version the release is paired with and from its project's own
// release page:
//
//	nodeStack:
//	  - name: containerd
//	    version: v2.3.7
//	    url: https://github.com/containerd/containerd/releases/download/v2.3.7/containerd-2.3.7-linux-{arch}.tar.gz
//	  - name: runc
//	    version: v1.5.2
//	    url: https://github.com/opencontainers/runc/releases/download/v1.5.2/runc.{arch}
//
// containerd must be a version the release's containerRuntimes support,
// runc the one that containerd release names (its
// script/setup/runc-version), etcd the one kubeadm pairs with the
// release (the etcd image's tag).

// The parts a node stack may list.
const (
	StackContainerd = "containerd"
	StackRunc       = "runc"
	StackEtcd       = "etcd"
)

// StackParts are the parts a node stack may list, in the order a node
// takes them.
var StackParts = []string{StackContainerd, StackRunc, StackEtcd}

// StackPart is one part of a release's node stack.
type StackPart struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// URL may contain {arch}; it names Version (a copied line that was
	// not updated is refused).
	URL string `json:"url"`
	// SHA256 pins the content per arch, as for files.
	SHA256 map[string]string `json:"sha256,omitempty"`

	parsed Version
}

// File is the part as a file of the bundle, named as the part.
func (p StackPart) File() File { return File{Name: p.Name, URL: p.URL, SHA256: p.SHA256} }

// Parsed is the part's version.
func (p StackPart) Parsed() Version { return p.parsed }

// StackPart returns the release's part name, if its node stack lists it.
func (r *Release) StackPart(name string) (StackPart, bool) {
	for _, p := range r.NodeStack {
		if p.Name == name {
			return p, true
		}
	}
	return StackPart{}, false
}

// etcdImageTag is the tag of the release's etcd image (3.5.15-0).
func (r *Release) etcdImageTag() (string, bool) {
	for _, ref := range r.Images {
		repo, tag, ok := strings.Cut(ref, ":")
		if ok && (repo == "etcd" || strings.HasSuffix(repo, "/etcd")) {
			return tag, true
		}
	}
	return "", false
}

func (r *Release) validateNodeStack(arches []string) error {
	fail := func(field string, format string, args ...any) error {
		return &Error{Version: r.Version, Field: field, Err: fmt.Errorf(format, args...)}
	}
	seen := map[string]bool{}
	for i := range r.NodeStack {
		p := &r.NodeStack[i]
		field := fmt.Sprintf("nodeStack[%d]", i)
		if !contains(StackParts, p.Name) {
			return fail(field+".name", "%q: want one of %s", p.Name, strings.Join(StackParts, ", "))
		}
		if seen[p.Name] {
			return fail(field+".name", "%q listed twice", p.Name)
		}
		seen[p.Name] = true
		for _, f := range r.Files {
			if f.Name == p.Name {
				return fail(field+".name", "%q is also one of the release's files", p.Name)
			}
		}
		v, err := ParseVersion(p.Version)
		if err != nil || v.String() != p.Version {
			return fail(field+".version", "%q: want vMAJOR.MINOR.PATCH", p.Version)
		}
		p.parsed = v
		u, err := url.Parse(strings.ReplaceAll(p.URL, "{arch}", "amd64"))
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return fail(field+".url", "%q is not an http(s) URL", p.URL)
		}
		if !strings.Contains(p.URL, strings.TrimPrefix(p.Version, "v")) {
			return fail(field+".url", "%q does not name version %s", p.URL, p.Version)
		}
		for arch, sum := range p.SHA256 {
			if arches != nil && !contains(arches, arch) {
				return fail(field+".sha256", "arch %q is not in the catalog's arches", arch)
			}
			if !hexRE.MatchString(sum) {
				return fail(field+".sha256."+arch, "%q is not 64 lowercase hex digits", sum)
			}
		}
		if p.Name == StackEtcd {
			if tag, ok := r.etcdImageTag(); ok && "v"+strings.SplitN(tag, "-", 2)[0] != p.Version {
				return fail(field+".version", "etcd %s, but the release's etcd image is %s (kubeadm's pairing): the two name one etcd", p.Version, tag)
			}
		}
		if p.Name == StackContainerd {
			if ok, listed := r.RuntimeSupport(StackContainerd, v); listed && !ok {
				return fail(field+".version", "containerd %s is not one this release supports (containerRuntimes.containerd: %s)", p.Version, strings.Join(r.RuntimeVersions(StackContainerd), ", "))
			}
		}
	}
	if seen[StackContainerd] != seen[StackRunc] {
		return fail("nodeStack", "containerd and runc go together: list both or neither")
	}
	return nil
}

// EtcdAt is the release's etcd part at version instead of the one the
// catalog pairs with it, from the same project's release page (the
// paired part's URL with its version replaced), for binary clusters that
// run a newer etcd than kubeadm's pairing (bundle create --etcd): never
// an older one. "" is the paired part. A part at another version has
// no pinned sums: the bundle pins it, or checks the sum published beside
// it.
func (r *Release) EtcdAt(version string) (StackPart, error) {
	paired, ok := r.StackPart(StackEtcd)
	if !ok {
		return StackPart{}, fmt.Errorf("the catalog pairs no etcd with %s (its nodeStack lists none), so it knows no URL to take etcd %s from", r.Version, version)
	}
	if version == "" || version == paired.Version {
		return paired, nil
	}
	v, err := ParseVersion(version)
	if err != nil || v.String() != version || v.Major != 3 {
		return StackPart{}, fmt.Errorf("etcd %q: want v3.MINOR.PATCH", version)
	}
	if v.Compare(paired.parsed) < 0 {
		return StackPart{}, fmt.Errorf("etcd %s is older than the %s the catalog pairs with %s", version, paired.Version, r.Version)
	}
	return StackPart{Name: StackEtcd, Version: version, parsed: v,
		URL: strings.ReplaceAll(paired.URL, strings.TrimPrefix(paired.Version, "v"), strings.TrimPrefix(version, "v"))}, nil
}
