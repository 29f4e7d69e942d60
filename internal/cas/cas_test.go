package cas

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
)

func TestPutVerifiesAndIsAtomic(t *testing.T) {
	s := &Store{Dir: t.TempDir()}
	data := []byte("hello kubelift")
	d := digest.FromBytes(data)

	if s.Has(d, -1) {
		t.Fatal("empty store has object")
	}
	// Wrong content: rejected, nothing left behind.
	if _, err := s.Put(d, int64(len(data)), strings.NewReader("tampered")); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("Put(wrong) = %v", err)
	}
	// Interrupted download: reader fails half way.
	r := io.MultiReader(bytes.NewReader(data[:5]), iotestErr{})
	if _, err := s.Put(d, int64(len(data)), r); err == nil {
		t.Fatal("Put(interrupted) succeeded")
	}
	entries, _ := os.ReadDir(filepath.Join(s.Dir, "blobs", "sha256"))
	if len(entries) != 0 {
		t.Fatalf("left behind %d files", len(entries))
	}
	if n, err := s.Put(d, int64(len(data)), bytes.NewReader(data)); err != nil || n != int64(len(data)) {
		t.Fatalf("Put = %d, %v", n, err)
	}
	if !s.Has(d, int64(len(data))) || s.Has(d, 3) {
		t.Fatal("Has disagrees with size")
	}
	f, err := s.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, _ := io.ReadAll(f)
	if !bytes.Equal(got, data) {
		t.Fatal("content differs")
	}
}

// A source that sends more than the size given is read no further than
// one byte past it: an endless one does not fill the disk.
func TestPutReadsNoMoreThanTheSize(t *testing.T) {
	s := &Store{Dir: t.TempDir()}
	endless := &countingReader{}
	want := digest.FromString(strings.Repeat("\x00", 1000))
	if _, err := s.Put(want, 1000, endless); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("Put of an endless source: %v", err)
	}
	if endless.n > 1001 {
		t.Errorf("read %d bytes for an object of 1000", endless.n)
	}
	if s.Has(want, -1) {
		t.Error("stored")
	}
}

// countingReader is endless zeros, counting what was read.
type countingReader struct{ n int64 }

func (r *countingReader) Read(p []byte) (int, error) {
	clear(p)
	r.n += int64(len(p))
	return len(p), nil
}

func TestVerifyingReader(t *testing.T) {
	d := digest.FromString("abc")
	if _, err := io.ReadAll(VerifyingReader(strings.NewReader("abc"), d, 3)); err != nil {
		t.Fatal(err)
	}
	for _, in := range []string{"abd", "ab", "abcd"} {
		if _, err := io.ReadAll(VerifyingReader(strings.NewReader(in), d, 3)); !errors.Is(err, ErrDigestMismatch) {
			t.Errorf("%q: err = %v", in, err)
		}
	}
}

type iotestErr struct{}

func (iotestErr) Read([]byte) (int, error) { return 0, errors.New("connection reset") }
