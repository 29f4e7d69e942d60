package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
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

// NodePull is what a node needs to fetch one blob from the registry itself:
// the blob's URL, the registry host (a node finds the CA it trusts for the
// registry by it) and the Authorization header line to send, scoped to
// pulling that repository (empty for a registry that asks none).
type NodePull struct {
	// Base is the registry's scheme and host (https://HOST), URL the blob's.
	Base   string
	URL    string
	Host   string
	Header string
}

// ForNode returns how a node pulls the blob d of repository repo
// (host/path). The header is the one this machine's credentials earn for
// a pull of repo: Basic for registries that take passwords on every
// request, a bearer token (pull scope only, short-lived) for those with a
// token service; it is meant for the node's stdin, never its command line.
func (a Access) ForNode(ctx context.Context, repo string, d v1.Hash) (NodePull, error) {
	ref, err := a.parse(repo + "@" + d.String())
	if err != nil {
		return NodePull{}, fmt.Errorf("blob %s@%s: %w", repo, d, err)
	}
	r := ref.Context()
	np := NodePull{Host: r.RegistryStr()}
	rt, err := a.authTransport(ctx, r, true, []string{r.Scope(transport.PullScope)})
	if err != nil {
		return NodePull{}, Explain(ref.String(), err)
	}
	// The header the authenticated transport sets, and the scheme its
	// ping found the registry speaks (it rewrites the request's), are
	// read off a HEAD of the blob as the innermost transport sent it; the
	// HEAD also says the registry has the blob.
	u := url.URL{Scheme: "https", Host: r.RegistryStr(), Path: "/v2/" + r.RepositoryStr() + "/blobs/" + d.String()}
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, u.String(), nil)
	if err != nil {
		return NodePull{}, err
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return NodePull{}, Explain(ref.String(), err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && (resp.StatusCode < 300 || resp.StatusCode > 399) {
		return NodePull{}, fmt.Errorf("blob %s@%s: the registry answers %s", repo, d, resp.Status)
	}
	if resp.Request != nil {
		u.Scheme = resp.Request.URL.Scheme
		if h := resp.Request.Header.Get("Authorization"); h != "" {
			np.Header = "Authorization: " + h
		}
	}
	np.Base, np.URL = u.Scheme+"://"+u.Host, u.String()
	return np, nil
}

// Layers returns the layers of the manifest ref (host/path:tag) names, or
// none when the registry has no such manifest.
func (a Access) Layers(ctx context.Context, ref string) ([]v1.Descriptor, error) {
	r, err := a.parse(ref)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	desc, err := remote.Get(r, a.remoteOptions(ctx, r.Context().RegistryStr())...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, Explain(ref, err)
	}
	var m v1.Manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil {
		return nil, fmt.Errorf("%s: manifest: %w", ref, err)
	}
	return m.Layers, nil
}
