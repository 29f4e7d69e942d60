// Package release is the release an upgrade moves a cluster to, as
// imported into it (its record, trusted only after its signed manifest
// verified against the operator's key) or read from a verified bundle,
// and what of it each node gets and where: the files by cluster kind and
// node role, the paths they are staged and backed up at.
package release

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
)

// Release is a version to upgrade to, as imported into the cluster: its
// record, trusted only after its signed bundle.json verified against the
// operator's key.
type Release struct {
	Version  catalog.Version
	Record   *cluster.Available
	Manifest *bundle.Manifest
	// Catalog is the catalog entry the signed manifest carries.
	Catalog *catalog.Release
	// Hops are the releases the control plane passes through before
	// Version (bundle create --from), oldest first, each a Release of its
	// own: its Manifest holds the hop's files.
	Hops []*Release
}

// Chain is every release the control plane moves to, in order: the hops,
// then the target.
func (t *Release) Chain() []*Release {
	return append(append([]*Release{}, t.Hops...), t)
}

// hops makes the Targets of a verified manifest's hops.
func hops(m *bundle.Manifest, r *cluster.Available) []*Release {
	var out []*Release
	for i := range m.Hops {
		h := &m.Hops[i]
		rel := h.Release // checked when the manifest was read
		hm := &bundle.Manifest{SchemaVersion: m.SchemaVersion, Kind: m.Kind, KubernetesVersion: rel.Version, Arches: m.Arches,
			Tool: m.Tool, Created: m.Created, Signer: m.Signer, Release: rel, Files: h.Files}
		out = append(out, &Release{Version: rel.Parsed(), Record: r, Manifest: hm, Catalog: &rel})
	}
	return out
}

// ErrNotImported means the cluster holds no record of the version.
var ErrNotImported = errors.New("not imported into this cluster")

// Load finds the cluster's record of version and verifies it. Of
// several records of one version (imports of different bundles), the most
// recently made bundle that verifies wins.
func Load(ctx context.Context, c kubernetes.Interface, version string, trust bundle.Trust) (*Release, error) {
	v, err := catalog.ParseVersion(version)
	if err != nil {
		return nil, err
	}
	records, err := cluster.ListAvailable(ctx, c)
	if err != nil {
		return nil, err
	}
	var errs []error
	var found *Release
	for _, r := range records {
		if r.KubernetesVersion != v.String() {
			continue
		}
		t, err := verifyRecord(r, trust)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if found == nil || t.Manifest.Created.After(found.Manifest.Created) {
			found = t
		}
	}
	switch {
	case found != nil:
		return found, nil
	case len(errs) > 0:
		return nil, errors.Join(errs...)
	}
	return nil, fmt.Errorf("%s: %w: import its bundle first (./k8s-%s-linux-ARCH.run --upgrade ...)", v, ErrNotImported, v)
}

func verifyRecord(r *cluster.Available, trust bundle.Trust) (*Release, error) {
	name := cluster.Namespace + "/" + cluster.RecordName(r.KubernetesVersion, r.BundleDigest)
	m, err := bundle.VerifyManifest(r.Manifest, r.Signature, trust)
	if err != nil {
		return nil, fmt.Errorf("record configmap %s: %w", name, err)
	}
	if m.KubernetesVersion != r.KubernetesVersion {
		return nil, fmt.Errorf("record configmap %s: says %s, its signed bundle.json %s", name, r.KubernetesVersion, m.KubernetesVersion)
	}
	// The record's file list is not signed: every file must be the signed
	// manifest's, byte for byte.
	signed := map[string]bundle.File{}
	for _, f := range m.Files {
		signed[f.Path] = f
	}
	for _, h := range m.Hops {
		for _, f := range h.Files {
			signed[f.Path] = f
		}
	}
	for _, f := range r.Files {
		if s, ok := signed[f.Path]; !ok || s.SHA256 != f.SHA256 || s.Size != f.Size {
			return nil, fmt.Errorf("record configmap %s: file %s (sha256 %s) is not the signed bundle's", name, f.Path, f.SHA256)
		}
	}
	rel := m.Release
	if err := rel.Check("record configmap " + name); err != nil {
		return nil, err
	}
	return &Release{Version: rel.Parsed(), Record: r, Manifest: m, Catalog: &rel, Hops: hops(m, r)}, nil
}

