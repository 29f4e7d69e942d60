package registry

import (
	"context"
	"fmt"
	"io"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Artifact says what a file pushed as an OCI artifact is: its manifest's
// config media type (the artifact's type, as OCI 1.1 reads it), its one
// layer's media type, and annotations of both the manifest and the layer
// (org.opencontainers.image.title, the file's name: oras pull names the
// file it writes so, and skips a layer without one).
type Artifact struct {
	Type, LayerType string
	Annotations     map[string]string
}

// PushFile pushes the file at path, whose sha256 is sum (hex), to ref
// (REGISTRY/REPOSITORY:TAG) as an OCI artifact of one layer, streamed
// from the file: the registry checks the layer against sum, so a file
// changed since its sum was taken is refused. It returns the manifest's
// digest.
func (a Access) PushFile(ctx context.Context, ref, path, sum string, art Artifact) (string, error) {
	r, err := a.parse(ref)
	if err != nil {
		return "", fmt.Errorf("%s: %w", ref, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	h, err := v1.NewHash("sha256:" + sum)
	if err != nil {
		return "", fmt.Errorf("%s: sha256 %q: %w", path, sum, err)
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.MediaType(art.Type))
	layer := fileLayer{path: path, digest: h, size: fi.Size(), mediaType: types.MediaType(art.LayerType)}
	if img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: layer.mediaType, Annotations: art.Annotations}); err != nil {
		return "", err
	}
	if len(art.Annotations) > 0 {
		img = mutate.Annotations(img, art.Annotations).(v1.Image)
	}
	if err := remote.Write(r, img, a.remoteOptions(ctx, r.Context().RegistryStr())...); err != nil {
		return "", fmt.Errorf("push %s to %s: %w", path, ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return d.String(), nil
}

// fileLayer is a file on this machine as a layer, as is (no tar, no
// compression): its digest the file's sha256, read from disk when sent.
type fileLayer struct {
	path      string
	digest    v1.Hash
	size      int64
	mediaType types.MediaType
}

func (l fileLayer) Digest() (v1.Hash, error)             { return l.digest, nil }
func (l fileLayer) DiffID() (v1.Hash, error)             { return l.digest, nil }
func (l fileLayer) Compressed() (io.ReadCloser, error)   { return os.Open(l.path) }
func (l fileLayer) Uncompressed() (io.ReadCloser, error) { return os.Open(l.path) }
func (l fileLayer) Size() (int64, error)                 { return l.size, nil }
func (l fileLayer) MediaType() (types.MediaType, error)  { return l.mediaType, nil }
