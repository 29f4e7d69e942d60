package bundle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrDestinationExists means extraction would overwrite something.
var ErrDestinationExists = errors.New("destination exists and is not empty")

// Extract verifies the bundle at src and unpacks it into dir, which must not
// exist (or be empty). Entries are written into a temporary directory beside
// dir, renamed to dir only once every entry and the signature have verified;
// on any failure nothing is left. Free space is checked before writing.
func Extract(ctx context.Context, src, dir string, trust Trust) (*Manifest, error) {
	dir = filepath.Clean(dir)
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("%s: %w", dir, ErrDestinationExists)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".partial-")
	if err != nil {
		return nil, err
	}
	committed := false
	defer func() {
		if !committed {
			os.RemoveAll(tmp)
		}
	}()
	f, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer f.Close()

	buf := make([]byte, 1<<20)
	onManifest := func(m *Manifest) error {
		return checkFree(parent, m.TotalSize())
	}
	m, err := Verify(ctx, src, f, trust, onManifest, func(e Entry, r io.Reader) error {
		target := filepath.Join(tmp, filepath.FromSlash(e.Path))
		if !strings.HasPrefix(target, tmp+string(os.PathSeparator)) {
			return ErrUnsafePath
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(e.Path, "bin/") || strings.HasPrefix(e.Path, "files/") {
			mode = 0o755
		}
		w, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
		if err != nil {
			return err
		}
		_, err = io.CopyBuffer(w, r, buf)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	// The signed manifest and its signature travel along, byte for byte, so
	// the extracted copy can be audited with openssl.
	if err := os.WriteFile(filepath.Join(tmp, ManifestName), m.Raw, 0o644); err != nil {
		return nil, err
	}
	if m.Signature != nil {
		if err := os.WriteFile(filepath.Join(tmp, SignatureName), m.Signature, 0o644); err != nil {
			return nil, err
		}
	}
	if err := syncFS(tmp); err != nil {
		return nil, err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	committed = true
	return m, nil
}

// syncFS flushes the file system holding dir, so a rename after it never
// exposes files whose data is not yet on disk.
func syncFS(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return unix.Syncfs(int(d.Fd()))
}
