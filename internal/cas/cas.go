// Package cas is a content-addressed file store: the download cache of
// `bundle create`. Every object is written to a temporary file, checked
// against its sha256 and size, and renamed into place, so an interrupted
// download leaves nothing that a re-run could mistake for a complete object.
package cas

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"

	"github.com/opencontainers/go-digest"
)

// Store keeps objects under Dir/blobs/sha256/<hex>.
type Store struct {
	Dir string
}

// ErrDigestMismatch is returned when content does not hash to what was expected.
var ErrDigestMismatch = errors.New("content does not match its digest")

// Path returns where an object lives (whether or not it exists).
func (s *Store) Path(d digest.Digest) string {
	return filepath.Join(s.Dir, "blobs", d.Algorithm().String(), d.Encoded())
}

// Has reports whether the object is present with the given size (size < 0:
// any size).
func (s *Store) Has(d digest.Digest, size int64) bool {
	if d.Validate() != nil {
		return false
	}
	fi, err := os.Stat(s.Path(d))
	return err == nil && fi.Mode().IsRegular() && (size < 0 || fi.Size() == size)
}

// Open opens a stored object.
func (s *Store) Open(d digest.Digest) (*os.File, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return os.Open(s.Path(d))
}

// Put stores r's content, which must hash to want (and be size bytes long
// when size >= 0: then no more than size+1 bytes are read, so a source
// that sends more never fills the disk). It returns the number of bytes
// written. On any error nothing is left behind.
func (s *Store) Put(want digest.Digest, size int64, r io.Reader) (int64, error) {
	if err := want.Validate(); err != nil {
		return 0, err
	}
	if want.Algorithm() != digest.SHA256 {
		return 0, fmt.Errorf("digest %s: only sha256 is supported", want)
	}
	if size >= 0 {
		r = io.LimitReader(r, size+1)
	}
	_, n, err := s.write(r, func(got digest.Digest, n int64) error {
		if got != want {
			return fmt.Errorf("%w: want %s, got %s", ErrDigestMismatch, want, got)
		}
		if size >= 0 && n != size {
			return fmt.Errorf("%w: %s: want %d bytes, got %d", ErrDigestMismatch, want, size, n)
		}
		return nil
	})
	return n, err
}

func (s *Store) write(r io.Reader, check func(digest.Digest, int64) error) (digest.Digest, int64, error) {
	dir := filepath.Join(s.Dir, "blobs", "sha256")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", 0, err
	}
	tmp, err := os.CreateTemp(dir, ".partial-*")
	if err != nil {
		return "", 0, err
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), r)
	if err != nil {
		tmp.Close()
		return "", n, err
	}
	if err := tmp.Close(); err != nil {
		return "", n, err
	}
	got := digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(h.Sum(nil)))
	if err := check(got, n); err != nil {
		return got, n, err
	}
	if err := os.Rename(tmp.Name(), s.Path(got)); err != nil {
		return got, n, err
	}
	return got, n, nil
}

// VerifyingReader wraps r so that reading it to EOF fails with
// ErrDigestMismatch unless the bytes hash to want and number size.
func VerifyingReader(r io.Reader, want digest.Digest, size int64) io.Reader {
	return &verifier{r: r, want: want, size: size, h: sha256.New()}
}

type verifier struct {
	r    io.Reader
	want digest.Digest
	size int64
	n    int64
	h    hash.Hash
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.n += int64(n)
	v.h.Write(p[:n])
	if v.size >= 0 && v.n > v.size {
		return n, fmt.Errorf("%w: %s: more than %d bytes", ErrDigestMismatch, v.want, v.size)
	}
	if err == io.EOF {
		got := digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(v.h.Sum(nil)))
		if got != v.want || (v.size >= 0 && v.n != v.size) {
			return n, fmt.Errorf("%w: want %s (%d bytes), got %s (%d bytes)", ErrDigestMismatch, v.want, v.size, got, v.n)
		}
	}
	return n, err
}
