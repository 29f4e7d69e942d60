// Package bundle is kubelift's signed offline bundle: one tar stream that
// starts with a manifest (bundle.json) and its detached signature, followed
// by an OCI image layout and binaries. It creates bundles, verifies them in
// one streaming pass (signature before anything is written, every entry
// hashed as it passes), extracts them atomically, and wraps them as
// self-extracting .run installers.
package bundle

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/catalog"
)

// SchemaVersion of bundle.json written and read by this build.
const SchemaVersion = 1

// Kind marks a kubelift bundle manifest.
const Kind = "kubelift.dev/bundle"

// Names of the first two entries of every bundle.
const (
	ManifestName  = "bundle.json"
	SignatureName = "bundle.json.sig"
	// LayoutDir holds the OCI image layout inside a bundle.
	LayoutDir = "images"
)

// Limits on the manifest and signature read into memory.
const (
	maxManifestSize  = 64 << 20
	maxSignatureSize = 4 << 10
)

// Manifest is bundle.json: everything the bundle holds, signed as a whole.
type Manifest struct {
	SchemaVersion     int       `json:"schemaVersion"`
	Kind              string    `json:"kind"`
	KubernetesVersion string    `json:"kubernetesVersion"`
	Arches            []string  `json:"arches"`
	Tool              Tool      `json:"tool"`
	Created           time.Time `json:"created"`
	// Signer is the fingerprint of the signing key; empty when unsigned.
	Signer string `json:"signer"`
	// Release is the catalog entry of KubernetesVersion, carried along so
	// the air-gapped side needs no catalog of its own.
	Release catalog.Release `json:"release"`
	Images  []Image         `json:"images"`
	Files   []File          `json:"files"`
	// Hops are the releases the control plane passes through on the way
	// to KubernetesVersion, oldest first (bundle create --from), each
	// with its control-plane binaries; their images are in Images.
	Hops    []Hop   `json:"hops,omitempty"`
	Entries []Entry `json:"entries"`
	// InstallerSHA256 and InstallerSize describe the upgrade program a .run
	// file carries after the tar stream; empty for plain bundles. Kept flat
	// so the shell stub can find it with grep.
	InstallerSHA256 string `json:"installerSha256,omitempty"`
	InstallerSize   int64  `json:"installerSize,omitempty"`
	InstallerArch   string `json:"installerArch,omitempty"`

	// Raw and Signature are the bytes as read from a verified bundle.
	Raw       []byte `json:"-"`
	Signature []byte `json:"-"`
}

// Hop is a release the control plane passes through.
type Hop struct {
	Release catalog.Release `json:"release"`
	Files   []File          `json:"files"`
}

// Tool records what made the bundle.
type Tool struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// Image is one image in the bundle's OCI layout.
type Image struct {
	// Ref is the upstream reference (as in the catalog or --image).
	Ref string `json:"ref"`
	// PullFrom is where it was fetched (after --registry-mirror).
	PullFrom  string   `json:"pullFrom"`
	Digest    string   `json:"digest"`
	MediaType string   `json:"mediaType"`
	Size      int64    `json:"size"`
	Platforms []string `json:"platforms"`
	// Blobs counts the blobs of this image (some shared with others).
	Blobs int `json:"blobs"`
	// Bytes is the sum of this image's blob sizes.
	Bytes int64 `json:"bytes"`
}

// File is a binary or archive in the bundle.
type File struct {
	Name string `json:"name"`
	// Version is a node-stack part's (containerd v2.3.7, from the
	// catalog's nodeStack); empty for the release's own files.
	Version string `json:"version,omitempty"`
	Arch    string `json:"arch,omitempty"`
	Path    string `json:"path"`
	URL     string `json:"url"`
	SHA256  string `json:"sha256"`
	Size    int64  `json:"size"`
	// HashSkip, on a kubelet, says it honours kubelift's hash-skip file
	// (kubelift's kubelet build; upstream's does not), decided when the
	// bundle was made, so a plan can say which restarts it avoids.
	HashSkip bool `json:"hashSkip,omitempty"`
}

// KubeletHashSkip reports whether the bundle's kubelet for arch honours
// the hash-skip file; false when the bundle has no kubelet for arch.
func (m *Manifest) KubeletHashSkip(arch string) bool {
	for _, f := range m.Files {
		if f.Name == "kubelet" && f.Arch == arch {
			return f.HashSkip
		}
	}
	return false
}

// Entry is one tar entry after the signature.
type Entry struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// Offset is where the entry's data starts in the file being verified
	// (set by Verify; not part of the manifest).
	Offset int64 `json:"-"`
}

