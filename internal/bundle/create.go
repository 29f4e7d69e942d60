package bundle

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"

	agentimage "github.com/kubelift/kubelift/internal/agent/image"
	"github.com/kubelift/kubelift/internal/buildinfo"
	"github.com/kubelift/kubelift/internal/cas"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/fetch"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/parallel"
	"github.com/kubelift/kubelift/internal/progress"
	"github.com/kubelift/kubelift/internal/registry"
)

// Format is the output file format.
type Format string

// Formats of a bundle file.
const (
	FormatTar Format = "tar"
	FormatRun Format = "run"
)

// CreateOptions configure Create and MakePlan.
type CreateOptions struct {
	Catalog           *catalog.Catalog
	KubernetesVersion string
	// From, a minor ("v1.30") or version, also bundles the releases the
	// control plane passes through from there (catalog.Hops).
	From            string
	Arches          []string
	RegistryMirrors []Mirror
	URLMirrors      []Mirror
	ExtraImages     []string
	ExtraFiles      []ExtraFile
	// AllPlatforms bundles every platform of multi-arch images, so import
	// can push their indexes with the upstream digest.
	AllPlatforms bool
	// KubeletBinary replaces the catalog's kubelet with a local build (the
	// kubelet with kubelift's hash-skip patch: make kubelet).
	KubeletBinary string
	// NodeStack also bundles the runtime the catalog pairs with the
	// release: containerd and runc (catalog nodeStack).
	NodeStack bool
	// Etcd also bundles etcd for a binary cluster's members: "paired"
	// for the one the catalog pairs with the release, or a version
	// (v3.6.16), optionally pinned: VERSION#sha256:HEX (one arch).
	Etcd       string
	Access     registry.Access
	HTTPClient *http.Client
	// Jobs bounds parallel downloads.
	Jobs int
	// CacheDir holds downloads between runs.
	CacheDir string
	// SignKey signs the manifest; nil makes an unsigned bundle.
	SignKey *ecdsa.PrivateKey
	Format  Format
	// Installer is the `upgrade` program embedded in a .run file.
	Installer string
	// AgentProgram, the upgrade program built static for the bundle's
	// one arch, is carried as the agent's image (agent mode).
	AgentProgram string
	Output       string
	Progress     progress.Sink
	Log          *slog.Logger
	Now          func() time.Time
}

