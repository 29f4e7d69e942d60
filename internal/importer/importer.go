// Package importer carries a verified bundle into the air gap's private
// registry: it verifies the bundle, pushes every image under the
// operator's domain and namespace keeping upstream manifest bytes (and so
// digests), sends only what the registry lacks, and checks afterwards that
// every image resolves by digest.
package importer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/progress"
	"github.com/kubelift/kubelift/internal/registry"
)

// Options configure Import.
type Options struct {
	Bundle string
	Trust  bundle.Trust
	// Domain is the registry host[:port]; Namespace the path below it.
	Domain, Namespace string
	// KeepPath keeps the upstream repository path below Namespace
	// (coredns/coredns) instead of its last element (coredns).
	KeepPath bool
	Access   registry.Access
	Jobs     int
	DryRun   bool
	Progress progress.Sink
	Log      *slog.Logger
	// Recorder, when set, records the version as available in the cluster
	// after a successful push.
	Recorder Recorder
	// SkipFiles leaves the bundle's binaries out of the registry (for
	// registries that refuse OCI artifacts); they are then staged from the
	// bundle file.
	SkipFiles bool
	// CacheDir keeps the binaries' zstd copies, pushed beside them for
	// nodes to pull (none when empty, or in a dry run).
	CacheDir string
}

// Recorder keeps the record of an imported version (internal/cluster
// writes it as an immutable ConfigMap).
type Recorder interface {
	RecordAvailable(ctx context.Context, a *cluster.Available) (name string, err error)
}

// Result reports an import.
type Result struct {
	Bundle            string        `json:"bundle"`
	KubernetesVersion string        `json:"kubernetesVersion"`
	Registry          string        `json:"registry"`
	DryRun            bool          `json:"dryRun"`
	Images            []ImageResult `json:"images"`
	// Files are the bundle's binaries, pushed as OCI artifacts.
	Files       []FileResult `json:"files,omitempty"`
	UploadBytes int64        `json:"uploadBytes"`
	// BundleDigest is the sha256 of the signed bundle.json.
	BundleDigest string `json:"bundleDigest"`
	// Recorded names the cluster record of the version ("" when none).
	Recorded string `json:"recorded,omitempty"`
}

// ImageResult is one image's outcome.
type ImageResult struct {
	Ref            string `json:"ref"`
	Target         string `json:"target"`
	Digest         string `json:"digest"`
	UpstreamDigest string `json:"upstreamDigest"`
	// DigestKept is false when the bundle held only some platforms of a
	// multi-arch index (see Note): registries refuse an index whose
	// children they lack.
	DigestKept bool   `json:"digestKept"`
	Note       string `json:"note,omitempty"`
	// Platforms lists what a partial index was cut to (see Note).
	Platforms []string `json:"platforms,omitempty"`
	// Action: pushed, present (nothing sent), or with DryRun "would push".
	Action      string `json:"action"`
	Uploaded    int    `json:"blobsUploaded"`
	Mounted     int    `json:"blobsMounted"`
	Present     int    `json:"blobsPresent"`
	UploadBytes int64  `json:"uploadBytes"`
}

// FileResult is one binary's outcome: pushed as an OCI artifact whose one
// layer is the file, by its signed sha256.
type FileResult struct {
	Name string `json:"name"`
	Arch string `json:"arch,omitempty"`
	// Target is the artifact's tag; Artifact names it by digest.
	Target      string `json:"target"`
	Artifact    string `json:"artifact"`
	SHA256      string `json:"sha256"`
	Size        int64  `json:"size"`
	Action      string `json:"action"`
	UploadBytes int64  `json:"uploadBytes"`
	// Zstd is the digest of the file's zstd copy (the layer of the
	// artifact tagged codec.ZstdTag beside it), and ZstdSize its size (""
	// and 0 without one).
	Zstd     string `json:"zstd,omitempty"`
	ZstdSize int64  `json:"zstdSize,omitempty"`
}

// ErrUnresolved means images did not resolve by digest after pushing.
var ErrUnresolved = errors.New("images do not resolve by digest in the registry")

