package fleet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/gzip"

	"github.com/kubelift/kubelift/internal/iocount"
)

// prefixLen is how much of a staged stream is read before deciding
// whether to decompress it: enough to tell one compressed binary from
// another (the ELF header and Go build ID come first).
const prefixLen = 64 << 10

// streamCache spares decompressing the same gzip stream for every node.
// Staging sends each node the same compressed bytes, so what a stream
// decompresses to is known after the first: the cache maps the sha256 of
// a whole compressed stream to the sha256 and size of its content.
//
// A stream cannot be rewound, so whether to decompress is decided from
// its first prefixLen bytes: the first stream with a given prefix (the
// leader) is decompressed and hashed for real; the next ones only hash
// their compressed bytes and, at the end, look up the leader's result. A
// stream that shares its prefix with a known one but differs further on
// (or whose leader failed) cannot be checked and is refused.
type streamCache struct {
	mu           sync.Mutex
	byPrefix     map[[32]byte]*leader
	byStream     map[[32]byte]content
	hits, misses atomic.Int64
}

type leader struct{ done chan struct{} }

// content is what a stream decompresses to.
type content struct {
	sum  string
	size int64
}

var errUnverifiable = errors.New("fleet: the stream shares its first bytes with another but differs (or that one failed): it was not decompressed, so it cannot be checked")

var prefixPool = sync.Pool{New: func() any { b := make([]byte, prefixLen); return &b }}

// read consumes a gzip stream and returns what it decompresses to and the
// compressed bytes read. A stream that does not decompress returns what
// decompressed before the error, and the error (gzip's complaint).
func (c *streamCache) read(ctx context.Context, in io.Reader) (content, int64, error) {
	bp := prefixPool.Get().(*[]byte)
	defer prefixPool.Put(bp)
	buf := *bp
	n, err := io.ReadFull(in, buf)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return content{}, int64(n), err
	}
	prefix := buf[:n]
	whole := sha256.New()
	counted := iocount.NewReader(io.TeeReader(io.MultiReader(bytes.NewReader(prefix), in), whole))
	if n < prefixLen {
		// Small: decompressing is as cheap as looking up.
		got, err := decompress(counted)
		return got, counted.N(), err
	}
	key := sha256.Sum256(prefix)
	c.mu.Lock()
	if c.byPrefix == nil {
		c.byPrefix, c.byStream = map[[32]byte]*leader{}, map[[32]byte]content{}
	}
	l, known := c.byPrefix[key]
	if !known {
		l = &leader{done: make(chan struct{})}
		c.byPrefix[key] = l
	}
	c.mu.Unlock()

	if !known {
		c.misses.Add(1)
		got, err := decompress(counted)
		c.mu.Lock()
		if err == nil {
			c.byStream[sum32(whole)] = got
		} else {
			delete(c.byPrefix, key) // let the next stream lead
		}
		c.mu.Unlock()
		close(l.done)
		return got, counted.N(), err
	}
	if _, err := io.Copy(io.Discard, counted); err != nil {
		return content{}, counted.N(), err
	}
	select {
	case <-l.done:
	case <-ctx.Done():
		return content{}, counted.N(), ctx.Err()
	}
	c.mu.Lock()
	got, ok := c.byStream[sum32(whole)]
	c.mu.Unlock()
	if !ok {
		return content{}, counted.N(), errUnverifiable
	}
	c.hits.Add(1)
	return got, counted.N(), nil
}

// decompress is `gzip -dc | sha256sum` (and the size): it reads r to its
// end, trailing bytes included.
func decompress(r io.Reader) (content, error) {
	h := sha256.New()
	var size int64
	zr, err := gzip.NewReader(r)
	if err == nil {
		size, err = io.Copy(h, zr)
	}
	if err != nil {
		err = fmt.Errorf("gzip: stdin: %w", err)
	}
	_, _ = io.Copy(io.Discard, r)
	return content{sum: hex.EncodeToString(h.Sum(nil)), size: size}, err
}

func sum32(h hash.Hash) [32]byte {
	var k [32]byte
	copy(k[:], h.Sum(nil))
	return k
}
