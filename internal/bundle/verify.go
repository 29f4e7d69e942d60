package bundle

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"github.com/kubelift/kubelift/internal/iocount"
)

// Rejections, each wrapped in a *VerifyError naming the entry.
var (
	ErrUnsigned       = errors.New("bundle is unsigned")
	ErrBadSignature   = errors.New("signature does not verify: the manifest was modified or signed by another key")
	ErrWrongKey       = errors.New("bundle was signed by a different key")
	ErrNotBundle      = errors.New("not a kubelift bundle")
	ErrModified       = errors.New("content does not match the signed sha256")
	ErrSizeMismatch   = errors.New("size differs from the signed manifest")
	ErrMissingEntry   = errors.New("entry listed in the signed manifest is missing")
	ErrExtraEntry     = errors.New("entry is not in the signed manifest")
	ErrDuplicateEntry = errors.New("entry appears twice")
	ErrTruncated      = errors.New("bundle is truncated")
	ErrUnsafePath     = errors.New("unsafe path (absolute, '..' or not clean)")
	ErrNotRegular     = errors.New("not a regular file (links, devices and directories are refused)")
	ErrTrailingData   = errors.New("data after the end of the bundle")
)

// VerifyError says which entry of which bundle failed and why.
type VerifyError struct {
	Bundle string
	Entry  string
	Err    error
}

func (e *VerifyError) Error() string {
	s := "bundle"
	if e.Bundle != "" {
		s += " " + e.Bundle
	}
	if e.Entry != "" {
		s += ": entry " + e.Entry
	}
	return s + ": " + e.Err.Error()
}

func (e *VerifyError) Unwrap() error { return e.Err }

// Final says trying again cannot cure it: the bundle's bytes are what
// they are (a pusher reading a blob through OpenChecked stops retrying).
func (e *VerifyError) Final() bool { return true }

// Trust says which signatures to accept.
type Trust struct {
	// Key is the operator's public key. Never taken from the bundle.
	Key *ecdsa.PublicKey
	// AllowUnsigned accepts bundles made with --unsigned (entries are still
	// checked against the manifest; nothing proves who made it).
	AllowUnsigned bool
}

// EntryFunc receives each verified-so-far entry's content. The content is
// hashed as it is read; the entry is rejected after EntryFunc returns if it
// does not match, so anything EntryFunc writes must stay untrusted until
// Read returns nil.
type EntryFunc func(e Entry, r io.Reader) error

// Verify reads a bundle (plain tar or .run) from r in one pass, checking the
// signature before passing any entry to fn (which may be nil), and returns
// the verified manifest. name labels errors.
func Verify(ctx context.Context, name string, r io.Reader, trust Trust, onManifest func(*Manifest) error, fn EntryFunc) (*Manifest, error) {
	return named(name, func() (*Manifest, error) { return verify(ctx, r, trust, onManifest, fn, nil, true) })
}

// named labels a verification error with the bundle's name.
func named(name string, verify func() (*Manifest, error)) (*Manifest, error) {
	m, err := verify()
	if err != nil {
		var ve *VerifyError
		if errors.As(err, &ve) {
			if ve.Bundle == "" {
				ve.Bundle = name
			}
			return nil, ve
		}
		return nil, &VerifyError{Bundle: name, Err: err}
	}
	return m, nil
}

// VerifyFile verifies the bundle at path.
func VerifyFile(ctx context.Context, path string, trust Trust) (*Manifest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Verify(ctx, path, f, trust, nil, nil)
}

