package registry

import (
	"context"
	"fmt"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// OpenBlob streams the blob d of repository repo (host/path), as the
// registry stores it. The caller checks what it reads against d.
func (a Access) OpenBlob(ctx context.Context, repo string, d v1.Hash) (io.ReadCloser, error) {
	ref, err := a.parse(repo + "@" + d.String())
	if err != nil {
		return nil, fmt.Errorf("blob %s@%s: %w", repo, d, err)
	}
	layer, err := remote.Layer(ref.Context().Digest(d.String()), a.remoteOptions(ctx, ref.Context().RegistryStr())...)
	if err != nil {
		return nil, Explain(ref.String(), err)
	}
	rc, err := layer.Compressed()
	if err != nil {
		return nil, Explain(ref.String(), err)
	}
	return rc, nil
}