// Marshal encodes the manifest as signed (indented: the .run stub greps it).
func (m *Manifest) Marshal() ([]byte, error) {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// TotalSize is the sum of all entry sizes.
func (m *Manifest) TotalSize() int64 {
	var n int64
	for _, e := range m.Entries {
		n += e.Size
	}
	return n
}

// parseManifest decodes and checks a manifest read from a bundle.
func parseManifest(data []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", ManifestName, err)
	}
	m.Raw = data
	if m.Kind != Kind {
		return nil, fmt.Errorf("%s: kind %q: not a kubelift bundle", ManifestName, m.Kind)
	}
	if m.SchemaVersion != SchemaVersion {
		return nil, fmt.Errorf("%s: schemaVersion %d: this kubelift reads %d", ManifestName, m.SchemaVersion, SchemaVersion)
	}
	seen := map[string]bool{ManifestName: true, SignatureName: true}
	for _, e := range m.Entries {
		if err := checkPath(e.Path); err != nil {
			return nil, fmt.Errorf("%s: entry %q: %w", ManifestName, e.Path, err)
		}
		if seen[e.Path] {
			return nil, fmt.Errorf("%s: entry %q: %w", ManifestName, e.Path, ErrDuplicateEntry)
		}
		seen[e.Path] = true
		if e.Size < 0 {
			return nil, fmt.Errorf("%s: entry %q: size %d", ManifestName, e.Path, e.Size)
		}
		if !IsSHA256(e.SHA256) {
			return nil, fmt.Errorf("%s: entry %q: sha256 %q is not 64 lowercase hex digits", ManifestName, e.Path, e.SHA256)
		}
	}
	if m.InstallerSHA256 != "" && !IsSHA256(m.InstallerSHA256) {
		return nil, fmt.Errorf("%s: installerSha256 %q is not 64 lowercase hex digits", ManifestName, m.InstallerSHA256)
	}
	if err := m.checkFiles(); err != nil {
		return nil, fmt.Errorf("%s: %w", ManifestName, err)
	}
	if err := m.checkHops(); err != nil {
		return nil, fmt.Errorf("%s: %w", ManifestName, err)
	}
	return &m, nil
}

// IsSHA256 says s is a sha256 as kubelift writes it: 64 lowercase hex
// digits (a value a node script compares and a path may be built from).
func IsSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// checkFiles checks that each file the manifest names is one of its
// entries, of the same sha256: a file's sha256 is what nodes check the
// staged file against, so it must be the one the entry was verified by.
func (m *Manifest) checkFiles() error {
	sums := make(map[string]string, len(m.Entries))
	for _, e := range m.Entries {
		sums[e.Path] = e.SHA256
	}
	for i, f := range m.Files {
		if sum, ok := sums[f.Path]; !ok || sum != f.SHA256 {
			return fmt.Errorf("files[%d] (%s): %q of sha256 %q is not an entry of that sha256", i, f.Name, f.Path, f.SHA256)
		}
	}
	return nil
}

// checkHops checks each hop's release, that hops are listed oldest first
// and older than the target, and that each hop file is an entry of the
// same sha256 under hops/VERSION/.
func (m *Manifest) checkHops() error {
	sums := make(map[string]string, len(m.Entries))
	for _, e := range m.Entries {
		sums[e.Path] = e.SHA256
	}
	target, err := catalog.ParseVersion(m.KubernetesVersion)
	if err != nil {
		return fmt.Errorf("kubernetesVersion: %w", err)
	}
	prev := catalog.Version{}
	for i := range m.Hops {
		h := &m.Hops[i]
		where := fmt.Sprintf("hops[%d]", i)
		if err := h.Release.Check(ManifestName + " " + where); err != nil {
			return err
		}
		v := h.Release.Parsed()
		if v.Compare(prev) <= 0 || v.Compare(target) >= 0 {
			return fmt.Errorf("%s: %s: hops must be listed oldest first, each older than %s", where, h.Release.Version, m.KubernetesVersion)
		}
		prev = v
		for _, f := range h.Files {
			if !strings.HasPrefix(f.Path, "hops/"+h.Release.Version+"/") || sums[f.Path] != f.SHA256 {
				return fmt.Errorf("%s: file %q: not an entry of sha256 %s under hops/%s/", where, f.Path, f.SHA256, h.Release.Version)
			}
		}
	}
	return nil
}

// checkPath accepts clean, relative, slash-separated paths only.
func checkPath(p string) error {
	switch {
	case p == "" || strings.HasPrefix(p, "/") || strings.Contains(p, "\\"):
		return ErrUnsafePath
	case path.Clean(p) != p || p == "." || p == ".." || strings.HasPrefix(p, "../"):
		return ErrUnsafePath
	}
	return nil
}
