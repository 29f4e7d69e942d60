package bundle

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/kubelift/kubelift/internal/atomicfile"
	"github.com/kubelift/kubelift/internal/cas"
)

// pipe delivers blobs as they arrive in the cache.
type pipe struct {
	ready <-chan v1.Hash
	done  <-chan error // the fetch's result; all ready sends precede it
	n     int
}

// write streams the bundle into a temporary file beside opts.Output and
// renames it into place only when complete. Entries are written in the
// order they become available (verification checks the set, not the
// order): manifest, signature, layout metadata, files, then blobs as the
// background fetch lands them.
func write(ctx context.Context, opts *CreateOptions, m *Manifest, mem map[string][]byte, store *cas.Store, format Format, blobs pipe, log *slog.Logger) error {
	manifestJSON, err := m.Marshal()
	if err != nil {
		return err
	}
	var sig []byte
	if opts.SignKey != nil {
		if sig, err = sign(opts.SignKey, manifestJSON); err != nil {
			return fmt.Errorf("sign: %w", err)
		}
	}
	need := m.TotalSize() + int64(len(manifestJSON)) + int64(len(m.Entries)+2)*1024 + m.InstallerSize + StubSize
	if err := checkFree(filepath.Dir(opts.Output), need); err != nil {
		return err
	}
	perm := os.FileMode(0o644)
	if format == FormatRun {
		perm = 0o755
	}
	out, err := atomicfile.Create(opts.Output, perm)
	if err != nil {
		return err
	}
	defer out.Abort()
	info := stubInfo{InstallerSHA256: m.InstallerSHA256, InstallerSize: m.InstallerSize}
	arch := m.Arches[0]
	if format == FormatRun {
		stub, err := renderStub(m.KubernetesVersion, arch, filepath.Base(opts.Output), m.Tool.Version, info)
		if err != nil {
			return err
		}
		if _, err := out.Write(stub); err != nil {
			return err
		}
	}
	ts := &tarStream{f: out.File, mtime: m.Created}
	if err := ts.addBytes(ManifestName, manifestJSON); err != nil {
		return err
	}
	if sig != nil {
		if err := ts.addBytes(SignatureName, sig); err != nil {
			return err
		}
	}
	byDigest := map[string]Entry{}
	for _, e := range m.Entries {
		if data, ok := mem[e.Path]; ok {
			if err := ts.addBytes(e.Path, data); err != nil {
				return err
			}
		} else if strings.HasPrefix(e.Path, LayoutDir+"/blobs/") {
			byDigest[e.SHA256] = e
		} else if err := ts.addCached(store, e); err != nil {
			return err
		}
	}
	for written, fetched := 0, false; written < blobs.n; {
		select {
		case h := <-blobs.ready:
			e, ok := byDigest[h.Hex]
			if !ok {
				return fmt.Errorf("fetched blob %s is not in the manifest", h)
			}
			if err := ts.addCached(store, e); err != nil {
				return err
			}
			written++
		case err := <-blobs.done:
			if err != nil {
				return err
			}
			if fetched {
				return fmt.Errorf("fetch finished with %d of %d blobs", written, blobs.n)
			}
			fetched = true
			blobs.done = nil // every ready send has happened; drain the rest
			if len(blobs.ready) < blobs.n-written {
				return fmt.Errorf("fetch finished with %d of %d blobs", written+len(blobs.ready), blobs.n)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := ts.close(); err != nil {
		return err
	}
	if format == FormatRun {
		in, err := os.Open(opts.Installer)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, cas.VerifyingReader(in, digest.NewDigestFromEncoded(digest.SHA256, m.InstallerSHA256), m.InstallerSize))
		in.Close()
		if err != nil {
			return fmt.Errorf("installer %s changed while bundling: %w", opts.Installer, err)
		}
		info.PayloadSize = ts.n
		stub, err := renderStub(m.KubernetesVersion, arch, filepath.Base(opts.Output), m.Tool.Version, info)
		if err != nil {
			return err
		}
		if _, err := out.WriteAt(stub, 0); err != nil {
			return err
		}
	}
	log.Info("bundle written", "file", opts.Output, "bytes", ts.n)
	if err := out.Commit(); err != nil {
		return err
	}
	if opts.SignKey != nil {
		return writeDetached(opts.Output, opts.SignKey)
	}
	return nil
}

// DetachedSumSuffix and DetachedSigSuffix name the files beside a signed
// bundle FILE that let it be checked without running anything of it:
// FILE.sha256 (sha256sum's format) and FILE.sha256.sig (its ECDSA
// signature, as `openssl dgst -sha256 -sign` makes it):
//
//	openssl dgst -sha256 -verify team.pub -signature FILE.sha256.sig FILE.sha256
//	sha256sum -c FILE.sha256
const (
	DetachedSumSuffix = ".sha256"
	DetachedSigSuffix = ".sha256.sig"
)

// writeDetached writes FILE.sha256 and FILE.sha256.sig, each atomically.
func writeDetached(file string, key *ecdsa.PrivateKey) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	sum := []byte(hex.EncodeToString(h.Sum(nil)) + "  " + filepath.Base(file) + "\n")
	sig, err := sign(key, sum)
	if err != nil {
		return fmt.Errorf("sign %s: %w", file+DetachedSumSuffix, err)
	}
	if err := atomicfile.WriteFile(file+DetachedSumSuffix, sum, 0o644); err != nil {
		return err
	}
	return atomicfile.WriteFile(file+DetachedSigSuffix, sig, 0o644)
}

// tarStream writes a tar stream to f. File data is copied from the cache
// with (*os.File).ReadFrom, which the kernel does without a trip through
// user space (copy_file_range); cache objects were verified before they
// were renamed into the cache, and `bundle verify` checks the result.
type tarStream struct {
	f     *os.File
	mtime time.Time
	n     int64
}

func (t *tarStream) header(name string, size int64) error {
	mode := int64(0o644)
	if strings.HasPrefix(name, "bin/") || strings.HasPrefix(name, "files/") {
		mode = 0o755
	}
	var buf bytes.Buffer
	// A throwaway writer renders the header block(s); its data accounting
	// is not used, so it is never closed.
	if err := tar.NewWriter(&buf).WriteHeader(&tar.Header{Name: name, Size: size, Mode: mode, ModTime: t.mtime, Typeflag: tar.TypeReg}); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return t.write(buf.Bytes())
}

func (t *tarStream) write(b []byte) error {
	n, err := t.f.Write(b)
	t.n += int64(n)
	return err
}

func (t *tarStream) pad(size int64) error {
	if r := size % 512; r != 0 {
		return t.write(make([]byte, 512-r))
	}
	return nil
}

func (t *tarStream) addBytes(name string, data []byte) error {
	if err := t.header(name, int64(len(data))); err != nil {
		return err
	}
	if err := t.write(data); err != nil {
		return err
	}
	return t.pad(int64(len(data)))
}

func (t *tarStream) addCached(store *cas.Store, e Entry) error {
	d := digest.NewDigestFromEncoded(digest.SHA256, e.SHA256)
	src, err := store.Open(d)
	if err != nil {
		return fmt.Errorf("cache %s: %w", store.Path(d), err)
	}
	defer src.Close()
	if fi, err := src.Stat(); err != nil || fi.Size() != e.Size {
		return fmt.Errorf("cache %s: size differs from %d: remove it and run again", store.Path(d), e.Size)
	}
	if err := t.header(e.Path, e.Size); err != nil {
		return err
	}
	n, err := t.f.ReadFrom(io.LimitReader(src, e.Size))
	t.n += n
	if err != nil {
		return fmt.Errorf("%s: %w", e.Path, err)
	}
	if n != e.Size {
		return fmt.Errorf("%s: copied %d of %d bytes", e.Path, n, e.Size)
	}
	// Start writing this entry to disk now, while later blobs still
	// download, so the fsync before the final rename has little left to do.
	_ = unix.SyncFileRange(int(t.f.Fd()), t.n-n, n, unix.SYNC_FILE_RANGE_WRITE)
	return t.pad(e.Size)
}

// close writes the end-of-archive marker: two zero blocks.
func (t *tarStream) close() error { return t.write(make([]byte, 1024)) }

// HashFile is the sha256 (hex) and size of the file at p.
func HashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