// FromBundle is the release a verified bundle file holds (staging from
// the file, without the registry).
func FromBundle(m *bundle.Manifest) (*Release, error) {
	rel := m.Release
	if err := rel.Check("bundle " + bundle.ManifestName); err != nil {
		return nil, err
	}
	return &Release{Version: rel.Parsed(), Manifest: m, Catalog: &rel, Hops: hops(m, nil)}, nil
}

// CheckArtifacts says every artifact the record names (where nodes and
// this machine fetch the files, with the registry's credentials) is in
// the registry the run uses, by digest: the record is not signed, so it
// may not choose another host to send them to.
func (t *Release) CheckArtifacts(domain string) error {
	if t.Record == nil {
		return nil
	}
	for _, f := range t.Record.Files {
		if f.Artifact == "" {
			continue
		}
		d, err := name.NewDigest(f.Artifact, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("record of %s: file %s: artifact %q: %w", t.Version, f.Path, f.Artifact, err)
		}
		if host := d.Context().RegistryStr(); host != domain {
			return fmt.Errorf("record of %s: file %s: artifact %q is on %s, not the registry this run uses (%s): refused, since the record is not signed (import the bundle into %s again, or name its registry with --domain)",
				t.Version, f.Path, f.Artifact, host, domain, domain)
		}
	}
	return nil
}

// SHA256 is the signed sha256 of file name for arch (an empty arch is
// ArchOr's default); "" when the bundle has no such file.
func (t *Release) SHA256(name, arch string) string {
	f, _, _ := t.File(name, ArchOr(arch))
	return f.SHA256
}

// File returns the signed file name for arch, and its artifact in the
// private registry ("" when binaries were not pushed there).
func (t *Release) File(name, arch string) (bundle.File, string, bool) {
	for _, f := range t.Manifest.Files {
		if f.Name == name && f.Arch == arch {
			artifact := ""
			if t.Record != nil {
				for _, r := range t.Record.Files {
					if r.Path == f.Path {
						artifact = r.Artifact
					}
				}
			}
			return f, artifact, true
		}
	}
	return bundle.File{}, "", false
}

// ErrNoAgent means the release's bundle carries no agent image (it was
// made without bundle create --agent).
var ErrNoAgent = errors.New("the bundle carries no agent image (bundle create --agent)")

// AgentImage is the agent's image (REPOSITORY@DIGEST) as the record says
// import pushed it to domain: the image the signed manifest names under
// repository, at the digest the manifest signs, on the registry the run
// uses (the record is not signed).
func (t *Release) AgentImage(repository, domain string) (string, error) {
	var signed *bundle.Image
	for i, im := range t.Manifest.Images {
		if r, err := name.ParseReference(im.Ref, name.WeakValidation); err == nil && r.Context().Name() == repository {
			signed = &t.Manifest.Images[i]
		}
	}
	if signed == nil {
		return "", fmt.Errorf("%s: %w", t.Version, ErrNoAgent)
	}
	if t.Record == nil {
		return "", fmt.Errorf("%s: not imported: the agent image %s is in no registry", t.Version, signed.Ref)
	}
	for _, im := range t.Record.Images {
		if im.Ref != signed.Ref {
			continue
		}
		if im.Digest != signed.Digest {
			return "", fmt.Errorf("record of %s: agent image %s pushed at %s, not the signed %s: refused (import the bundle again)", t.Version, im.Target, im.Digest, signed.Digest)
		}
		tgt, err := name.ParseReference(im.Target, name.WeakValidation)
		if err != nil {
			return "", fmt.Errorf("record of %s: agent image target %q: %w", t.Version, im.Target, err)
		}
		if host := tgt.Context().RegistryStr(); host != domain {
			return "", fmt.Errorf("record of %s: agent image %s is on %s, not the registry this run uses (%s): refused, since the record is not signed", t.Version, im.Target, host, domain)
		}
		return tgt.Context().Digest(signed.Digest).String(), nil
	}
	return "", fmt.Errorf("record of %s: the agent image %s was not pushed (import the bundle again)", t.Version, signed.Ref)
}
