// Package catalog loads and validates the version catalog: per Kubernetes
// version, the images and binaries that make it up, the allowed upgrade and
// downgrade paths, the kubelet hash era and what the version removed. The
// data lives in manifests/; this package only reads and checks it, so a new
// or withdrawn release is a data change.
package catalog

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"sigs.k8s.io/yaml"

	"github.com/kubelift/kubelift/manifests"
)

// SchemaVersion is the catalog schema this build reads.
const SchemaVersion = 1

// ServerComponents are the programs besides the kubelet that a
// binary-deployed node runs from /usr/local/bin, each as a systemd unit of
// the same name.
var ServerComponents = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"}

// Hash eras of the kubelet's container hash (upgrade-facts.md section 2).
// Which versions belong to which era is data: Catalog.HashEras.
const (
	EraSpew                 = "spew"                   // 1.6 to 1.15: unsupported
	EraJSON                 = "json"                   // 1.16 to 1.26
	EraJSONWithoutResources = "json-without-resources" // 1.27 to 1.30
	EraNameImage            = "name-image"             // 1.31 on
)

var knownEras = map[string]bool{EraSpew: true, EraJSON: true, EraJSONWithoutResources: true, EraNameImage: true}

// HashEra is one row of the era table: the era starting at From.
type HashEra struct {
	Era  string `json:"era"`
	From string `json:"from"`

	from Version
}

// ErrNoHashEra means a version is older than every era in the catalog.
var ErrNoHashEra = errors.New("no kubelet hash era known for this version")

// Catalog is a parsed, validated catalog.
type Catalog struct {
	// Source names where the catalog came from, for error messages.
	Source        string    `json:"-"`
	SchemaVersion int       `json:"schemaVersion"`
	Arches        []string  `json:"arches"`
	HashEras      []HashEra `json:"kubeletHashEras"`
	Versions      []Release `json:"versions"`
}

// Release is one Kubernetes version in the catalog.
type Release struct {
	Version             string   `json:"version"`
	KubeletHashEra      string   `json:"kubeletHashEra"`
	UpgradeFrom         []string `json:"upgradeFrom"`
	DowngradeTo         []string `json:"downgradeTo"`
	RemovedKubeletFlags []string `json:"removedKubeletFlags"`
	// RemovedFlags lists, per control-plane component (kube-apiserver,
	// kube-controller-manager, kube-scheduler, kube-proxy), the flags this
	// minor removed: a component refuses to start with one.
	RemovedFlags map[string][]string `json:"removedFlags,omitempty"`
	RemovedAPIs  []string            `json:"removedAPIs"`
	// ContainerRuntimes lists, per runtime as a node reports it
	// (containerd), the versions this release's kubelet supports
	// (runtimes.go).
	ContainerRuntimes map[string][]string `json:"containerRuntimes,omitempty"`
	Images            []string            `json:"images"`
	Files             []File              `json:"files"`
	// NodeStack is what runs under and beside the kubelet that a bundle
	// carries when asked: containerd, runc, etcd (nodestack.go).
	NodeStack []StackPart `json:"nodeStack,omitempty"`
	Withdrawn bool        `json:"withdrawn,omitempty"`

	parsed      Version
	upgrade     []Range
	downgrade   []Range
	removedAPIs []RemovedAPI
	runtimes    map[string][]Range
}

// RemovedAPI is an entry of removedAPIs: a group-version the release no
// longer serves, or one resource of it when the rest stays.
type RemovedAPI struct {
	Group, Version string
	// Resource is empty when the whole group-version goes.
	Resource string
}

// GroupVersion is "group/version".
func (a RemovedAPI) GroupVersion() string { return a.Group + "/" + a.Version }

func (a RemovedAPI) String() string {
	if a.Resource == "" {
		return a.GroupVersion()
	}
	return a.GroupVersion() + "/" + a.Resource
}

