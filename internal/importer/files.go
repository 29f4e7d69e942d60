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
// With a cache directory, import adds a second layer: the file encoded
// with zstd (FileZstdLayerType), which nodes that have zstd pull instead,
// checking what it decodes to against the signed sha256.
const (
	FileArtifactType  = "application/vnd.kubelift.file.v1"
	FileLayerType     = "application/octet-stream"
	FileZstdLayerType = "application/zstd"
	// AnnotationDecodedSHA256 is on the zstd layer: the sha256 of what
	// it decodes to, the file's signed one.
	AnnotationDecodedSHA256 = "dev.kubelift.decoded-sha256"
	emptyConfigType         = "application/vnd.oci.empty.v1+json"
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
// (its manifest's config); zst, when not nil, is its zstd copy, pushed as
// a second layer.
func fileArtifact(domain, namespace, version string, f bundle.File, zst *encoded) (*registry.PushImage, map[v1.Hash][]byte, error) {
	target, err := FileTarget(domain, namespace, version, f)
	if err != nil {
		return nil, nil, fmt.Errorf("file %s: target in %s: %w", f.Path, domain, err)
	}
	layer, err := v1.NewHash("sha256:" + f.SHA256)
	if err != nil {
		return nil, nil, fmt.Errorf("file %s: %w", f.Path, err)
	}
	cfgHash, _, _ := v1.SHA256(bytes.NewReader(emptyConfig))
	cfg := v1.Descriptor{MediaType: emptyConfigType, Size: int64(len(emptyConfig)), Digest: cfgHash}
	lay := v1.Descriptor{MediaType: FileLayerType, Size: f.Size, Digest: layer,
		Annotations: map[string]string{"org.opencontainers.image.title": f.Name}}
	layers := []v1.Descriptor{lay}
	if zst != nil {
		layers = append(layers, v1.Descriptor{MediaType: FileZstdLayerType, Size: zst.size, Digest: zst.digest,
			Annotations: map[string]string{"org.opencontainers.image.title": f.Name + ".zst", AnnotationDecodedSHA256: f.SHA256}})
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
	im := &registry.PushImage{Ref: f.Path, Target: target,
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
		return s.v.OpenEntry(p)
	}
	if p, ok := s.disk[d]; ok {
		return os.Open(p)
	}
	return s.v.OpenEntry(bundle.BlobPath(d.String()))
}

// zstdCopy is f's zstd copy in the cache dir, made from the bundle's entry
// when it is not there yet.
func zstdCopy(v *bundle.Verified, dir string, f bundle.File) (*encoded, error) {
	p, err := codec.Cached(dir, codec.Zstd, f.SHA256, func() (io.ReadCloser, error) {
		r, err := v.OpenEntry(f.Path)
		if err != nil {
			return nil, err
		}
		return io.NopCloser(r), nil
	})
	if err != nil {
		return nil, fmt.Errorf("file %s: %w", f.Path, err)
	}
	sum, size, err := codec.Digest(p)
	if err != nil {
		return nil, fmt.Errorf("file %s: %w", f.Path, err)
	}
	return &encoded{path: p, digest: v1.Hash{Algorithm: "sha256", Hex: sum}, size: size}, nil
}
