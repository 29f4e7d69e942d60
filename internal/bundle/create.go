package bundle

import (
	"archive/tar"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"

	"github.com/kubelift/kubelift/internal/atomicfile"
	"github.com/kubelift/kubelift/internal/buildinfo"
	"github.com/kubelift/kubelift/internal/cas"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/fetch"
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
	Arches            []string
	RegistryMirrors   []Mirror
	URLMirrors        []Mirror
	ExtraImages       []string
	ExtraFiles        []ExtraFile
	Access            registry.Access
	HTTPClient        *http.Client
	// Jobs bounds parallel downloads.
	Jobs int
	// CacheDir holds downloads between runs.
	CacheDir string
	// SignKey signs the manifest; nil makes an unsigned bundle.
	SignKey *ecdsa.PrivateKey
	Format  Format
	// Installer is the `upgrade` program embedded in a .run file.
	Installer string
	Output    string
	Progress  progress.Sink
	Log       *slog.Logger
	Now       func() time.Time
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
		if installerSum, installerSize, err = hashFile(opts.Installer); err != nil {
			return nil, fmt.Errorf("installer: %w", err)
		}
	} else if format != FormatTar {
		return nil, fmt.Errorf("format %q: want tar or run", format)
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
	puller := &registry.Puller{Store: store, Access: opts.Access, Jobs: jobs, Progress: opts.Progress}
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
	files := make([]*fetch.File, len(plan.Files))
	for i, f := range plan.Files {
		files[i] = &fetch.File{URL: f.URL, SHA256: f.SHA256}
	}
	fetcher := &fetch.Fetcher{Store: store, Client: opts.HTTPClient, Jobs: jobs, Progress: opts.Progress}
	log.Info("fetching", "images", len(imgs), "files", len(files))
	if err := parallel.ForEach(ctx, 2, 2, func(ctx context.Context, i int) error {
		if i == 0 {
			return puller.Fetch(ctx, imgs)
		}
		return fetcher.Fetch(ctx, files)
	}); err != nil {
		return nil, err
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
		return nil, err
	}
	for i, f := range plan.Files {
		m.Files = append(m.Files, File{Name: f.Name, Arch: f.Arch, Path: f.Path, URL: f.source, SHA256: files[i].SHA256, Size: files[i].Size})
		m.Entries = append(m.Entries, Entry{Path: f.Path, Size: files[i].Size, SHA256: files[i].SHA256})
	}
	if err := write(ctx, opts, m, layout, store, format, log); err != nil {
		return nil, err
	}
	return m, nil
}

// layoutEntries adds the OCI layout to m: oci-layout and index.json (kept in
// memory, returned by path) and every blob once.
func layoutEntries(m *Manifest, imgs []*registry.Image) (map[string][]byte, error) {
	idx := v1.IndexManifest{SchemaVersion: 2, MediaType: "application/vnd.oci.image.index.v1+json"}
	seen := map[v1.Hash]bool{}
	var blobs []Entry
	for _, img := range imgs {
		rec := Image{Ref: img.Ref, PullFrom: img.PullFrom, Digest: img.Root.Digest.String(), MediaType: string(img.Root.MediaType),
			Size: img.Root.Size, Platforms: img.Platforms, Blobs: len(img.Blobs)}
		for _, b := range img.Blobs {
			rec.Bytes += b.Size
			if seen[b.Digest] {
				continue
			}
			seen[b.Digest] = true
			blobs = append(blobs, Entry{Path: path.Join(LayoutDir, "blobs", b.Digest.Algorithm, b.Digest.Hex), Size: b.Size, SHA256: b.Digest.Hex})
		}
		m.Images = append(m.Images, rec)
		idx.Manifests = append(idx.Manifests, v1.Descriptor{
			MediaType: ociMediaType(img.Root.MediaType), Size: img.Root.Size, Digest: img.Root.Digest,
			Annotations: map[string]string{
				"org.opencontainers.image.ref.name": img.Ref,
				"io.containerd.image.name":          img.Ref,
			},
		})
	}
	indexJSON, err := json.Marshal(idx)
	if err != nil {
		return nil, err
	}
	mem := map[string][]byte{
		path.Join(LayoutDir, "oci-layout"): []byte(`{"imageLayoutVersion":"1.0.0"}`),
		path.Join(LayoutDir, "index.json"): indexJSON,
	}
	for _, p := range []string{path.Join(LayoutDir, "oci-layout"), path.Join(LayoutDir, "index.json")} {
		sum := sha256.Sum256(mem[p])
		m.Entries = append(m.Entries, Entry{Path: p, Size: int64(len(mem[p])), SHA256: hex.EncodeToString(sum[:])})
	}
	m.Entries = append(m.Entries, blobs...)
	return mem, nil
}