// Create fetches everything the plan lists (through the cache) and writes
// the signed bundle to opts.Output atomically. It returns the manifest.
func Create(ctx context.Context, opts *CreateOptions) (*Manifest, error) {
	plan, err := MakePlan(opts)
	if err != nil {
		return nil, err
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	format := opts.Format
	if format == "" {
		format = FormatTar
	}
	var installerSum string
	var installerSize int64
	if format == FormatRun {
		if len(plan.Arches) != 1 {
			return nil, errors.New("a .run installer is for one arch: pass a single --arch")
		}
		if opts.Installer == "" {
			return nil, errors.New("a .run installer needs the upgrade program for linux/" + plan.Arches[0])
		}
		if installerSum, installerSize, err = HashFile(opts.Installer); err != nil {
			return nil, fmt.Errorf("installer: %w", err)
		}
	} else if format != FormatTar {
		return nil, fmt.Errorf("format %q: want tar or run", format)
	}
	if opts.AgentProgram != "" && len(plan.Arches) != 1 {
		return nil, fmt.Errorf("the agent's image is built for one arch, and the bundle has %v: bundle one arch", plan.Arches)
	}
	if opts.CacheDir == "" {
		return nil, errors.New("no cache directory")
	}
	store := &cas.Store{Dir: opts.CacheDir}
	jobs := opts.Jobs
	if jobs < 1 {
		jobs = 4
	}

	// Resolve manifests (small), then fetch blobs and files in parallel.
	puller := &registry.Puller{Store: store, Access: opts.Access, Jobs: jobs, Progress: opts.Progress, AllPlatforms: opts.AllPlatforms}
	for _, a := range plan.Arches {
		puller.Platforms = append(puller.Platforms, registry.Platform{OS: "linux", Arch: a})
	}
	log.Info("resolving images", "count", len(plan.Images))
	imgs := make([]*registry.Image, len(plan.Images))
	if err := parallel.ForEach(ctx, jobs, len(plan.Images), func(ctx context.Context, i int) error {
		img, err := puller.Resolve(ctx, plan.Images[i].Ref, plan.Images[i].PullFrom)
		imgs[i] = img
		return err
	}); err != nil {
		return nil, err
	}
	if opts.AgentProgram != "" {
		img, err := agentImage(puller, opts.AgentProgram, plan.Arches)
		if err != nil {
			return nil, err
		}
		imgs = append(imgs, img)
	}
	planned := plan.allFiles()
	files := make([]*fetch.File, len(planned))
	for i, f := range planned {
		files[i] = &fetch.File{URL: f.URL, SHA256: f.SHA256}
	}
	fetcher := &fetch.Fetcher{Store: store, Client: opts.HTTPClient, Jobs: jobs, Progress: opts.Progress}

	// Blobs download in the background; the writer appends each to the
	// bundle as soon as it is in the cache. Files come first: their sizes
	// and checksums go into the manifest, the bundle's first entry.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	unique := map[v1.Hash]bool{}
	for _, img := range imgs {
		for _, b := range img.Blobs {
			unique[b.Digest] = true
		}
	}
	ready := make(chan v1.Hash, len(unique))
	puller.Ready = func(h v1.Hash) { ready <- h }
	blobsDone := make(chan error, 1)
	fetchExited := make(chan struct{})
	log.Info("fetching", "images", len(imgs), "blobs", len(unique), "files", len(files))
	go func() {
		defer close(fetchExited)
		blobsDone <- puller.Fetch(ctx, imgs)
	}()
	// On any failure below, stop the background fetch and wait for it, so
	// nothing writes into the cache after Create returns.
	fail := func(err error) (*Manifest, error) {
		cancel()
		<-fetchExited
		return nil, err
	}
	if err := fetcher.Fetch(ctx, files); err != nil {
		return fail(err)
	}

	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	m := &Manifest{
		SchemaVersion:     SchemaVersion,
		Kind:              Kind,
		KubernetesVersion: plan.KubernetesVersion,
		Arches:            plan.Arches,
		Tool:              Tool{Name: "kubelift", Version: buildinfo.String()},
		Created:           now().UTC().Truncate(time.Second),
		Release:           *plan.release,
		InstallerSHA256:   installerSum,
		InstallerSize:     installerSize,
	}
	if format == FormatRun {
		m.InstallerArch = plan.Arches[0]
	}
	if opts.SignKey != nil {
		m.Signer = Fingerprint(&opts.SignKey.PublicKey)
	}
	layout, err := layoutEntries(m, imgs)
	if err != nil {
		return fail(err)
	}
	// files holds the target's, then each hop's, in planned's order.
	fetched := files
	record := func(f PlannedFile) File {
		got := fetched[0]
		fetched = fetched[1:]
		m.Entries = append(m.Entries, Entry{Path: f.Path, Size: got.Size, SHA256: got.SHA256})
		return File{Name: f.Name, Version: f.Version, Arch: f.Arch, Path: f.Path, URL: f.source, SHA256: got.SHA256, Size: got.Size}
	}
	for _, f := range plan.Files {
		bf := record(f)
		if f.Name == "kubelet" {
			if bf.HashSkip, err = kubeletHashSkip(store, bf.SHA256); err != nil {
				return fail(fmt.Errorf("file %s: %w", f.Path, err))
			}
		}
		m.Files = append(m.Files, bf)
	}
	for _, h := range plan.Hops {
		hop := Hop{Release: *h.release}
		for _, f := range h.Files {
			hop.Files = append(hop.Files, record(f))
		}
		m.Hops = append(m.Hops, hop)
	}
	if err := write(ctx, opts, m, layout, store, format, pipe{ready: ready, done: blobsDone, n: len(unique)}, log); err != nil {
		return fail(err)
	}
	return m, nil
}

// agentImage builds the agent's image from program, for the bundle's one
// arch (Create checked there is one), into the puller's cache; its tag
// is the program's sum.
func agentImage(puller *registry.Puller, program string, arches []string) (*registry.Image, error) {
	sum, _, err := HashFile(program)
	if err != nil {
		return nil, fmt.Errorf("agent program: %w", err)
	}
	img, err := agentimage.Build(program, arches[0])
	if err != nil {
		return nil, err
	}
	return puller.Local(agentimage.Repository+":sha256-"+sum[:16], img)
}

// kubeletHashSkip reads a cached kubelet and says whether it honours the
// hash-skip file.
func kubeletHashSkip(store *cas.Store, sha256Hex string) (bool, error) {
	f, err := store.Open(digest.NewDigestFromEncoded(digest.SHA256, sha256Hex))
	if err != nil {
		return false, err
	}
	defer f.Close()
	return kubeletcompat.HonoursHashSkip(f)
}

// layoutEntries adds the OCI layout to m: oci-layout and index.json, the
// small indexes that stand in for Docker-typed roots (kept in memory,
// returned by path), and every blob once.
func layoutEntries(m *Manifest, imgs []*registry.Image) (map[string][]byte, error) {
	idx := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
	mem := map[string][]byte{path.Join(LayoutDir, "oci-layout"): []byte(`{"imageLayoutVersion":"1.0.0"}`)}
	seen := map[v1.Hash]bool{}
	var blobs []Entry
	addBlob := func(d v1.Hash, size int64) {
		if !seen[d] {
			seen[d] = true
			blobs = append(blobs, Entry{Path: BlobPath(d.String()), Size: size, SHA256: d.Hex})
		}
	}
	for _, img := range imgs {
		rec := Image{Ref: img.Ref, PullFrom: img.PullFrom, Digest: img.Root.Digest.String(), MediaType: string(img.Root.MediaType),
			Size: img.Root.Size, Platforms: img.Platforms, Blobs: len(img.Blobs)}
		for _, b := range img.Blobs {
			rec.Bytes += b.Size
			addBlob(b.Digest, b.Size)
		}
		m.Images = append(m.Images, rec)
		desc, stand, err := layoutDescriptor(img)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Ref, err)
		}
		if stand != nil {
			mem[BlobPath(desc.Digest.String())] = stand
			addBlob(desc.Digest, desc.Size)
		}
		desc.Annotations = map[string]string{
			"org.opencontainers.image.ref.name": img.Ref,
			"io.containerd.image.name":          img.Ref,
		}
		idx.Manifests = append(idx.Manifests, desc)
	}
	indexJSON, err := json.Marshal(idx)
	if err != nil {
		return nil, err
	}
	mem[path.Join(LayoutDir, "index.json")] = indexJSON
	for _, p := range []string{path.Join(LayoutDir, "oci-layout"), path.Join(LayoutDir, "index.json")} {
		sum := sha256.Sum256(mem[p])
		m.Entries = append(m.Entries, Entry{Path: p, Size: int64(len(mem[p])), SHA256: hex.EncodeToString(sum[:])})
	}
	sort.Slice(blobs, func(i, j int) bool { return blobs[i].Path < blobs[j].Path })
	m.Entries = append(m.Entries, blobs...)
	return mem, nil
}

