package stage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/codec"
	"github.com/kubelift/kubelift/internal/registry"
)

// Source supplies the content of a target's files. What it returns is
// checked against the signed sha256 before any of it reaches a node.
type Source interface {
	Open(ctx context.Context, f bundle.File, artifact string) (io.ReadCloser, error)
}

// BundleSource reads files from a verified bundle file.
type BundleSource struct{ Bundle *bundle.Verified }

// Open returns the file's entry.
func (s BundleSource) Open(_ context.Context, f bundle.File, _ string) (io.ReadCloser, error) {
	r, err := s.Bundle.OpenEntry(f.Path)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(r), nil
}

// RegistrySource reads files from the OCI artifacts import pushed.
type RegistrySource struct{ Access registry.Access }

// ErrNoArtifact means the record names no artifact for a file: the
// bundle was imported with --skip-binaries.
var ErrNoArtifact = errors.New("not in the private registry (imported with --skip-binaries?): stage from the bundle file")

// Open streams the artifact's layer, whose digest is the file's sha256.
func (s RegistrySource) Open(ctx context.Context, f bundle.File, artifact string) (io.ReadCloser, error) {
	if artifact == "" {
		return nil, fmt.Errorf("file %s: %w", f.Path, ErrNoArtifact)
	}
	repo, _, _ := strings.Cut(artifact, "@")
	return s.Access.OpenBlob(ctx, repo, v1.Hash{Algorithm: "sha256", Hex: f.SHA256})
}

// NodePuller is a Source the nodes can fetch from themselves: the private
// registry, which every node's runtime already reaches. Staging then sends
// a node only what to fetch (URL, signed sha256, size) and a credential on
// stdin, so this machine's bytes do not grow with the fleet.
type NodePuller interface {
	// ForNode says where a node fetches the blob (sha256:HEX) of the
	// artifact (REPOSITORY@DIGEST), and with what header.
	ForNode(ctx context.Context, artifact, blob string) (registry.NodePull, error)
	// ZstdCopy is the blob (sha256:HEX) and size of the zstd copy of the
	// artifact's file with sha256 sum, or "" when there is none.
	ZstdCopy(ctx context.Context, artifact, sum string) (string, int64, error)
}

// ZstdCopy finds the file's zstd copy, tagged codec.ZstdTag beside it.
func (s RegistrySource) ZstdCopy(ctx context.Context, artifact, sum string) (string, int64, error) {
	repo, _, _ := strings.Cut(artifact, "@")
	layers, err := s.Access.Layers(ctx, repo+":"+codec.ZstdTag(sum))
	if err != nil {
		return "", 0, err
	}
	for _, l := range layers {
		if l.MediaType == codec.ZstdMediaType && l.Annotations[codec.AnnotationDecodedSHA256] == sum && l.Size > 0 {
			return l.Digest.String(), l.Size, nil
		}
	}
	return "", 0, nil
}

// CopyRelay is a NodePuller whose zstd copies this machine can read too,
// to send them on over SSH as they are: a node that cannot pull is then
// sent what import compressed, with no compression here.
type CopyRelay interface {
	NodePuller
	// OpenCopy streams the blob (sha256:HEX) of the artifact's repository.
	OpenCopy(ctx context.Context, artifact, blob string) (io.ReadCloser, error)
}

// OpenCopy streams a blob of the artifact's repository (its zstd copy).
func (s RegistrySource) OpenCopy(ctx context.Context, artifact, blob string) (io.ReadCloser, error) {
	repo, _, _ := strings.Cut(artifact, "@")
	d, err := v1.NewHash(blob)
	if err != nil {
		return nil, fmt.Errorf("artifact %s: blob %q: %w", artifact, blob, err)
	}
	return s.Access.OpenBlob(ctx, repo, d)
}

// ForNode says where a node fetches a blob of the artifact.
func (s RegistrySource) ForNode(ctx context.Context, artifact, blob string) (registry.NodePull, error) {
	repo, _, _ := strings.Cut(artifact, "@")
	d, err := v1.NewHash(blob)
	if err != nil {
		return registry.NodePull{}, fmt.Errorf("artifact %s: blob %q: %w", artifact, blob, err)
	}
	return s.Access.ForNode(ctx, repo, d)
}