// Import verifies the bundle and pushes its images. With DryRun it contacts
// the registry (checking credentials) and reports, changing nothing.
func Import(ctx context.Context, opts Options) (*Result, error) {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Domain == "" {
		return nil, errors.New("no registry domain")
	}
	// The signature, the manifest and every entry's place and size are
	// checked first; each entry's content as it is read (pushed, or made
	// into a zstd copy): an upload whose content is not the signed one is
	// cut short before its last bytes, so the registry never completes
	// it, and no manifest is pushed after. A dry run reads everything.
	log.Info("checking the bundle", "file", opts.Bundle)
	open := bundle.OpenIndex
	if opts.DryRun {
		open = bundle.Open
	}
	v, err := open(ctx, opts.Bundle, opts.Trust)
	if err != nil {
		return nil, err
	}
	defer v.Close()
	m := v.Manifest
	res := &Result{Bundle: opts.Bundle, KubernetesVersion: m.KubernetesVersion, Registry: opts.Domain, DryRun: opts.DryRun,
		BundleDigest: digestOf(m.Raw)}

	imgs, partial, err := pushImages(v, opts)
	if err != nil {
		return nil, err
	}
	src := newBundleSource(v)
	bfiles := bundleFiles(m)
	var files, copies []*registry.PushImage
	zsts := make([]*encoded, len(bfiles))
	if !opts.SkipFiles {
		if opts.CacheDir != "" && !opts.DryRun {
			log.Info("encoding the binaries with zstd for the nodes to pull", "files", len(bfiles))
		}
		for i, f := range bfiles {
			if opts.CacheDir != "" && !opts.DryRun {
				z, err := zstdCopy(v, opts.CacheDir, f.File)
				if err != nil {
					return nil, err
				}
				// A copy that saves less than a tenth is not worth a
				// second blob: nodes pull the file.
				if z.size*10 < f.Size*9 {
					zsts[i] = z
					src.disk[z.digest] = z.path
				}
			}
			im, mem, err := fileArtifact(opts.Domain, opts.Namespace, f.version, f.File, nil)
			if err != nil {
				return nil, err
			}
			if zsts[i] != nil {
				zim, zmem, err := fileArtifact(opts.Domain, opts.Namespace, f.version, f.File, zsts[i])
				if err != nil {
					return nil, err
				}
				copies = append(copies, zim)
				maps.Copy(src.mem, zmem)
			}
			files = append(files, im)
			maps.Copy(src.mem, mem)
		}
	}
	p := &registry.Pusher{Access: opts.Access, Source: src, Jobs: opts.Jobs, Progress: opts.Progress,
		ImageDone: func(ip *registry.ImagePlan) {
			log.Info("image done", "target", ip.Image.Target.String(), "uploaded", ip.Uploaded, "mounted", ip.Mounted, "present", ip.Present)
		}}
	log.Info("asking the registry what it has", "registry", opts.Domain, "images", len(imgs), "files", len(files))
	all := append(append(append([]*registry.PushImage{}, imgs...), files...), copies...)
	plan, err := p.Plan(ctx, all)
	if err != nil {
		return nil, err
	}
	for _, ip := range plan.Images[len(imgs)+len(files):] {
		res.UploadBytes += ip.UploadBytes
	}
	for i, ip := range plan.Images[len(imgs) : len(imgs)+len(files)] {
		f := bfiles[i]
		r := FileResult{Name: f.Name, Arch: f.Arch, Target: ip.Image.Target.String(), Artifact: ip.Image.Target.Context().Digest(ip.Image.Root().Digest.String()).String(),
			SHA256: f.SHA256, Size: f.Size, UploadBytes: ip.UploadBytes, Action: action(ip, opts.DryRun)}
		if z := zsts[i]; z != nil {
			r.Zstd, r.ZstdSize = z.digest.String(), z.size
		}
		res.UploadBytes += ip.UploadBytes
		res.Files = append(res.Files, r)
	}
	for i, ip := range plan.Images[:len(imgs)] {
		im := ip.Image
		r := ImageResult{Ref: im.Ref, Target: im.Target.String(), Digest: im.Root().Digest.String(), UpstreamDigest: m.Images[i].Digest,
			Uploaded: ip.Uploaded, Mounted: ip.Mounted, Present: ip.Present, UploadBytes: ip.UploadBytes}
		if p := partial[i]; p != nil {
			r.Platforms = p
			r.Note = PartialNote(p, len(p) == 1)
		}
		r.DigestKept = r.Digest == r.UpstreamDigest
		r.Action = action(ip, opts.DryRun)
		res.UploadBytes += ip.UploadBytes
		res.Images = append(res.Images, r)
	}
	if opts.DryRun {
		return res, nil
	}
	log.Info("pushing", "bytes", res.UploadBytes)
	if err := p.Push(ctx, plan); err != nil {
		// What was to be pushed is not all there (a refused entry: no
		// manifest at all); the result says so, not "pushed".
		for i := range res.Images {
			if res.Images[i].Action == "pushed" {
				res.Images[i].Action = ActionStopped
			}
		}
		for i := range res.Files {
			if res.Files[i].Action == "pushed" {
				res.Files[i].Action = ActionStopped
			}
		}
		return res, err
	}
	log.Info("checking every image resolves by digest")
	if err := p.Check(ctx, all); err != nil {
		return res, fmt.Errorf("%w: %w", ErrUnresolved, err)
	}
	if opts.Recorder != nil {
		log.Info("recording the version as available in the cluster")
		name, err := opts.Recorder.RecordAvailable(ctx, availableRecord(res, m))
		if err != nil {
			return res, fmt.Errorf("record %s as available: %w", m.KubernetesVersion, err)
		}
		res.Recorded = name
	}
	return res, nil
}

