package bundle

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
)

// Verified is a bundle file that passed Verify (Open), or all of it but
// its entries' content (OpenIndex), with the position of every entry, so
// its content can be read in place without unpacking it.
type Verified struct {
	Manifest *Manifest
	file     *os.File
	entries  map[string]Entry
	name     string
	// checked: every entry's content was hashed (Open); else (OpenIndex)
	// only OpenChecked reads content.
	checked bool
}

// Open verifies the bundle at path and keeps it open for reading entries.
// Content read later is the same bytes that were verified unless the file
// is changed in between; consumers that hand it on (the registry checks
// every pushed blob's digest) stay safe even then.
func Open(ctx context.Context, path string, trust Trust) (*Verified, error) {
	return open(ctx, path, trust, true)
}

// OpenIndex checks the bundle at path as Open does but for its entries'
// content: the signature, the manifest, every signed entry there with its
// signed size and nothing else, the tar's structure, and a .run file's
// installer. Each entry's content is checked against its signed sha256
// as OpenChecked reads it, so it is read once, where it is used (import
// pushes it), and an entry nobody reads is not read at all.
func OpenIndex(ctx context.Context, path string, trust Trust) (*Verified, error) {
	return open(ctx, path, trust, false)
}

func open(ctx context.Context, path string, trust Trust, content bool) (*Verified, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	// Only the entries' positions are kept, so the file is hashed (when
	// content is) in parallel, as VerifyFile does.
	entries := map[string]Entry{}
	m, err := named(path, func() (*Manifest, error) {
		return verify(ctx, f, trust, nil, nil, func(e Entry) { entries[e.Path] = e }, content)
	})
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Verified{Manifest: m, file: f, entries: entries, name: path, checked: content}, nil
}

// Close releases the file.
func (v *Verified) Close() error { return v.file.Close() }

// Entry returns the entry at path.
func (v *Verified) Entry(path string) (Entry, bool) {
	e, ok := v.entries[path]
	return e, ok
}

// OpenEntry returns a reader of the entry at path.
func (v *Verified) OpenEntry(path string) (*io.SectionReader, error) {
	e, ok := v.entries[path]
	if !ok {
		return nil, fmt.Errorf("bundle has no entry %s", path)
	}
	if !v.checked {
		return nil, fmt.Errorf("bundle %s: entry %s: its content is not checked yet (opened with OpenIndex: read it with OpenChecked)", v.name, path)
	}
	return io.NewSectionReader(v.file, e.Offset, e.Size), nil
}

// OpenChecked returns a reader of the entry at path that checks it
// against its signed sha256 as it goes: the entry's last bytes are handed
// on only when the whole entry matched, else Read fails with a
// *VerifyError (ErrModified) and those bytes are withheld, so that what
// the reader feeds (an HTTP upload of known length) is cut short and
// never completes with the wrong content.
func (v *Verified) OpenChecked(path string) (io.Reader, error) {
	e, ok := v.entries[path]
	if !ok {
		return nil, fmt.Errorf("bundle has no entry %s", path)
	}
	if e.Size == 0 {
		// Nothing to read: the empty content's sum is checked here.
		if err := v.checkSum(e, sha256.New()); err != nil {
			return nil, err
		}
	}
	return &checkedReader{r: io.NewSectionReader(v.file, e.Offset, e.Size), h: sha256.New(), e: e, left: e.Size, v: v}, nil
}

// checkSum is checkSum for the whole entry e hashed into h, naming the
// bundle.
func (v *Verified) checkSum(e Entry, h hash.Hash) error {
	err := checkSum(e, e.Size, h.Sum(nil))
	var ve *VerifyError
	if errors.As(err, &ve) {
		ve.Bundle = v.name
	}
	return err
}

type checkedReader struct {
	r    io.Reader
	h    hash.Hash
	e    Entry
	left int64
	v    *Verified
	err  error
}

func (c *checkedReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.left -= int64(n)
	switch {
	case c.left == 0:
		if c.err = c.v.checkSum(c.e, c.h); c.err != nil {
			return 0, c.err
		}
		return n, nil
	case err == io.EOF:
		c.err = &VerifyError{Bundle: c.v.name, Entry: c.e.Path, Err: ErrTruncated}
		return n, c.err
	}
	return n, err
}

// BlobPath is the entry path of an image blob.
func BlobPath(digest string) string {
	if len(digest) > 7 && digest[:7] == "sha256:" {
		digest = digest[7:]
	}
	return LayoutDir + "/blobs/sha256/" + digest
}
