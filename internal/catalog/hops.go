package catalog

import (
	"errors"
	"fmt"
)

// MaxKubeletSkew is how many minors a kubelet may be older than the API
// server (the version skew policy from 1.28 on).
const MaxKubeletSkew = 3

// ErrNoPath means the catalog has no way from a version to another.
var ErrNoPath = errors.New("no upgrade path")

// Hops returns the releases a control plane passes through from the
// versions in from to to: the newest listed patch of each minor in
// between, oldest first, each an allowed upgrade from the one before; to
// must in turn allow the last. The API server moves one minor at a time;
// the kubelets stay where they are until the control plane is at to, then
// go straight there, so from may be at most MaxKubeletSkew minors older
// than to. No hops when from is to's minor or the one before.
func (c *Catalog) Hops(from Range, to *Release) ([]*Release, error) {
	f, t := from.From, to.parsed
	switch {
	case f.Major != t.Major || from.To.Minor != f.Minor:
		return nil, fmt.Errorf("%s to %s: %w: from must name one minor of the same major version", from, t, ErrNoPath)
	case f.Minor > t.Minor:
		return nil, fmt.Errorf("%s to %s: %w: that is a downgrade", from, t, ErrNoPath)
	case t.Minor-f.Minor > MaxKubeletSkew:
		return nil, fmt.Errorf("%s to %s: %w: kubelets at %s would be %d minors older than the API server at %s, and at most %d is supported; upgrade to %s first",
			from, t, ErrNoPath, f.MinorString(), t.Minor-f.Minor, t, MaxKubeletSkew, Version{t.Major, t.Minor - MaxKubeletSkew, 0}.MinorString())
	}
	if f.Minor == t.Minor {
		return nil, nil // a patch upgrade: plan checks each component's version
	}
	var hops []*Release
	prev := from
	for m := f.Minor + 1; m < t.Minor; m++ {
		var hop *Release
		for i := range c.Versions {
			r := &c.Versions[i]
			if r.parsed.Major == t.Major && r.parsed.Minor == m && !r.Withdrawn {
				hop = r // versions are sorted: the last is the newest
			}
		}
		if hop == nil {
			return nil, fmt.Errorf("%s to %s: %w: %s lists no release of v%d.%d to pass through", from, t, ErrNoPath, c.Source, t.Major, m)
		}
		if !hop.allowsAll(prev) {
			return nil, fmt.Errorf("%s to %s: %w: %s does not list %s among its upgrade sources", from, t, ErrNoPath, hop.Version, prev)
		}
		hops = append(hops, hop)
		prev = Range{From: hop.parsed, To: hop.parsed, text: hop.Version}
	}
	if !to.allowsAll(prev) {
		return nil, fmt.Errorf("%s to %s: %w: %s does not list %s among its upgrade sources", from, t, ErrNoPath, to.Version, prev)
	}
	return hops, nil
}

// allowsAll reports whether every version of rg may upgrade to r; a
// whole minor is checked by its first and last patch.
func (r *Release) allowsAll(rg Range) bool {
	for _, rr := range r.upgrade {
		if rr.Contains(rg.From) && rr.Contains(rg.To) {
			return true
		}
	}
	return false
}
