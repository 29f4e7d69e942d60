// Package registry moves container images between registries and
// kubelift's bundles: it pulls images (keeping upstream manifest digests and
// multi-arch indexes byte for byte) into a content-addressed cache from
// which the bundle's OCI layout is written.
package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Access says how to reach registries.
type Access struct {
	// Keychain supplies credentials; nil means the docker config keychain.
	Keychain authn.Keychain
	// Insecure lists registry hosts reached over plain HTTP or TLS without
	// verification (test and lab mirrors).
	Insecure []string
	// RootCAs, when set, are the CAs trusted for registry TLS (--ca-file).
	RootCAs *x509.CertPool
	// Transport overrides the HTTP transport (tests).
	Transport http.RoundTripper
}

func (a Access) insecure(host string) bool {
	for _, h := range a.Insecure {
		if h == host {
			return true
		}
	}
	return false
}

// parse parses a reference, honouring the insecure list.
func (a Access) parse(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref, name.StrictValidation)
	if err != nil {
		return nil, err
	}
	if a.insecure(r.Context().RegistryStr()) {
		return name.ParseReference(ref, name.StrictValidation, name.Insecure)
	}
	return r, nil
}

func (a Access) keychain() authn.Keychain {
	if a.Keychain == nil {
		return authn.DefaultKeychain
	}
	return a.Keychain
}

// baseTransport is the HTTP transport for a registry host, or nil for
// go-containerregistry's default.
func (a Access) baseTransport(host string) http.RoundTripper {
	if a.Transport != nil {
		return a.Transport
	}
	if a.insecure(host) || a.RootCAs != nil {
		t := remote.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = &tls.Config{RootCAs: a.RootCAs, InsecureSkipVerify: a.insecure(host)} //nolint:gosec // operator asked for it by host
		return t
	}
	return nil
}

// remoteOptions returns go-containerregistry options for a registry host.
func (a Access) remoteOptions(ctx context.Context, host string) []remote.Option {
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(a.keychain())}
	if tr := a.baseTransport(host); tr != nil {
		opts = append(opts, remote.WithTransport(tr))
	}
	return opts
}

func resolveAuth(ctx context.Context, a Access, repo name.Repository) (authn.Authenticator, error) {
	return authn.Resolve(ctx, a.keychain(), repo.Registry)
}

// authTransport returns a transport authenticated for repo with scopes.
// With retry, round trips failing with 5xx, 429 or a dropped connection
// are retried; without it (requests with bodies), callers retry whole.
func (a Access) authTransport(ctx context.Context, repo name.Repository, retry bool, scopes []string) (http.RoundTripper, error) {
	auth, err := resolveAuth(ctx, a, repo)
	if err != nil {
		return nil, err
	}
	base := a.baseTransport(repo.RegistryStr())
	if base == nil {
		base = remote.DefaultTransport
	}
	if retry {
		base = transport.NewRetry(base, transport.WithRetryStatusCodes(http.StatusInternalServerError, http.StatusBadGateway,
			http.StatusServiceUnavailable, http.StatusGatewayTimeout, http.StatusTooManyRequests))
	}
	reg := repo.Registry
	if a.insecure(reg.RegistryStr()) {
		// The transport tries plain HTTP only for registries marked
		// insecure (or local-looking names); references made without
		// Access.parse, such as the pusher's targets, are not marked.
		if reg, err = name.NewRegistry(reg.RegistryStr(), name.Insecure); err != nil {
			return nil, err
		}
	}
	return transport.NewWithContext(ctx, reg, auth, base, scopes)
}

// Retry says how often a broken transfer is tried and how long to wait
// between tries: Backoff.Steps tries, Backoff's waits between them
// (k8s.io/apimachinery's wait.Backoff). The zero Retry is 3 tries, 1 s
// then 2 s apart.
type Retry struct {
	Backoff wait.Backoff
}

// run calls try until it succeeds, the context ends, the tries are used
// up, or final says the error cannot be cured by trying again; it returns
// try's last error (or the context's).
func (r Retry) run(ctx context.Context, try func() error, final func(error) bool) error {
	b := r.Backoff
	if b.Steps < 1 {
		b = wait.Backoff{Duration: time.Second, Factor: 2, Steps: 3}
	}
	var last error
	err := wait.ExponentialBackoffWithContext(ctx, b, func(ctx context.Context) (bool, error) {
		if last = try(); last == nil {
			return true, nil
		}
		if ctx.Err() != nil || final(last) {
			return false, last
		}
		return false, nil
	})
	if errors.Is(err, wait.ErrWaitTimeout) {
		return last // the tries are used up
	}
	return err
}

// transports keeps one authenticated transport per repository: making one
// costs a ping and, on token registries, a token exchange.
type transports struct {
	mu sync.Mutex
	m  map[string]http.RoundTripper
}

func (c *transports) get(repo name.Repository, make func() (http.RoundTripper, error)) (http.RoundTripper, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.m[repo.String()]; ok {
		return t, nil
	}
	t, err := make()
	if err != nil {
		return nil, err
	}
	if c.m == nil {
		c.m = map[string]http.RoundTripper{}
	}
	c.m[repo.String()] = t
	return t, nil
}

// Platform is an os/arch pair images are pulled for.
type Platform struct{ OS, Arch string }

func (p Platform) String() string { return p.OS + "/" + p.Arch }

func (p Platform) matches(q *v1.Platform) bool {
	return q != nil && q.OS == p.OS && q.Architecture == p.Arch
}

// IsIndex reports whether a media type is a multi-arch index.
func IsIndex(mt types.MediaType) bool {
	return mt == types.OCIImageIndex || mt == types.DockerManifestList
}

// IsManifest reports whether a media type is a single-image manifest.
func IsManifest(mt types.MediaType) bool {
	return mt == types.OCIManifestSchema1 || mt == types.DockerManifestSchema2
}

// Explain adds the likely fix to a registry error, naming the registry and
// repository. It is the one place registry errors get their hints.
func Explain(ref string, err error) error {
	if err == nil {
		return nil
	}
	var terr *transport.Error
	hint := ""
	switch {
	case errors.As(err, &terr) && (terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden):
		hint = " (check the credentials for this registry)"
	case errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound:
		hint = " (not found: check the repository and tag)"
	case strings.Contains(err.Error(), "x509:") || strings.Contains(err.Error(), "certificate"):
		hint = " (TLS: pass the registry's CA with --ca-file, or --insecure-registry for a lab mirror)"
	case strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		hint = " (the registry speaks plain HTTP: list it with --insecure-registry / --plain-http)"
	case strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "no such host"):
		hint = " (registry unreachable)"
	}
	return fmt.Errorf("%s: %w%s", ref, err, hint)
}
