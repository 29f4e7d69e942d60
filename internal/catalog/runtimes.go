package catalog

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// A release's containerRuntimes say which versions of each container
// runtime its kubelet supports, as the runtime's own compatibility table
// writes them (containerd's RELEASES.md, "Kubernetes Support": "2.0.4+,
// 1.7.24+"):
//
//	containerRuntimes:
//	  containerd: [v2.1.0+, v2.0.4+, v1.7.24+]
//
// "vX.Y.Z+" is that patch and every later patch of X.Y; "vX.Y" every patch
// of X.Y; "vA-vB" an inclusive range. A version newer than every line
// listed is supported too (the table is written when the Kubernetes minor
// is released; the runtime's later minors keep serving its CRI version).
// Older lines, and lines between those listed, are not.

var runtimeNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]*$`)

// ParseRuntimeRange parses one item of a containerRuntimes list.
func ParseRuntimeRange(s string) (Range, error) {
	if base, ok := strings.CutSuffix(s, "+"); ok {
		v, err := ParseVersion(base)
		if err != nil || strings.Count(base, ".") != 2 {
			return Range{}, fmt.Errorf("%q: want vMAJOR.MINOR.PATCH+ (that patch and later ones of its minor)", s)
		}
		return Range{From: v, To: v.lastOfMinor(), text: s}, nil
	}
	return ParseRange(s)
}

func (r *Release) validateRuntimes() error {
	r.runtimes = nil
	names := make([]string, 0, len(r.ContainerRuntimes))
	for name := range r.ContainerRuntimes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		field := "containerRuntimes." + name
		if !runtimeNameRE.MatchString(name) {
			return &Error{Version: r.Version, Field: field, Err: fmt.Errorf("%q is not a runtime name (as a node reports it: containerd, cri-o)", name)}
		}
		items := r.ContainerRuntimes[name]
		if len(items) == 0 {
			return &Error{Version: r.Version, Field: field, Err: fmt.Errorf("is empty: list the supported versions, or leave %s out", name)}
		}
		for i, s := range items {
			rg, err := ParseRuntimeRange(s)
			if err != nil {
				return &Error{Version: r.Version, Field: fmt.Sprintf("%s[%d]", field, i), Err: err}
			}
			if r.runtimes == nil {
				r.runtimes = map[string][]Range{}
			}
			r.runtimes[name] = append(r.runtimes[name], rg)
		}
	}
	return nil
}

// RuntimeSupport says whether this release's kubelet supports version v of
// the container runtime name: listed is false when the release lists no
// versions of that runtime (nothing to check it against).
func (r *Release) RuntimeSupport(name string, v Version) (supported, listed bool) {
	lines := r.runtimes[name]
	if len(lines) == 0 {
		return false, false
	}
	newest := lines[0].To
	for _, rg := range lines {
		if rg.Contains(v) {
			return true, true
		}
		if rg.To.Compare(newest) > 0 {
			newest = rg.To
		}
	}
	return v.Compare(newest) > 0, true
}

// RuntimeVersions are the versions of runtime name this release supports,
// as the catalog writes them.
func (r *Release) RuntimeVersions(name string) []string { return r.ContainerRuntimes[name] }
