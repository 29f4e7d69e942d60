package registry

import (
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/opencontainers/go-digest"
)

// Local puts an image built on this machine (the agent's) into the
// cache, every blob of it, and returns it as Resolve returns a pulled
// one, known by ref: Fetch then finds its blobs in the cache, and a
// bundle holds it as it holds the others.
func (p *Puller) Local(ref string, img v1.Image) (*Image, error) {
	fail := func(err error) (*Image, error) { return nil, fmt.Errorf("image %s (built here): %w", ref, err) }
	raw, err := img.RawManifest()
	if err != nil {
		return fail(err)
	}
	desc, err := partial.Descriptor(img)
	if err != nil {
		return fail(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fail(err)
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return fail(err)
	}
	m, err := img.Manifest()
	if err != nil {
		return fail(err)
	}
	plat := &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}
	root := v1.Descriptor{MediaType: desc.MediaType, Size: desc.Size, Digest: desc.Digest, Platform: plat}
	out := &Image{Ref: ref, PullFrom: ref, Root: root, Manifests: []v1.Descriptor{root}, Platforms: []string{plat.OS + "/" + plat.Architecture},
		Blobs: []v1.Descriptor{{MediaType: desc.MediaType, Size: desc.Size, Digest: desc.Digest}, m.Config}}
	put := func(d v1.Descriptor, r func() ([]byte, error)) error {
		if p.Store.Has(digest.Digest(d.Digest.String()), d.Size) {
			return nil
		}
		b, err := r()
		if err != nil {
			return err
		}
		_, err = p.Store.Put(digest.Digest(d.Digest.String()), d.Size, bytesReader(b))
		return err
	}
	if err := put(out.Blobs[0], func() ([]byte, error) { return raw, nil }); err != nil {
		return fail(err)
	}
	if err := put(m.Config, func() ([]byte, error) { return cfg, nil }); err != nil {
		return fail(err)
	}
	layers, err := img.Layers()
	if err != nil {
		return fail(err)
	}
	for i, l := range layers {
		d := m.Layers[i]
		if !p.Store.Has(digest.Digest(d.Digest.String()), d.Size) {
			rc, err := l.Compressed()
			if err != nil {
				return fail(err)
			}
			_, err = p.Store.Put(digest.Digest(d.Digest.String()), d.Size, rc)
			rc.Close()
			if err != nil {
				return fail(fmt.Errorf("layer %s: %w", d.Digest, err))
			}
		}
		out.Blobs = append(out.Blobs, d)
	}
	return out, nil
}