var (
	apiGroupRE    = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$|^(apps|batch|policy|autoscaling)$`)
	apiVersionRE  = regexp.MustCompile(`^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$`)
	apiResourceRE = regexp.MustCompile(`^[a-z][a-z0-9]*$`)
)

// ParseRemovedAPI reads "group/version" or "group/version/resource"
// (resource as the API serves it: lowercase plural). The core group is
// never removed, so a group is always named.
func ParseRemovedAPI(s string) (RemovedAPI, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 {
		return RemovedAPI{}, fmt.Errorf("%q: want group/version or group/version/resource", s)
	}
	a := RemovedAPI{Group: parts[0], Version: parts[1]}
	if len(parts) == 3 {
		a.Resource = parts[2]
	}
	switch {
	case !apiGroupRE.MatchString(a.Group):
		return RemovedAPI{}, fmt.Errorf("%q: %q is not an API group", s, a.Group)
	case !apiVersionRE.MatchString(a.Version):
		return RemovedAPI{}, fmt.Errorf("%q: %q is not an API version", s, a.Version)
	case len(parts) == 3 && !apiResourceRE.MatchString(a.Resource):
		return RemovedAPI{}, fmt.Errorf("%q: %q is not a resource (lowercase plural)", s, a.Resource)
	}
	return a, nil
}

// File is a binary or archive of a release, fetched from URL.
type File struct {
	Name string `json:"name"`
	// URL may contain {arch}.
	URL string `json:"url"`
	// SHA256 pins the content per arch; missing arches are checked against
	// the upstream URL + ".sha256".
	SHA256 map[string]string `json:"sha256,omitempty"`
}

// Error is a catalog problem, naming the file, version and field.
type Error struct {
	Source, Version, Field string
	Err                    error
}

func (e *Error) Error() string {
	where := e.Source
	if e.Version != "" {
		where += ": version " + e.Version
	}
	if e.Field != "" {
		where += ": " + e.Field
	}
	return where + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// ErrUnknownVersion is returned by Lookup for a version the catalog lacks.
var ErrUnknownVersion = errors.New("version not in catalog")

// Default returns the built-in catalog.
func Default() (*Catalog, error) { return Parse(manifests.CatalogName, manifests.Catalog) }

// Load reads a catalog file, or the built-in one when path is empty.
func Load(path string) (*Catalog, error) {
	if path == "" {
		return Default()
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read catalog: %w", err)
	}
	return Parse(path, data)
}

var (
	nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	hexRE  = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Parse decodes and validates catalog data; source names it in errors.
func Parse(source string, data []byte) (*Catalog, error) {
	var c Catalog
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, &Error{Source: source, Err: err}
	}
	c.Source = source
	if c.SchemaVersion != SchemaVersion {
		return nil, &Error{Source: source, Field: "schemaVersion", Err: fmt.Errorf("is %d, this kubelift reads %d", c.SchemaVersion, SchemaVersion)}
	}
	if len(c.Arches) == 0 {
		return nil, &Error{Source: source, Field: "arches", Err: errors.New("is empty")}
	}
	if len(c.Versions) == 0 {
		return nil, &Error{Source: source, Field: "versions", Err: errors.New("is empty")}
	}
	if len(c.HashEras) == 0 {
		return nil, &Error{Source: source, Field: "kubeletHashEras", Err: errors.New("is empty")}
	}
	for i := range c.HashEras {
		e := &c.HashEras[i]
		field := fmt.Sprintf("kubeletHashEras[%d]", i)
		if !knownEras[e.Era] {
			return nil, &Error{Source: source, Field: field + ".era", Err: fmt.Errorf("%q is not one of spew, json, json-without-resources, name-image", e.Era)}
		}
		v, err := ParseVersion(e.From)
		if err != nil {
			return nil, &Error{Source: source, Field: field + ".from", Err: err}
		}
		if i > 0 && v.Compare(c.HashEras[i-1].from) <= 0 {
			return nil, &Error{Source: source, Field: field + ".from", Err: fmt.Errorf("%s: eras must be listed oldest first", e.From)}
		}
		e.from = v
	}
	seen := map[string]bool{}
	for i := range c.Versions {
		r := &c.Versions[i]
		if err := r.validate(c.Arches); err != nil {
			var ce *Error
			if errors.As(err, &ce) {
				ce.Source = source
				return nil, ce
			}
			return nil, err
		}
		if seen[r.Version] {
			return nil, &Error{Source: source, Version: r.Version, Err: errors.New("listed twice")}
		}
		if era, err := c.HashEraFor(r.parsed); err != nil || era != r.KubeletHashEra {
			return nil, &Error{Source: source, Version: r.Version, Field: "kubeletHashEra", Err: fmt.Errorf("%q, but kubeletHashEras puts %s in %q", r.KubeletHashEra, r.Version, era)}
		}
		seen[r.Version] = true
	}
	sort.SliceStable(c.Versions, func(i, j int) bool { return c.Versions[i].parsed.Compare(c.Versions[j].parsed) < 0 })
	return &c, nil
}

// Check validates a release read on its own (the copy a bundle's signed
// manifest carries) and prepares its version and ranges, as Parse does for
// every release of a catalog. source names where it came from. The
// catalog's arches are not known there, so pinned sums of any arch pass.
func (r *Release) Check(source string) error {
	if err := r.validate(nil); err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			ce.Source = source
		}
		return err
	}
	return nil
}

func (r *Release) validate(arches []string) error {
	fail := func(field string, format string, args ...any) error {
		return &Error{Version: r.Version, Field: field, Err: fmt.Errorf(format, args...)}
	}
	r.upgrade, r.downgrade = nil, nil // prepared anew: Check may run again after a change
	v, err := ParseVersion(r.Version)
	if err != nil {
		return fail("version", "%v", err)
	}
	if v.String() != r.Version {
		return fail("version", "write it as %s", v)
	}
	r.parsed = v
	if !knownEras[r.KubeletHashEra] {
		return fail("kubeletHashEra", "%q is not one of spew, json, json-without-resources, name-image", r.KubeletHashEra)
	}
	for i, s := range r.UpgradeFrom {
		rg, err := ParseRange(s)
		if err != nil {
			return fail(fmt.Sprintf("upgradeFrom[%d]", i), "%v", err)
		}
		if rg.To.Compare(v) >= 0 {
			return fail(fmt.Sprintf("upgradeFrom[%d]", i), "%q reaches %s or newer: an upgrade source must be older", s, v)
		}
		if rg.From.Major != v.Major || rg.From.Minor < v.Minor-1 {
			return fail(fmt.Sprintf("upgradeFrom[%d]", i), "%q skips a minor version: sources are the same or the previous minor", s)
		}
		r.upgrade = append(r.upgrade, rg)
	}
	for i, s := range r.DowngradeTo {
		rg, err := ParseRange(s)
		if err != nil {
			return fail(fmt.Sprintf("downgradeTo[%d]", i), "%v", err)
		}
		if rg.From.Major != v.Major || rg.From.Minor != v.Minor || rg.To.Minor != v.Minor || rg.To.Patch >= v.Patch {
			return fail(fmt.Sprintf("downgradeTo[%d]", i), "%q: downgrades are to a lower patch of %s only", s, v.MinorString())
		}
		r.downgrade = append(r.downgrade, rg)
	}
	if err := r.validateRuntimes(); err != nil {
		return err
	}
	for i, f := range r.RemovedKubeletFlags {
		if !strings.HasPrefix(f, "--") {
			return fail(fmt.Sprintf("removedKubeletFlags[%d]", i), "%q: write flags with their leading --", f)
		}
	}
	for comp, flags := range r.RemovedFlags {
		if !contains(ServerComponents, comp) {
			return fail("removedFlags."+comp, "not a component: want one of %s", strings.Join(ServerComponents, ", "))
		}
		for i, f := range flags {
			if !strings.HasPrefix(f, "--") {
				return fail(fmt.Sprintf("removedFlags.%s[%d]", comp, i), "%q: write flags with their leading --", f)
			}
		}
	}
	r.removedAPIs = nil
	for i, a := range r.RemovedAPIs {
		api, err := ParseRemovedAPI(a)
		if err != nil {
			return fail(fmt.Sprintf("removedAPIs[%d]", i), "%v", err)
		}
		r.removedAPIs = append(r.removedAPIs, api)
	}
	if len(r.Images) == 0 {
		return fail("images", "is empty")
	}
	for i, ref := range r.Images {
		if _, err := name.ParseReference(ref, name.StrictValidation); err != nil {
			return fail(fmt.Sprintf("images[%d]", i), "%v", err)
		}
	}
	names := map[string]bool{}
	for i, f := range r.Files {
		field := fmt.Sprintf("files[%d]", i)
		if !nameRE.MatchString(f.Name) {
			return fail(field+".name", "%q: use lowercase letters, digits, '.', '_' and '-'", f.Name)
		}
		if names[f.Name] {
			return fail(field+".name", "%q listed twice", f.Name)
		}
		names[f.Name] = true
		u, err := url.Parse(strings.ReplaceAll(f.URL, "{arch}", "amd64"))
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return fail(field+".url", "%q is not an http(s) URL", f.URL)
		}
		for arch, sum := range f.SHA256 {
			if arches != nil && !contains(arches, arch) {
				return fail(field+".sha256", "arch %q is not in the catalog's arches", arch)
			}
			if !hexRE.MatchString(sum) {
				return fail(field+".sha256."+arch, "%q is not 64 lowercase hex digits", sum)
			}
		}
	}
	return r.validateNodeStack(arches)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// HashEraFor returns the kubelet hash era of any version, from the era table.
func (c *Catalog) HashEraFor(v Version) (string, error) {
	era := ""
	for _, e := range c.HashEras {
		if v.Compare(e.from) >= 0 {
			era = e.Era
		}
	}
	if era == "" {
		return "", fmt.Errorf("%s: %s: %w", c.Source, v, ErrNoHashEra)
	}
	return era, nil
}

// Lookup returns the release for version v ("v1.31.4").
func (c *Catalog) Lookup(v string) (*Release, error) {
	pv, err := ParseVersion(v)
	if err != nil {
		return nil, err
	}
	for i := range c.Versions {
		if c.Versions[i].parsed == pv {
			return &c.Versions[i], nil
		}
	}
	return nil, fmt.Errorf("%s: %s: %w (it has %s)", c.Source, pv, ErrUnknownVersion, strings.Join(c.VersionList(), ", "))
}

// VersionList returns every version in the catalog, oldest first.
func (c *Catalog) VersionList() []string {
	out := make([]string, len(c.Versions))
	for i, r := range c.Versions {
		out[i] = r.Version
	}
	return out
}

// SupportsArch reports whether the catalog lists arch.
func (c *Catalog) SupportsArch(arch string) bool { return contains(c.Arches, arch) }

// Removed returns what the release stops serving (removedAPIs, parsed).
func (r *Release) Removed() []RemovedAPI { return r.removedAPIs }

// Parsed returns the release's version.
func (r *Release) Parsed() Version { return r.parsed }

// CanUpgradeFrom reports whether a cluster at from may upgrade to r.
func (r *Release) CanUpgradeFrom(from Version) bool { return anyContains(r.upgrade, from) }

// CanDowngradeTo reports whether r may be rolled back to to.
func (r *Release) CanDowngradeTo(to Version) bool { return anyContains(r.downgrade, to) }

func anyContains(rs []Range, v Version) bool {
	for _, rg := range rs {
		if rg.Contains(v) {
			return true
		}
	}
	return false
}

// URLFor returns the file's URL for an arch.
func (f File) URLFor(arch string) string { return strings.ReplaceAll(f.URL, "{arch}", arch) }