// verify checks the bundle in r, passing each entry's content to fn and
// its position to at (either may be nil); with content false (a regular
// file, fn nil) the entries' content is left for their readers to check
// (Verified.OpenChecked).
func verify(ctx context.Context, r io.Reader, trust Trust, onManifest func(*Manifest) error, fn EntryFunc, at func(Entry), content bool) (*Manifest, error) {
	// A regular file nobody needs the content of is hashed in parallel:
	// the tar reader seeks past each entry's data while another core
	// hashes that entry in place. A stream is hashed as it passes.
	file, size := regularFile(r)
	parallel := file != nil && fn == nil
	var br *bufio.Reader
	if parallel {
		br = bufio.NewReaderSize(io.NewSectionReader(file, 0, min(size, StubSize)), StubSize)
	} else {
		br = bufio.NewReaderSize(r, 1<<20)
	}
	stub, err := readStub(br)
	if err != nil {
		return nil, err
	}
	var base int64 // file offset of the tar stream
	var cr posReader
	var rest io.Reader // what follows the tar stream in a .run file
	switch {
	case parallel:
		end := size
		if stub != nil {
			base = StubSize
			end = min(size, base+stub.PayloadSize)
			rest = io.NewSectionReader(file, end, size-end)
		}
		cr = &seekCounter{r: io.NewSectionReader(file, base, end-base)}
	case stub != nil:
		base = StubSize
		cr = iocount.NewReader(io.LimitReader(br, stub.PayloadSize))
		rest = br
	default:
		cr = iocount.NewReader(br)
	}
	tr := tar.NewReader(cr)

	manifestData, err := readSmallEntry(tr, ManifestName, maxManifestSize)
	if err != nil {
		return nil, err
	}
	hdr, err := tr.Next()
	if err != nil {
		return nil, truncated(ManifestName, err)
	}
	var sig []byte
	var first *tar.Header
	if hdr.Name == SignatureName {
		if sig, err = readBody(tr, hdr, maxSignatureSize); err != nil {
			return nil, err
		}
	} else {
		first = hdr // unsigned bundle: the header we read is the first content entry
	}
	if err := checkSignature(manifestData, sig, trust); err != nil {
		return nil, err
	}
	m, err := parseManifest(manifestData)
	if err != nil {
		return nil, err
	}
	m.Signature = sig
	if stub != nil && (m.InstallerSHA256 == "" || m.InstallerSize != stub.InstallerSize) {
		return nil, &VerifyError{Entry: "installer", Err: fmt.Errorf("%w: the .run stub's installer is not the one the manifest names", ErrModified)}
	}
	if onManifest != nil {
		if err := onManifest(m); err != nil {
			return nil, err
		}
	}

	want := make(map[string]Entry, len(m.Entries))
	for _, e := range m.Entries {
		want[e.Path] = e
	}
	seen := make(map[string]bool, len(m.Entries))
	hashers := newHashers(ctx, file)
	defer hashers.wait()
	var last *Entry // the entry before the header being read
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hdr := first
		first = nil
		if hdr == nil {
			if hdr, err = tr.Next(); err == io.EOF {
				// tar.Reader also ends quietly where the stream stops at
				// an entry's end: only the end marker's two zero blocks
				// after the last entry's padded data say nothing was cut.
				if last != nil && base+cr.N() < (last.Offset+last.Size+511)/512*512+1024 {
					return nil, &VerifyError{Entry: last.Path, Err: fmt.Errorf("%w: it stops after this entry, with no tar end marker", ErrTruncated)}
				}
				break
			} else if err != nil {
				// In parallel mode the tar reader seeks over data, so a cut
				// inside the last entry shows up here: name that entry.
				if sc, ok := cr.(*seekCounter); ok && last != nil && last.Offset+last.Size > base+sc.r.Size() {
					return nil, truncated(last.Path, err)
				}
				return nil, truncated(lastName(seen), err)
			}
		}
		e, err := checkHeader(hdr, want, seen)
		if err != nil {
			return nil, err
		}
		// tar.Reader reads exactly the header blocks, so the position is
		// where this entry's data begins.
		e.Offset = base + cr.N()
		last = &e
		if at != nil {
			at(e)
		}
		if parallel {
			if !content {
				continue
			}
			if err := hashers.add(e); err != nil {
				return nil, err
			}
			continue
		}
		if err := checkEntry(e, tr, fn); err != nil {
			return nil, err
		}
	}
	if err := hashers.wait(); err != nil {
		return nil, err
	}
	for _, e := range m.Entries {
		if !seen[e.Path] {
			return nil, &VerifyError{Entry: e.Path, Err: ErrMissingEntry}
		}
	}
	// After the tar end marker only zero padding may follow.
	if err := onlyZeros(cr); err != nil {
		return nil, err
	}
	if stub != nil {
		if cr.N() != stub.PayloadSize {
			return nil, &VerifyError{Entry: "payload", Err: ErrTruncated}
		}
		if err := checkInstaller(rest, m); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// checkEntry passes an entry's content to fn while hashing it, then checks
// size and hash.
func checkEntry(e Entry, r io.Reader, fn EntryFunc) error {
	h := sha256.New()
	hr := &hashingReader{r: r, h: h}
	if fn != nil {
		if err := fn(e, hr); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return truncated(e.Path, err)
			}
			return &VerifyError{Entry: e.Path, Err: err}
		}
	}
	if _, err := io.Copy(io.Discard, hr); err != nil {
		return truncated(e.Path, err)
	}
	return checkSum(e, hr.n, h.Sum(nil))
}

func checkSum(e Entry, n int64, sum []byte) error {
	if n != e.Size {
		return &VerifyError{Entry: e.Path, Err: ErrTruncated}
	}
	if got := hex.EncodeToString(sum); got != e.SHA256 {
		return &VerifyError{Entry: e.Path, Err: fmt.Errorf("%w (sha256 %s, signed %s)", ErrModified, got, e.SHA256)}
	}
	return nil
}

func checkSignature(manifest, sig []byte, trust Trust) error {
	if sig == nil {
		if trust.AllowUnsigned {
			return nil
		}
		return &VerifyError{Entry: SignatureName, Err: fmt.Errorf("%w: it has no %s (accept it only with --allow-unsigned)", ErrUnsigned, SignatureName)}
	}
	if trust.Key == nil {
		if trust.AllowUnsigned {
			return nil // signature present but nobody to check it against
		}
		return &VerifyError{Entry: SignatureName, Err: errors.New("no trusted public key given (--key)")}
	}
	if verifySignature(trust.Key, manifest, sig) == nil {
		return nil
	}
	// The manifest is untrusted here; its claimed signer only helps the message.
	if m, err := parseManifest(manifest); err == nil && m.Signer != "" && m.Signer != Fingerprint(trust.Key) {
		return &VerifyError{Entry: SignatureName, Err: fmt.Errorf("%w: the bundle claims %s, the key given is %s", ErrWrongKey, m.Signer, Fingerprint(trust.Key))}
	}
	return &VerifyError{Entry: SignatureName, Err: ErrBadSignature}
}

