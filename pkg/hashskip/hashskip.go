// Package hashskip is the hash-skip cache: the one place that says when an
// upgraded kubelet may keep a running container whose recorded spec hash
// no longer matches, because the kubelet's hash algorithm changed (1.30 ->
// 1.31 changes every container's hash) rather than the container.
//
// It is public because two programs use it: kubelift writes the file on a
// node before restarting an upgraded kubelet, and a kubelet built with
// kubelift's patch reads it in computePodActions. It depends only on the
// standard library.
//
// The rule: skip the hash comparison for a container only when the running
// kubelet is newer than the version recorded in the file and the container
// started before this kubelet did. A container started after (created by
// this kubelet) is compared as upstream does. Once every running
// container's recorded hash equals what the new kubelet computes, the file
// is removed and the kubelet behaves exactly as upstream.
package hashskip

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// SchemaVersion of the file written and read by this package.
const SchemaVersion = 1

// DefaultPath is where the kubelet looks, unless PathEnv names another file.
const DefaultPath = "/var/lib/kubelet/kubelift-hash-skip.json"

// PathEnv overrides DefaultPath (for kubelets with another --root-dir).
const PathEnv = "KUBELIFT_HASH_SKIP_FILE"

// File is the on-node cache.
type File struct {
	SchemaVersion int `json:"schemaVersion"`
	// OldKubeletVersion is the version the node ran before the upgrade.
	OldKubeletVersion string `json:"oldKubeletVersion"`
	// NewKubeletVersion is the version it was upgraded to (informational).
	NewKubeletVersion string `json:"newKubeletVersion,omitempty"`
	// UpgradedAt is when the file was written, just before the restart.
	UpgradedAt time.Time `json:"upgradedAt"`
}

// Path returns the file the kubelet reads: $KUBELIFT_HASH_SKIP_FILE or DefaultPath.
func Path() string {
	if p := os.Getenv(PathEnv); p != "" {
		return p
	}
	return DefaultPath
}

// Read loads the file. A missing file returns (nil, nil): no skipping.
func Read(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f File
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.SchemaVersion != SchemaVersion {
		return nil, fmt.Errorf("%s: schemaVersion %d, this reader knows %d", path, f.SchemaVersion, SchemaVersion)
	}
	if _, err := parseVersion(f.OldKubeletVersion); err != nil {
		return nil, fmt.Errorf("%s: oldKubeletVersion: %w", path, err)
	}
	return &f, nil
}

// Write stores f atomically (temporary file, sync, rename).
func Write(path string, f *File) error {
	if f.SchemaVersion == 0 {
		f.SchemaVersion = SchemaVersion
	}
	if _, err := parseVersion(f.OldKubeletVersion); err != nil {
		return fmt.Errorf("oldKubeletVersion: %w", err)
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Skip reports whether a kubelet of kubeletVersion, started at
// kubeletStart, should skip the hash comparison for a container started at
// containerStart. A nil File never skips.
func (f *File) Skip(kubeletVersion string, kubeletStart, containerStart time.Time) bool {
	if f == nil || containerStart.IsZero() || !containerStart.Before(kubeletStart) {
		return false
	}
	running, err := parseVersion(kubeletVersion)
	if err != nil {
		return false
	}
	old, err := parseVersion(f.OldKubeletVersion)
	if err != nil {
		return false
	}
	return compare(running, old) > 0
}

// Hashes are one running container's recorded hash and the hash the new
// kubelet computes for its spec.
type Hashes struct {
	Recorded, Computed uint64
}

// Converged reports whether the file can be removed: every running
// container's recorded hash equals what the new kubelet computes, so
// nothing depends on skipping any more.
func Converged(running []Hashes) bool {
	for _, h := range running {
		if h.Recorded != h.Computed {
			return false
		}
	}
	return true
}

// parseVersion reads "v1.31.4" (also "v1.31.4-rc.1+abc", pre-release and
// build parts ignored) into major, minor, patch.
func parseVersion(s string) ([3]int, error) {
	var v [3]int
	core := strings.TrimPrefix(s, "v")
	if i := strings.IndexAny(core, "-+"); i >= 0 {
		core = core[:i]
	}
	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return v, fmt.Errorf("version %q: want vMAJOR.MINOR.PATCH", s)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return v, fmt.Errorf("version %q: %q is not a number", s, p)
		}
		v[i] = n
	}
	return v, nil
}

func compare(a, b [3]int) int {
	for i := range a {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}
