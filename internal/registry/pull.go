package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/opencontainers/go-digest"

	"github.com/kubelift/kubelift/internal/cas"
	"github.com/kubelift/kubelift/internal/parallel"
	"github.com/kubelift/kubelift/internal/progress"
)

// Image is a resolved image: its root manifest as upstream serves it, and
// every blob (manifests, configs, layers) needed for the chosen platforms.
type Image struct {
	// Ref is the upstream reference the image is known by.
	Ref string
	// PullFrom is where it was fetched (Ref after mirror rewriting).
	PullFrom string
	// Root is the manifest or index the reference resolved to.
	Root v1.Descriptor
	// Platforms lists the os/arch variants included.
	Platforms []string
	// Manifests lists the platform manifests included, each with its real
	// media type and, where known, its platform: the children of Root that
	// were taken, or Root itself for a single-platform image.
	Manifests []v1.Descriptor
	// Blobs lists every blob of the image, Root included, each once.
	Blobs []v1.Descriptor
	repo  name.Repository
}

// Puller pulls images into a content-addressed cache.
type Puller struct {
	Store     *cas.Store
	Access    Access
	Platforms []Platform
	// AllPlatforms includes every manifest of a multi-arch index, so the
	// index can be pushed with its upstream digest (registries refuse an
	// index whose children they lack).
	AllPlatforms bool
	// Jobs bounds parallel blob downloads.
	Jobs     int
	Progress progress.Sink
	// Ready, if set, is called (from any goroutine) once for every blob as
	// soon as it is in the cache, so a consumer can start on it while the
	// rest still downloads.
	Ready func(v1.Hash)
	// Retry governs broken blob downloads.
	Retry

	transports transports
}

// Resolve fetches ref's manifests (from pullFrom) into the cache and lists
// the blobs of the wanted platforms. It downloads no layers.
func (p *Puller) Resolve(ctx context.Context, ref, pullFrom string) (*Image, error) {
	src, err := p.Access.parse(pullFrom)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", pullFrom, err)
	}
	opts := p.Access.remoteOptions(ctx, src.Context().RegistryStr())
	desc, err := remote.Get(src, opts...)
	if err != nil {
		return nil, Explain(pullFrom, err)
	}
	img := &Image{Ref: ref, PullFrom: pullFrom, Root: desc.Descriptor, repo: src.Context()}
	seen := map[v1.Hash]bool{}
	add := func(d v1.Descriptor) {
		if !seen[d.Digest] {
			seen[d.Digest] = true
			img.Blobs = append(img.Blobs, v1.Descriptor{MediaType: d.MediaType, Size: d.Size, Digest: d.Digest})
		}
	}
	if err := p.putManifest(desc.Descriptor, desc.Manifest); err != nil {
		return nil, fmt.Errorf("image %s: %w", pullFrom, err)
	}
	add(desc.Descriptor)

	var manifests []v1.Descriptor
	switch {
	case IsIndex(desc.MediaType):
		idx, err := v1.ParseIndexManifest(bytesReader(desc.Manifest))
		if err != nil {
			return nil, fmt.Errorf("image %s: index: %w", pullFrom, err)
		}
		if p.AllPlatforms {
			for _, m := range idx.Manifests {
				if !IsManifest(m.MediaType) {
					return nil, fmt.Errorf("image %s: nested index %s is not supported", pullFrom, m.Digest)
				}
				manifests = append(manifests, m)
				if m.Platform != nil {
					img.Platforms = append(img.Platforms, m.Platform.OS+"/"+m.Platform.Architecture)
				}
			}
		}
		for _, want := range p.Platforms {
			if p.AllPlatforms {
				found := false
				for _, m := range idx.Manifests {
					found = found || want.matches(m.Platform)
				}
				if !found {
					return nil, fmt.Errorf("image %s has no %s variant", pullFrom, want)
				}
				continue
			}
			found := false
			for _, m := range idx.Manifests {
				if want.matches(m.Platform) && IsManifest(m.MediaType) {
					manifests = append(manifests, m)
					img.Platforms = append(img.Platforms, want.String())
					found = true
					break
				}
			}
			if !found {
				return nil, fmt.Errorf("image %s has no %s variant", pullFrom, want)
			}
		}
	case IsManifest(desc.MediaType):
		// A single-platform image: its config says which one.
	default:
		return nil, fmt.Errorf("image %s: unsupported media type %s", pullFrom, desc.MediaType)
	}

	for _, m := range manifests {
		raw, err := p.fetchManifest(ctx, src.Context(), m.Digest, opts)
		if err != nil {
			return nil, err
		}
		add(m)
		img.Manifests = append(img.Manifests, v1.Descriptor{MediaType: m.MediaType, Size: m.Size, Digest: m.Digest, Platform: m.Platform})
		if err := p.addImageBlobs(raw, add); err != nil {
			return nil, fmt.Errorf("image %s@%s: %w", pullFrom, m.Digest, err)
		}
	}
	if IsManifest(desc.MediaType) {
		if err := p.addImageBlobs(desc.Manifest, add); err != nil {
			return nil, fmt.Errorf("image %s: %w", pullFrom, err)
		}
		plat, err := p.configPlatform(ctx, src.Context(), desc.Manifest, opts)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", pullFrom, err)
		}
		for _, want := range p.Platforms {
			if plat.Architecture != "" && !want.matches(plat) {
				return nil, fmt.Errorf("image %s has no %s variant (it is a single %s/%s image)", pullFrom, want, plat.OS, plat.Architecture)
			}
		}
		root := v1.Descriptor{MediaType: desc.MediaType, Size: desc.Size, Digest: desc.Digest}
		if plat.Architecture != "" {
			img.Platforms = []string{plat.OS + "/" + plat.Architecture}
			root.Platform = &v1.Platform{OS: plat.OS, Architecture: plat.Architecture, Variant: plat.Variant}
		}
		img.Manifests = []v1.Descriptor{root}
	}
	sort.Strings(img.Platforms)
	return img, nil
}