func checkHeader(hdr *tar.Header, want map[string]Entry, seen map[string]bool) (Entry, error) {
	if err := checkPath(hdr.Name); err != nil {
		return Entry{}, &VerifyError{Entry: hdr.Name, Err: err}
	}
	if hdr.Typeflag != tar.TypeReg {
		return Entry{}, &VerifyError{Entry: hdr.Name, Err: ErrNotRegular}
	}
	if seen[hdr.Name] || hdr.Name == ManifestName || hdr.Name == SignatureName {
		return Entry{}, &VerifyError{Entry: hdr.Name, Err: ErrDuplicateEntry}
	}
	e, ok := want[hdr.Name]
	if !ok {
		return Entry{}, &VerifyError{Entry: hdr.Name, Err: ErrExtraEntry}
	}
	if hdr.Size != e.Size {
		return Entry{}, &VerifyError{Entry: hdr.Name, Err: fmt.Errorf("%w: %d bytes, signed %d", ErrSizeMismatch, hdr.Size, e.Size)}
	}
	seen[hdr.Name] = true
	return e, nil
}

func readSmallEntry(tr *tar.Reader, name string, limit int64) ([]byte, error) {
	hdr, err := tr.Next()
	if err != nil {
		if err == io.EOF {
			return nil, &VerifyError{Err: fmt.Errorf("%w: empty archive", ErrNotBundle)}
		}
		if errors.Is(err, tar.ErrHeader) {
			return nil, &VerifyError{Err: fmt.Errorf("%w: %v", ErrNotBundle, err)}
		}
		return nil, truncated(name, err)
	}
	if hdr.Name != name {
		return nil, &VerifyError{Entry: hdr.Name, Err: fmt.Errorf("%w: the first entry must be %s", ErrNotBundle, name)}
	}
	return readBody(tr, hdr, limit)
}

func readBody(tr *tar.Reader, hdr *tar.Header, limit int64) ([]byte, error) {
	if hdr.Typeflag != tar.TypeReg {
		return nil, &VerifyError{Entry: hdr.Name, Err: ErrNotRegular}
	}
	if hdr.Size > limit {
		return nil, &VerifyError{Entry: hdr.Name, Err: fmt.Errorf("%d bytes, more than the %d allowed", hdr.Size, limit)}
	}
	b := make([]byte, hdr.Size)
	if _, err := io.ReadFull(tr, b); err != nil {
		return nil, truncated(hdr.Name, err)
	}
	return b, nil
}

func truncated(entry string, err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return &VerifyError{Entry: entry, Err: ErrTruncated}
	}
	return &VerifyError{Entry: entry, Err: err}
}

func lastName(seen map[string]bool) string {
	if len(seen) == 0 {
		return SignatureName
	}
	return "after the last complete entry"
}

func onlyZeros(r io.Reader) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if !allZero(buf[:n]) {
			return &VerifyError{Err: ErrTrailingData}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func allZero(b []byte) bool {
	return len(bytes.Trim(b, "\x00")) == 0
}

type hashingReader struct {
	r io.Reader
	h hash.Hash
	n int64
}

func (h *hashingReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	h.n += int64(n)
	return n, err
}

// posReader knows how far into the tar stream it is.
type posReader interface {
	io.Reader
	N() int64
}

// seekCounter lets tar.Reader seek over entry data it is not asked for.
type seekCounter struct {
	r *io.SectionReader
	n int64
}

func (c *seekCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *seekCounter) Seek(offset int64, whence int) (int64, error) {
	n, err := c.r.Seek(offset, whence)
	if err == nil {
		c.n = n
	}
	return n, err
}

func (c *seekCounter) N() int64 { return c.n }

// regularFile returns r as a ReaderAt with its size when it is a regular file.
func regularFile(r io.Reader) (io.ReaderAt, int64) {
	f, ok := r.(*os.File)
	if !ok {
		return nil, 0
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, 0
	}
	return f, fi.Size()
}

// VerifyManifest checks a bundle.json kept apart from its bundle (the copy
// a cluster record holds) against its signature and the trusted key, and
// parses it. Nothing in it is trusted otherwise.
func VerifyManifest(manifest, sig []byte, trust Trust) (*Manifest, error) {
	if err := checkSignature(manifest, sig, trust); err != nil {
		return nil, err
	}
	m, err := parseManifest(manifest)
	if err != nil {
		return nil, &VerifyError{Entry: ManifestName, Err: err}
	}
	m.Signature = sig
	return m, nil
}
