package stage

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/cas"
	"github.com/kubelift/kubelift/internal/codec"
)

// encodedCache fetches each file once, checks it, and keeps it encoded in
// each codec asked for, for every node that needs it.
type encodedCache struct {
	store  *cas.Store
	dir    string
	source Source
	mu     sync.Mutex
	locks  map[string]*sync.Mutex
	copies map[string]zstdCopy   // "zstd-copy SHA256" -> the zstd copy in the registry
	bad    map[string]bool       // sha256 -> its copy did not decode to it on a node
	rates  map[string][2]float64 // "rate CODEC" -> bytes per second this machine encodes, and the ratio
	log    *slog.Logger
}

// relayed is the path of the registry's zstd copy of f, fetched once for
// every node (checked against the copy's digest, not opened here: the
// node checks what it decodes to), or "" when the source has no copy to
// relay or a node refused it.
func (c *encodedCache) relayed(ctx context.Context, f bundle.File, artifact string) (string, error) {
	src, ok := c.source.(CopyRelay)
	if !ok || artifact == "" {
		return "", nil
	}
	l := c.lock("relay " + f.SHA256)
	l.Lock()
	defer l.Unlock()
	c.mu.Lock()
	bad := c.bad[f.SHA256]
	c.mu.Unlock()
	if bad {
		return "", nil
	}
	// Encoded here already (import keeps what it pushed): the same bytes,
	// made from the checked file.
	if p := codec.Path(c.dir, CodecZstd, f.SHA256); fileExists(p) {
		return p, nil
	}
	blob, size, err := c.zstdCopy(ctx, src, artifact, f.SHA256)
	if err == nil && blob == "" {
		return "", nil
	}
	var d digest.Digest
	if err == nil {
		d, err = digest.Parse(blob)
	}
	if err == nil && size > f.Size+f.Size/16+1<<20 {
		err = fmt.Errorf("%d bytes for a file of %d: not a zstd copy of it", size, f.Size)
	}
	if err == nil && !c.store.Has(d, size) {
		var rc io.ReadCloser
		if rc, err = src.OpenCopy(ctx, artifact, blob); err == nil {
			_, err = c.store.Put(d, size, io.LimitReader(rc, size+1))
			rc.Close()
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return "", context.Cause(ctx)
		}
		// The copy is a shortcut: without it the file is encoded here.
		c.log.Warn("the registry's zstd copy could not be fetched: encoding the file here", "file", f.Path, "copy", blob, "err", err)
		c.dropCopy(f.SHA256, "")
		return "", nil
	}
	return c.store.Path(d), nil
}