func (p *Puller) fetchManifest(ctx context.Context, repo name.Repository, d v1.Hash, opts []remote.Option) ([]byte, error) {
	dg := digest.Digest(d.String())
	if f, err := p.Store.Open(dg); err == nil {
		defer f.Close()
		var buf []byte
		buf, err = readAllLimited(f, maxManifest)
		if err == nil && digest.FromBytes(buf) == dg {
			return buf, nil
		}
	}
	ref := repo.Digest(d.String())
	desc, err := remote.Get(ref, opts...)
	if err != nil {
		return nil, Explain(ref.String(), err)
	}
	if err := p.putManifest(desc.Descriptor, desc.Manifest); err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	return desc.Manifest, nil
}

// configPlatform fetches (into the cache) and reads an image config's os/arch.
func (p *Puller) configPlatform(ctx context.Context, repo name.Repository, manifest []byte, opts []remote.Option) (*v1.Platform, error) {
	m, err := v1.ParseManifest(bytesReader(manifest))
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	d := digest.Digest(m.Config.Digest.String())
	if !p.Store.Has(d, m.Config.Size) {
		layer, err := remote.Layer(repo.Digest(d.String()), opts...)
		if err != nil {
			return nil, Explain(repo.Digest(d.String()).String(), err)
		}
		rc, err := layer.Compressed()
		if err != nil {
			return nil, Explain(repo.Digest(d.String()).String(), err)
		}
		_, err = p.Store.Put(d, m.Config.Size, io.LimitReader(rc, maxManifest))
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("config %s: %w", d, err)
		}
	}
	f, err := p.Store.Open(d)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cfg, err := v1.ParseConfigFile(f)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", d, err)
	}
	return &v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture}, nil
}

func (p *Puller) putManifest(d v1.Descriptor, raw []byte) error {
	dg := digest.Digest(d.Digest.String())
	if p.Store.Has(dg, int64(len(raw))) {
		return nil
	}
	_, err := p.Store.Put(dg, int64(len(raw)), bytesReader(raw))
	return err
}

func (p *Puller) addImageBlobs(raw []byte, add func(v1.Descriptor)) error {
	var m v1.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	add(m.Config)
	for _, l := range m.Layers {
		if len(l.URLs) > 0 {
			return fmt.Errorf("layer %s is a foreign layer (urls), which an air gap cannot fetch", l.Digest)
		}
		add(l)
	}
	return nil
}

// Fetch downloads every blob of imgs the cache lacks, each once however many
// images share it, with at most Jobs downloads at a time.
func (p *Puller) Fetch(ctx context.Context, imgs []*Image) error {
	type job struct {
		desc v1.Descriptor
		img  *Image
	}
	var todo []job
	seen := map[v1.Hash]bool{}
	sink := progress.OrNop(p.Progress)
	ready := p.Ready
	if ready == nil {
		ready = func(v1.Hash) {}
	}
	for _, img := range imgs {
		for _, b := range img.Blobs {
			if seen[b.Digest] {
				continue
			}
			seen[b.Digest] = true
			if p.Store.Has(digest.Digest(b.Digest.String()), b.Size) {
				ready(b.Digest)
				continue
			}
			todo = append(todo, job{b, img})
			sink.Expect(b.Size)
		}
	}
	// Largest first: the long downloads start early and the tail is short.
	sort.SliceStable(todo, func(i, j int) bool { return todo[i].desc.Size > todo[j].desc.Size })
	return parallel.ForEach(ctx, p.Jobs, len(todo), func(ctx context.Context, i int) error {
		j := todo[i]
		if err := p.fetchBlob(ctx, j.img.repo, j.desc, sink); err != nil {
			return err
		}
		ready(j.desc.Digest)
		return nil
	})
}

// fetchBlob downloads one blob into the cache, which checks its digest and
// size (the only hash computed over it). A transfer cut mid-way is retried.
func (p *Puller) fetchBlob(ctx context.Context, repo name.Repository, desc v1.Descriptor, sink progress.Sink) error {
	ref := repo.Digest(desc.Digest.String()).String()
	tr, err := p.transport(ctx, repo)
	if err != nil {
		return Explain(ref, err)
	}
	client := &http.Client{Transport: tr}
	u := fmt.Sprintf("https://%s/v2/%s/blobs/%s", repo.RegistryStr(), repo.RepositoryStr(), desc.Digest)
	err = p.Retry.run(ctx, func() error { return p.getBlob(ctx, client, u, desc, sink) }, func(err error) bool {
		// An HTTP answer, or content that is not what was asked, is final.
		var terr *transport.Error
		return errors.As(err, &terr) || errors.Is(err, cas.ErrDigestMismatch)
	})
	if err != nil {
		return Explain(ref, err)
	}
	return nil
}

func (p *Puller) getBlob(ctx context.Context, client *http.Client, u string, desc v1.Descriptor, sink progress.Sink) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		return err
	}
	counted := &progress.Reader{R: resp.Body, Sink: sink}
	_, err = p.Store.Put(digest.Digest(desc.Digest.String()), desc.Size, counted)
	return err
}

// transport returns the authenticated, retrying pull transport for repo.
func (p *Puller) transport(ctx context.Context, repo name.Repository) (http.RoundTripper, error) {
	return p.transports.get(repo, func() (http.RoundTripper, error) {
		return p.Access.authTransport(ctx, repo, true, []string{repo.Scope(transport.PullScope)})
	})
}