// layoutDescriptor is what index.json says of an image. A descriptor tells
// the truth about the bytes it points to, and skopeo (1.9, Debian 12)
// skips descriptors of Docker types in index.json. So an OCI root is named
// as it is; a Docker-typed root (a manifest list, or a single schema 2
// manifest) is reached through a small OCI index, stand, that lists the
// bundled platform manifests with their real media types and platforms.
// Upstream's own bytes stay in the layout, and bundle.json records their
// digests, which import pushes.
func layoutDescriptor(img *registry.Image) (desc v1.Descriptor, stand []byte, err error) {
	switch img.Root.MediaType {
	case types.OCIImageIndex, types.OCIManifestSchema1:
		return v1.Descriptor{MediaType: img.Root.MediaType, Size: img.Root.Size, Digest: img.Root.Digest}, nil, nil
	}
	if len(img.Manifests) == 0 {
		return v1.Descriptor{}, nil, fmt.Errorf("no platform manifest of %s %s is bundled", img.Root.MediaType, img.Root.Digest)
	}
	stand, err = json.Marshal(v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: img.Manifests})
	if err != nil {
		return v1.Descriptor{}, nil, err
	}
	sum := sha256.Sum256(stand)
	return v1.Descriptor{MediaType: types.OCIImageIndex, Size: int64(len(stand)),
		Digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}}, stand, nil
}
