// Package codec encodes files for the wire, the same way wherever kubelift
// does it (staging over SSH, the compressed copies import pushes for nodes
// to pull), and keeps each encoding once per file in a cache directory.
package codec

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/kubelift/kubelift/internal/atomicfile"
)

// The encodings.
const (
	// Zstd is zstd at its fastest level, one encoder goroutine: about as
	// small as gzip's fastest, several times quicker on one core, and the
	// same bytes for the same input every time.
	Zstd = "zstd"
	Gzip = "gzip"
	// None is the file as it is.
	None = "none"
)

// A file's zstd copy in the private registry is an artifact of its own,
// beside the file's: tagged ZstdTag(SHA256) in the file's repository, its
// one layer of ZstdMediaType annotated with the sha256 of what it decodes
// to (checked against the signed one on the node, so the tag is a hint,
// not a trust).
const (
	ZstdMediaType           = "application/zstd"
	AnnotationDecodedSHA256 = "dev.kubelift.decoded-sha256"
)

// ZstdTag is the tag of the zstd copy of the file with sha256 sum.
func ZstdTag(sum string) string { return "sha256-" + sum + ".zst" }

// Encode writes r to w in codec.
func Encode(w io.Writer, r io.Reader, codec string) error {
	var zw io.WriteCloser
	switch codec {
	case Zstd:
		e, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
		if err != nil {
			return err
		}
		zw = e
	case Gzip:
		zw, _ = gzip.NewWriterLevel(w, gzip.BestSpeed)
	case None:
		_, err := io.Copy(w, r)
		return err
	default:
		return fmt.Errorf("unknown codec %q", codec)
	}
	if _, err := io.Copy(zw, r); err != nil {
		zw.Close()
		return err
	}
	return zw.Close()
}

// Path is where the cache in dir keeps the file with sha256 sum encoded
// with codec.
func Path(dir, codec, sum string) string { return filepath.Join(dir, codec, sum+"."+codec) }

// Cached returns the cached encoding of the file with sha256 sum, made
// from open's content when it is not there yet (written atomically, so a
// reader never sees half of one). Callers serialise calls for one file.
func Cached(dir, codec, sum string, open func() (io.ReadCloser, error)) (string, error) {
	p := Path(dir, codec, sum)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	r, err := open()
	if err != nil {
		return "", err
	}
	defer r.Close()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	out, err := atomicfile.Create(p, 0o644)
	if err != nil {
		return "", err
	}
	defer out.Abort()
	if err := Encode(out.File, r, codec); err != nil {
		return "", fmt.Errorf("%s: %w", codec, err)
	}
	if err := out.Commit(); err != nil {
		return "", err
	}
	return p, nil
}

// CheckDecoded says whether the zstd file at p decodes to size bytes with
// sha256 sum.
func CheckDecoded(p, sum string, size int64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := zstd.NewReader(f, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return err
	}
	defer zr.Close()
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(zr, size+1))
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); n != size || got != sum {
		return fmt.Errorf("decodes to %d bytes, sha256 %s; the file is %d bytes, %s", n, got, size, sum)
	}
	return nil
}
