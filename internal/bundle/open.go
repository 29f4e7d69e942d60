package bundle

import (
	"context"
	"fmt"
	"io"
	"os"
)

// Verified is a bundle file that passed Verify, with the position of every
// entry, so its content can be read in place without unpacking it.
type Verified struct {
	Manifest *Manifest
	file     *os.File
	entries  map[string]Entry
}

// Open verifies the bundle at path and keeps it open for reading entries.
// Content read later is the same bytes that were verified unless the file
// is changed in between; consumers that hand it on (the registry checks
// every pushed blob's digest) stay safe even then.
func Open(ctx context.Context, path string, trust Trust) (*Verified, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	// Only the entries' positions are kept, so the file is hashed in
	// parallel, as VerifyFile does.
	entries := map[string]Entry{}
	m, err := named(path, func() (*Manifest, error) {
		return verify(ctx, f, trust, nil, nil, func(e Entry) { entries[e.Path] = e })
	})
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Verified{Manifest: m, file: f, entries: entries}, nil
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
	return io.NewSectionReader(v.file, e.Offset, e.Size), nil
}

// BlobPath is the entry path of an image blob.
func BlobPath(digest string) string {
	if len(digest) > 7 && digest[:7] == "sha256:" {
		digest = digest[7:]
	}
	return LayoutDir + "/blobs/sha256/" + digest
}