// ActionStopped is the action of an image or file a failed push did not
// finish (its manifest may not be in the registry).
const ActionStopped = "stopped"

// action says what pushing one image or file did (or, dry, would do).
func action(ip *registry.ImagePlan, dry bool) string {
	switch {
	case ip.ManifestPresent && ip.Uploaded+ip.Mounted == 0:
		return "present"
	case dry:
		return "would push"
	}
	return "pushed"
}

// availableRecord is what the cluster keeps about an import.
func availableRecord(res *Result, m *bundle.Manifest) *cluster.Available {
	a := &cluster.Available{KubernetesVersion: m.KubernetesVersion, BundleDigest: res.BundleDigest, Registry: res.Registry,
		Manifest: m.Raw, Signature: m.Signature}
	for _, im := range res.Images {
		a.Images = append(a.Images, cluster.ImageRecord{Ref: im.Ref, Target: im.Target, Digest: im.Digest})
	}
	pushed := map[string]FileResult{}
	for _, f := range res.Files {
		pushed[f.SHA256] = f
	}
	for _, f := range bundleFiles(m) {
		a.Files = append(a.Files, cluster.BinaryRecord{Name: f.Name, Arch: f.Arch, Path: f.Path, SHA256: f.SHA256, Size: f.Size,
			Artifact: pushed[f.SHA256].Artifact})
	}
	return a
}

// TargetFor returns where an upstream reference goes: DOMAIN/NAMESPACE/NAME
// with NAME the last element of the upstream repository (or all of it with
// keepPath), and the same tag, or the same digest for digest references.
func TargetFor(ref, domain, namespace string, keepPath bool) (name.Reference, error) {
	up, err := name.ParseReference(ref, name.WeakValidation)
	if err != nil {
		return nil, err
	}
	repoPath := up.Context().RepositoryStr()
	if !keepPath {
		repoPath = repoPath[strings.LastIndex(repoPath, "/")+1:]
	}
	target := strings.TrimSuffix(domain, "/") + "/"
	if ns := strings.Trim(namespace, "/"); ns != "" {
		target += ns + "/"
	}
	target += repoPath
	switch r := up.(type) {
	case name.Tag:
		target += ":" + r.TagStr()
	case name.Digest:
		target += "@" + r.DigestStr()
	}
	return name.ParseReference(target, name.WeakValidation)
}

// PartialNote explains an image whose upstream index could not be pushed
// whole, for the platforms the bundle holds.
func PartialNote(platforms []string, tagged bool) string {
	if tagged {
		return fmt.Sprintf("the bundle holds only %s of the upstream multi-arch index; the tag points at that platform's upstream manifest. Bundle with --all-platforms to keep index digests", platforms[0])
	}
	return fmt.Sprintf("the bundle holds only %s of the upstream multi-arch index; pushed an index of just those (a new digest). Bundle with --all-platforms to keep index digests", strings.Join(platforms, ", "))
}

// pushImages turns the bundle's images into push jobs, with, for each whose
// upstream index cannot be pushed whole, the platforms it holds.
func pushImages(v *bundle.Verified, opts Options) ([]*registry.PushImage, [][]string, error) {
	var imgs []*registry.PushImage
	var partials [][]string
	targets := map[string]string{}
	for _, bi := range v.Manifest.Images {
		target, err := TargetFor(bi.Ref, opts.Domain, opts.Namespace, opts.KeepPath)
		if err != nil {
			return nil, nil, fmt.Errorf("image %s: target in %s: %w", bi.Ref, opts.Domain, err)
		}
		if prev, dup := targets[target.String()]; dup {
			return nil, nil, fmt.Errorf("images %s and %s would both be pushed as %s: pass --keep-path", prev, bi.Ref, target)
		}
		targets[target.String()] = bi.Ref
		root, err := readManifest(v, bi.Digest, types.MediaType(bi.MediaType))
		if err != nil {
			return nil, nil, fmt.Errorf("image %s: %w", bi.Ref, err)
		}
		im := &registry.PushImage{Ref: bi.Ref, Target: target}
		var partial []string
		if registry.IsIndex(root.MediaType) {
			im.Manifests, im.Blobs, partial, err = indexManifests(v, root)
			if err != nil {
				return nil, nil, fmt.Errorf("image %s: %w", bi.Ref, err)
			}
		} else {
			im.Manifests = []registry.RawManifest{root}
			if im.Blobs, err = imageBlobs(root.Raw); err != nil {
				return nil, nil, fmt.Errorf("image %s: %w", bi.Ref, err)
			}
		}
		imgs = append(imgs, im)
		partials = append(partials, partial)
	}
	return imgs, partials, nil
}