// dropCopy stops relaying the zstd copy of the file with sha256 sum, and
// removes it from this machine, at path p when given.
func (c *encodedCache) dropCopy(sum, p string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bad == nil {
		c.bad = map[string]bool{}
	}
	c.bad[sum] = true
	if p != "" {
		os.Remove(p)
	}
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// ready is the path of f in enc, to send whole: the zstd copy to relay
// (relayed) where there is one, else the file encoded here.
func (c *encodedCache) ready(ctx context.Context, f bundle.File, artifact, enc string) (p string, relayed bool, err error) {
	if enc == CodecZstd {
		if p, err := c.relayed(ctx, f, artifact); err != nil || p != "" {
			return p, p != "", err
		}
	}
	p, err = c.encoded(ctx, f, artifact, enc)
	return p, false, err
}

// encodeRate is this machine's rate of encoding with enc, in bytes per
// second, and the encoded size over the size, measured once, on the
// first n bytes of r.
func (c *encodedCache) encodeRate(enc string, r io.ReaderAt, n int64) (rate, ratio float64, err error) {
	m, err := remember(c, &c.rates, "rate "+enc, func() ([2]float64, error) {
		var out discardCounter
		began := time.Now()
		if err := codec.Encode(&out, io.NewSectionReader(r, 0, n), enc); err != nil {
			return [2]float64{}, err
		}
		return [2]float64{float64(n) / max(time.Since(began).Seconds(), 1e-6), float64(out) / float64(n)}, nil
	})
	return m[0], m[1], err
}

// discardCounter counts what is written to it, and keeps none of it.
type discardCounter int64

func (d *discardCounter) Write(p []byte) (int, error) {
	*d += discardCounter(len(p))
	return len(p), nil
}

type zstdCopy struct {
	blob string
	size int64
}

// zstdCopy looks the file's zstd copy up in the registry once for every
// node.
func (c *encodedCache) zstdCopy(ctx context.Context, puller NodePuller, artifact, sum string) (string, int64, error) {
	z, err := remember(c, &c.copies, "zstd-copy "+sum, func() (zstdCopy, error) {
		blob, size, err := puller.ZstdCopy(ctx, artifact, sum)
		return zstdCopy{blob, size}, err
	})
	return z.blob, z.size, err
}

// remember is what compute made for key in *m, made once for every
// caller (they wait for the first); an error is not remembered.
func remember[T any](c *encodedCache, m *map[string]T, key string, compute func() (T, error)) (T, error) {
	l := c.lock(key)
	l.Lock()
	defer l.Unlock()
	c.mu.Lock()
	v, ok := (*m)[key]
	c.mu.Unlock()
	if ok {
		return v, nil
	}
	v, err := compute()
	if err != nil {
		return v, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if *m == nil {
		*m = map[string]T{}
	}
	(*m)[key] = v
	return v, nil
}

func (c *encodedCache) lock(key string) *sync.Mutex {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.locks == nil {
		c.locks = map[string]*sync.Mutex{}
	}
	if c.locks[key] == nil {
		c.locks[key] = &sync.Mutex{}
	}
	return c.locks[key]
}

// raw opens the file, fetched and checked against its sha256 once.
func (c *encodedCache) raw(ctx context.Context, f bundle.File, artifact string) (*os.File, error) {
	l := c.lock(f.SHA256)
	l.Lock()
	defer l.Unlock()
	d := digest.NewDigestFromEncoded(digest.SHA256, f.SHA256)
	if !c.store.Has(d, f.Size) {
		rc, err := c.source.Open(ctx, f, artifact)
		if err != nil {
			return nil, fmt.Errorf("file %s: %w", f.Path, err)
		}
		_, err = c.store.Put(d, f.Size, rc)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("file %s: %w", f.Path, err)
		}
	}
	return c.store.Open(d)
}

// encodedFrom is the path of f from byte off on (the whole file at 0),
// encoded with enc, once for every node.
func (c *encodedCache) encodedFrom(ctx context.Context, f bundle.File, artifact, enc string, off int64) (string, error) {
	raw, err := c.raw(ctx, f, artifact)
	if err != nil {
		return "", err
	}
	defer raw.Close()
	key := f.SHA256
	if off > 0 {
		key = fmt.Sprintf("%s-from-%d", f.SHA256, off)
	}
	l := c.lock(key + "." + enc)
	l.Lock()
	defer l.Unlock()
	p, err := codec.Cached(c.dir, enc, key, func() (io.ReadCloser, error) {
		return io.NopCloser(io.NewSectionReader(raw, off, f.Size-off)), nil
	})
	if err != nil {
		return "", fmt.Errorf("file %s: %w", f.Path, err)
	}
	return p, nil
}

// encoded is the path of the file encoded with codec (the raw file for
// CodecNone).
func (c *encodedCache) encoded(ctx context.Context, f bundle.File, artifact, enc string) (string, error) {
	if enc != CodecNone {
		return c.encodedFrom(ctx, f, artifact, enc, 0)
	}
	raw, err := c.raw(ctx, f, artifact)
	if err != nil {
		return "", err
	}
	defer raw.Close()
	return raw.Name(), nil
}
