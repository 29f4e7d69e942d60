package importer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/codec"
	"github.com/kubelift/kubelift/internal/registry"
)

// Media types of a file pushed as an OCI artifact (one file per artifact,
// the way Hauler stores files): an empty config and one layer whose digest
// is the file's signed sha256.
//
// With a cache directory, import also pushes each file's zstd copy as an
// artifact of its own (codec.ZstdTag in the same repository), which nodes
// that have zstd pull instead, checking what it decodes to against the
// signed sha256; the file's artifact, and the record naming it, stay as
// they were.
const (
	FileArtifactType = "application/vnd.kubelift.file.v1"
	FileLayerType    = "application/octet-stream"
	emptyConfigType  = "application/vnd.oci.empty.v1+json"
	// FileRepository is the repository, below the namespace, that holds a
	// file NAME as FileRepository/NAME.
	FileRepository = "kubelift-files"
)

var emptyConfig = []byte("{}")

// FileTarget is where a bundle file goes: DOMAIN/NAMESPACE/kubelift-files/
// NAME:VERSION-linux-ARCH (VERSION alone for files without an arch).
func FileTarget(domain, namespace, version string, f bundle.File) (name.Tag, error) {
	repo := strings.TrimSuffix(domain, "/") + "/"
	if ns := strings.Trim(namespace, "/"); ns != "" {
		repo += ns + "/"
	}
	tag := version
	if f.Arch != "" {
		tag += "-linux-" + f.Arch
	}
	return name.NewTag(repo+FileRepository+"/"+f.Name+":"+tag, name.WeakValidation)
}

// versionedFile is a bundle file with the release it belongs to: the
// target's, or a hop's.
type versionedFile struct {
	version string
	bundle.File
}

// bundleFiles lists the target's files, then each hop's.
func bundleFiles(m *bundle.Manifest) []versionedFile {
	var out []versionedFile
	for _, f := range m.Files {
		out = append(out, versionedFile{m.KubernetesVersion, f})
	}
	for _, h := range m.Hops {
		for _, f := range h.Files {
			out = append(out, versionedFile{h.Release.Version, f})
		}
	}
	return out
}

// encoded is a file's zstd copy in the cache: where, its digest and size.
type encoded struct {
	path   string
	digest v1.Hash
	size   int64
}

// fileArtifact is one bundle file as a push job, and the blobs only it has
// (its manifest's config); with zst, its zstd copy's, tagged
// codec.ZstdTag beside it.
func fileArtifact(domain, namespace, version string, f bundle.File, zst *encoded) (*registry.PushImage, map[v1.Hash][]byte, error) {
	target, err := FileTarget(domain, namespace, version, f)
	if err != nil {
		return nil, nil, fmt.Errorf("file %s: target in %s: %w", f.Path, domain, err)
	}
	if zst != nil {
		if target, err = name.NewTag(target.Context().String()+":"+codec.ZstdTag(f.SHA256), name.WeakValidation); err != nil {
			return nil, nil, fmt.Errorf("file %s: zstd copy's tag: %w", f.Path, err)
		}
	}
	layer, err := v1.NewHash("sha256:" + f.SHA256)
	if err != nil {
		return nil, nil, fmt.Errorf("file %s: %w", f.Path, err)
	}
	cfgHash, _, _ := v1.SHA256(bytes.NewReader(emptyConfig))
	cfg := v1.Descriptor{MediaType: emptyConfigType, Size: int64(len(emptyConfig)), Digest: cfgHash}
	layers := []v1.Descriptor{{MediaType: FileLayerType, Size: f.Size, Digest: layer,
		Annotations: map[string]string{"org.opencontainers.image.title": f.Name}}}
	if zst != nil {
		layers = []v1.Descriptor{{MediaType: codec.ZstdMediaType, Size: zst.size, Digest: zst.digest,
			Annotations: map[string]string{"org.opencontainers.image.title": f.Name + ".zst", codec.AnnotationDecodedSHA256: f.SHA256}}}
	}
	raw, err := json.Marshal(struct {
		SchemaVersion int               `json:"schemaVersion"`
		MediaType     types.MediaType   `json:"mediaType"`
		ArtifactType  string            `json:"artifactType"`
		Config        v1.Descriptor     `json:"config"`
		Layers        []v1.Descriptor   `json:"layers"`
		Annotations   map[string]string `json:"annotations"`
	}{2, types.OCIManifestSchema1, FileArtifactType, cfg, layers,
		map[string]string{"dev.kubelift.kubernetes-version": version, "dev.kubelift.bundle-path": f.Path}})
	if err != nil {
		return nil, nil, err
	}
	mh, _, _ := v1.SHA256(bytes.NewReader(raw))
	ref := f.Path
	if zst != nil {
		ref += " (zstd)"
	}
	im := &registry.PushImage{Ref: ref, Target: target,
		Manifests: []registry.RawManifest{{Digest: mh, MediaType: types.OCIManifestSchema1, Raw: raw}},
		Blobs:     append([]v1.Descriptor{cfg}, layers...)}
	return im, map[v1.Hash][]byte{cfgHash: emptyConfig}, nil
}

// bundleSource serves blobs to the pusher: small ones made here, the
// bundle's files by their sha256, and the image layout's blobs.
type bundleSource struct {
	v     *bundle.Verified
	mem   map[v1.Hash][]byte
	files map[string]string  // sha256 hex -> entry path
	disk  map[v1.Hash]string // zstd copies in the cache
}

func newBundleSource(v *bundle.Verified) *bundleSource {
	s := &bundleSource{v: v, mem: map[v1.Hash][]byte{}, files: map[string]string{}, disk: map[v1.Hash]string{}}
	for _, f := range bundleFiles(v.Manifest) {
		s.files[f.SHA256] = f.Path
	}
	return s
}

func (s *bundleSource) OpenBlob(d v1.Hash) (io.Reader, error) {
	if b, ok := s.mem[d]; ok {
		return bytes.NewReader(b), nil
	}
	if p, ok := s.files[d.Hex]; ok {
		return s.v.OpenChecked(p)
	}
	if p, ok := s.disk[d]; ok {
		return os.Open(p)
	}
	return s.v.OpenChecked(bundle.BlobPath(d.String()))
}

// zstdCopy is f's zstd copy in the cache dir, made from the bundle's entry
// when it is not there yet.
func zstdCopy(v *bundle.Verified, dir string, f bundle.File) (*encoded, error) {
	p, err := codec.Cached(dir, codec.Zstd, f.SHA256, func() (io.ReadCloser, error) {
		r, err := v.OpenChecked(f.Path)
		if err != nil {
			return nil, err
		}
		return io.NopCloser(r), nil
	})
	if err != nil {
		return nil, fmt.Errorf("file %s: %w", f.Path, err)
	}
	sum, size, err := bundle.HashFile(p)
	if err != nil {
		return nil, fmt.Errorf("file %s: %w", f.Path, err)
	}
	// What it decodes to is the signed file, or the cache is wrong.
	if err := codec.CheckDecoded(p, f.SHA256, f.Size); err != nil {
		os.Remove(p)
		return nil, fmt.Errorf("file %s: its zstd copy in the cache %s: %w (removed: import again)", f.Path, p, err)
	}
	return &encoded{path: p, digest: v1.Hash{Algorithm: "sha256", Hex: sum}, size: size}, nil
}
