// Package atomicfile writes files so that readers see either the old
// content or the complete new content, never a part: data goes to a
// temporary file in the same directory, is synced, and is renamed into place.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// File is a pending write. Commit makes it visible; Abort (safe after
// Commit, so it can be deferred) discards it.
type File struct {
	*os.File
	path      string
	perm      fs.FileMode
	noReplace bool
	done      bool
}

// Option tunes Create.
type Option func(*File)

// NoReplace makes Commit fail if the target already exists (keys, for one,
// must never be overwritten by accident).
func NoReplace() Option { return func(f *File) { f.noReplace = true } }

// Create starts writing path with permissions perm.
func Create(path string, perm fs.FileMode, opts ...Option) (*File, error) {
	f := &File{path: path, perm: perm}
	for _, o := range opts {
		o(f)
	}
	if f.noReplace {
		if _, err := os.Lstat(path); err == nil {
			return nil, fmt.Errorf("%s: %w", path, fs.ErrExist)
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return nil, err
	}
	f.File = tmp
	return f, nil
}

// Commit syncs, closes and renames the file into place.
func (f *File) Commit() error {
	if f.done {
		return errors.New("atomicfile: already finished")
	}
	f.done = true
	defer os.Remove(f.File.Name())
	if err := f.File.Chmod(f.perm); err != nil {
		f.File.Close()
		return err
	}
	if err := f.File.Sync(); err != nil {
		f.File.Close()
		return err
	}
	if err := f.File.Close(); err != nil {
		return err
	}
	if f.noReplace {
		// Link fails if the target appeared meanwhile; rename would not.
		if err := os.Link(f.File.Name(), f.path); err != nil {
			return fmt.Errorf("%s: %w", f.path, err)
		}
	} else if err := os.Rename(f.File.Name(), f.path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(f.path))
}

// Abort discards the pending write; after Commit it does nothing.
func (f *File) Abort() {
	if f.done {
		return
	}
	f.done = true
	f.File.Close()
	os.Remove(f.File.Name())
}

// WriteFile writes data to path atomically.
func WriteFile(path string, data []byte, perm fs.FileMode, opts ...Option) error {
	f, err := Create(path, perm, opts...)
	if err != nil {
		return err
	}
	defer f.Abort()
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.Commit()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return err
	}
	return nil
}