// ociMediaType names a root descriptor in index.json with the OCI type of
// the same shape: skopeo (1.9, Debian 12) skips descriptors of Docker types
// when it looks a reference up. The blob it points to is upstream's, byte
// for byte (so the digest holds); bundle.json records its real media type.
func ociMediaType(mt types.MediaType) types.MediaType {
	switch mt {
	case types.DockerManifestList:
		return types.OCIImageIndex
	case types.DockerManifestSchema2:
		return types.OCIManifestSchema1
	}
	return mt
}

// write streams the bundle into a temporary file beside opts.Output and
// renames it into place only when complete.
func write(ctx context.Context, opts *CreateOptions, m *Manifest, mem map[string][]byte, store *cas.Store, format Format, log *slog.Logger) error {
	manifestJSON, err := m.Marshal()
	if err != nil {
		return err
	}
	var sig []byte
	if opts.SignKey != nil {
		if sig, err = sign(opts.SignKey, manifestJSON); err != nil {
			return fmt.Errorf("sign: %w", err)
		}
	}
	need := m.TotalSize() + int64(len(manifestJSON)) + int64(len(m.Entries)+2)*1024 + m.InstallerSize + StubSize
	if err := checkFree(filepath.Dir(opts.Output), need); err != nil {
		return err
	}
	perm := os.FileMode(0o644)
	if format == FormatRun {
		perm = 0o755
	}
	out, err := atomicfile.Create(opts.Output, perm)
	if err != nil {
		return err
	}
	defer out.Abort()
	stubInfo := stubInfo{InstallerSHA256: m.InstallerSHA256, InstallerSize: m.InstallerSize}
	arch := m.Arches[0]
	if format == FormatRun {
		stub, err := renderStub(m.KubernetesVersion, arch, filepath.Base(opts.Output), m.Tool.Version, stubInfo)
		if err != nil {
			return err
		}
		if _, err := out.Write(stub); err != nil {
			return err
		}
	}
	cw := &countingWriter{w: out}
	tw := tar.NewWriter(cw)
	header := func(name string, size int64) *tar.Header {
		mode := int64(0o644)
		if path.Dir(name) != "." && (path.Dir(path.Dir(name)) == "bin/linux" || path.Dir(name) == "files") {
			mode = 0o755
		}
		return &tar.Header{Name: name, Size: size, Mode: mode, ModTime: m.Created, Typeflag: tar.TypeReg}
	}
	writeMem := func(name string, data []byte) error {
		if err := tw.WriteHeader(header(name, int64(len(data)))); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := writeMem(ManifestName, manifestJSON); err != nil {
		return err
	}
	if sig != nil {
		if err := writeMem(SignatureName, sig); err != nil {
			return err
		}
	}
	buf := make([]byte, 1<<20)
	for _, e := range m.Entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		if data, ok := mem[e.Path]; ok {
			if err := writeMem(e.Path, data); err != nil {
				return err
			}
			continue
		}
		if err := tw.WriteHeader(header(e.Path, e.Size)); err != nil {
			return err
		}
		d := digest.NewDigestFromEncoded(digest.SHA256, e.SHA256)
		f, err := store.Open(d)
		if err != nil {
			return fmt.Errorf("cache %s: %w", store.Path(d), err)
		}
		_, err = io.CopyBuffer(tw, cas.VerifyingReader(f, d, e.Size), buf)
		f.Close()
		if errors.Is(err, cas.ErrDigestMismatch) {
			os.Remove(store.Path(d)) // a damaged cache entry is fetched again next run
			return fmt.Errorf("cache %s is damaged and was removed; run again: %w", store.Path(d), err)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", e.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if format == FormatRun {
		in, err := os.Open(opts.Installer)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, cas.VerifyingReader(in, digest.NewDigestFromEncoded(digest.SHA256, m.InstallerSHA256), m.InstallerSize))
		in.Close()
		if err != nil {
			return fmt.Errorf("installer %s changed while bundling: %w", opts.Installer, err)
		}
		stubInfo.PayloadSize = cw.n
		stub, err := renderStub(m.KubernetesVersion, arch, filepath.Base(opts.Output), m.Tool.Version, stubInfo)
		if err != nil {
			return err
		}
		if _, err := out.WriteAt(stub, 0); err != nil {
			return err
		}
	}
	log.Info("bundle written", "file", opts.Output, "bytes", cw.n)
	return out.Commit()
}

func hashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
