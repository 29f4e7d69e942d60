package catalog

import (
	"fmt"
	"strings"

	utilversion "k8s.io/apimachinery/pkg/util/version"
)

// Version is a Kubernetes release version, vMAJOR.MINOR.PATCH.
type Version struct {
	Major, Minor, Patch int
}

// ParseVersion parses a version kubelift itself writes or is given (a
// catalog entry, a flag): "v1.31.4", the leading v optional, with
// k8s.io/apimachinery's strict semantic-version parser (ParseSemantic);
// pre-releases, build metadata and blanks are refused.
func ParseVersion(s string) (Version, error) {
	v, err := parseSemantic(s)
	if err != nil {
		return Version{}, fmt.Errorf("version %q: want vMAJOR.MINOR.PATCH: %w", s, err)
	}
	if v.PreRelease() != "" || v.BuildMetadata() != "" {
		return Version{}, fmt.Errorf("version %q: want vMAJOR.MINOR.PATCH, a released version", s)
	}
	return fromSemantic(s, v)
}

// parseSemantic is utilversion.ParseSemantic without the blanks it
// forgives.
func parseSemantic(s string) (*utilversion.Version, error) {
	if strings.TrimSpace(s) != s {
		return nil, fmt.Errorf("blanks around it")
	}
	return utilversion.ParseSemantic(s)
}

// fromSemantic is v as a Version, refused when a number does not fit.
func fromSemantic(s string, v *utilversion.Version) (Version, error) {
	const most = 1<<31 - 1
	if v.Major() > most || v.Minor() > most || v.Patch() > most {
		return Version{}, fmt.Errorf("%q is not a version: a number is out of range", s)
	}
	return Version{int(v.Major()), int(v.Minor()), int(v.Patch())}, nil
}

// String returns the canonical form, v1.31.4.
func (v Version) String() string { return fmt.Sprintf("v%d.%d.%d", v.Major, v.Minor, v.Patch) }

// MinorString returns v1.31.
func (v Version) MinorString() string { return fmt.Sprintf("v%d.%d", v.Major, v.Minor) }

// Compare returns -1, 0 or 1 as v is older than, equal to or newer than o.
func (v Version) Compare(o Version) int {
	for _, d := range [3]int{v.Major - o.Major, v.Minor - o.Minor, v.Patch - o.Patch} {
		if d < 0 {
			return -1
		}
		if d > 0 {
			return 1
		}
	}
	return 0
}

// lastOfMinor is the newest version of v's minor there can be: the end of
// a range that holds every later patch.
func (v Version) lastOfMinor() Version { return Version{v.Major, v.Minor, 1<<31 - 1} }

// Range is a set of versions written in the catalog as "v1.30" (every patch
// of a minor), "v1.31.0-v1.31.3" (inclusive) or "v1.31.2" (exact).
type Range struct {
	From, To Version
	text     string
}

// ParseRange parses one upgradeFrom/downgradeTo item.
func ParseRange(s string) (Range, error) {
	if from, to, ok := strings.Cut(s, "-"); ok {
		f, err := ParseVersion(from)
		if err != nil {
			return Range{}, fmt.Errorf("range %q: %w", s, err)
		}
		t, err := ParseVersion(to)
		if err != nil {
			return Range{}, fmt.Errorf("range %q: %w", s, err)
		}
		if t.Compare(f) < 0 {
			return Range{}, fmt.Errorf("range %q: end is older than start", s)
		}
		return Range{From: f, To: t, text: s}, nil
	}
	if parts := strings.Split(strings.TrimPrefix(s, "v"), "."); len(parts) == 2 {
		v, err := ParseVersion(s + ".0")
		if err != nil {
			return Range{}, fmt.Errorf("range %q: %w", s, err)
		}
		return Range{From: v, To: v.lastOfMinor(), text: s}, nil
	}
	v, err := ParseVersion(s)
	if err != nil {
		return Range{}, fmt.Errorf("range %q: %w", s, err)
	}
	return Range{From: v, To: v, text: s}, nil
}

// Contains reports whether v lies in the range.
func (r Range) Contains(v Version) bool { return v.Compare(r.From) >= 0 && v.Compare(r.To) <= 0 }

// String returns the range as written in the catalog.
func (r Range) String() string { return r.text }

// ParseReported parses a version something outside kubelift reported (a
// Node's status, a binary's --version): strict semantic versioning with
// the leading v Kubernetes prints (k8s.io/apimachinery's ParseSemantic,
// as kubeadm uses), build metadata allowed (v1.30.14+k3s1) and dropped,
// pre-releases, blanks and anything else refused. A value it accepts
// holds only [v0-9A-Za-z.+-].
func ParseReported(s string) (Version, error) {
	if !strings.HasPrefix(s, "v") {
		return Version{}, fmt.Errorf("%q is not a version (want vMAJOR.MINOR.PATCH)", s)
	}
	v, err := parseSemantic(s)
	if err != nil {
		return Version{}, fmt.Errorf("%q is not a version: %w", s, err)
	}
	if v.PreRelease() != "" {
		return Version{}, fmt.Errorf("%q is a pre-release: kubelift upgrades released versions only", s)
	}
	return fromSemantic(s, v)
}