// indexManifests lists what pushing an index takes. A complete index is
// pushed as is. When the bundle holds only some of its children, a
// registry would refuse it: one child is tagged directly (upstream bytes);
// several get an index of just those (a new digest). partial lists the
// platforms held when the index is not complete.
func indexManifests(v *bundle.Verified, root registry.RawManifest) (manifests []registry.RawManifest, blobs []v1.Descriptor, partial []string, err error) {
	idx, err := v1.ParseIndexManifest(strings.NewReader(string(root.Raw)))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("index %s: %w", root.Digest, err)
	}
	var children []registry.RawManifest
	var included []v1.Descriptor
	seen := map[v1.Hash]bool{}
	for _, d := range idx.Manifests {
		if _, ok := v.Entry(bundle.BlobPath(d.Digest.String())); !ok {
			continue
		}
		child, err := readManifest(v, d.Digest.String(), d.MediaType)
		if err != nil {
			return nil, nil, nil, err
		}
		bs, err := imageBlobs(child.Raw)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("manifest %s: %w", d.Digest, err)
		}
		for _, b := range bs {
			if !seen[b.Digest] {
				seen[b.Digest] = true
				blobs = append(blobs, b)
			}
		}
		children = append(children, child)
		included = append(included, d)
	}
	for _, d := range included {
		partial = append(partial, platform(d))
	}
	switch {
	case len(children) == 0:
		return nil, nil, nil, fmt.Errorf("index %s: the bundle holds none of its manifests", root.Digest)
	case len(children) == len(idx.Manifests):
		return append(children, root), blobs, nil, nil
	case len(children) == 1:
		return children, blobs, partial, nil
	}
	subset, err := subsetIndex(root.Raw, included)
	if err != nil {
		return nil, nil, nil, err
	}
	return append(children, subset), blobs, partial, nil
}

func platform(d v1.Descriptor) string {
	if d.Platform == nil {
		return "unknown platform"
	}
	return d.Platform.OS + "/" + d.Platform.Architecture
}

// subsetIndex keeps the upstream index's fields but lists only included.
func subsetIndex(raw []byte, included []v1.Descriptor) (registry.RawManifest, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		return registry.RawManifest{}, err
	}
	list, err := json.Marshal(included)
	if err != nil {
		return registry.RawManifest{}, err
	}
	doc["manifests"] = list
	out, err := json.Marshal(doc)
	if err != nil {
		return registry.RawManifest{}, err
	}
	var mt struct {
		MediaType types.MediaType `json:"mediaType"`
	}
	_ = json.Unmarshal(raw, &mt)
	if mt.MediaType == "" {
		mt.MediaType = types.OCIImageIndex
	}
	h, _, err := v1.SHA256(strings.NewReader(string(out)))
	if err != nil {
		return registry.RawManifest{}, err
	}
	return registry.RawManifest{Digest: h, MediaType: mt.MediaType, Raw: out}, nil
}

// readManifest reads a manifest blob from the bundle. Its media type is
// the one its own bytes declare (index.json may name it by the OCI type of
// the same shape), else fallback.
func readManifest(v *bundle.Verified, digest string, fallback types.MediaType) (registry.RawManifest, error) {
	p := bundle.BlobPath(digest)
	if e, ok := v.Entry(p); ok && e.Size > 4<<20 {
		return registry.RawManifest{}, fmt.Errorf("manifest %s: %d bytes: not a manifest", digest, e.Size)
	}
	r, err := v.OpenChecked(p)
	if err != nil {
		return registry.RawManifest{}, err
	}
	raw, err := io.ReadAll(r)
	if err != nil {
		return registry.RawManifest{}, err
	}
	h, err := v1.NewHash(digest)
	if err != nil {
		return registry.RawManifest{}, err
	}
	var mt struct {
		MediaType types.MediaType `json:"mediaType"`
	}
	if err := json.Unmarshal(raw, &mt); err != nil {
		return registry.RawManifest{}, fmt.Errorf("manifest %s: %w", digest, err)
	}
	if mt.MediaType == "" {
		mt.MediaType = fallback
	}
	return registry.RawManifest{Digest: h, MediaType: mt.MediaType, Raw: raw}, nil
}

func imageBlobs(raw []byte) ([]v1.Descriptor, error) {
	m, err := v1.ParseManifest(strings.NewReader(string(raw)))
	if err != nil {
		return nil, err
	}
	return append([]v1.Descriptor{m.Config}, m.Layers...), nil
}

func digestOf(b []byte) string {
	h, _, _ := v1.SHA256(strings.NewReader(string(b)))
	return h.String()
}
