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
// The rule (dual era): a running container whose recorded hash differs
// from what this kubelet computes for its spec keeps running exactly when
// the recorded hash equals the hash of its current spec in the era of the
// kubelet that ran before (the file's OldHashEra): the kubelet that
// started it would see no change either. A container whose spec changed
// since (an image set in place on a running pod) matches neither and is
// restarted, as upstream does; so is one this kubelet started and whose
// spec changed. Nothing depends on when the kubelet or the container
// started, so a kubelet restart changes no outcome. Once every running
// container's recorded hash equals what the new kubelet computes, the
// file is removed and the kubelet behaves exactly as upstream.
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

// SchemaVersion of the file written and read by this package (2: the old
// kubelet's hash era, for the dual-era rule).
const SchemaVersion = 2

// The kubelet's container hash eras (HashContainer), named as kubelift's
// catalog names them.
const (
	// EraJSON (1.16 to 1.26) and EraJSONWithoutResources (1.27 to 1.30)
	// hash the container's JSON (the latter also writes a second hash
	// without resources; the one compared first is the whole JSON's).
	EraJSON                 = "json"
	EraJSONWithoutResources = "json-without-resources"
	// EraNameImage (1.31 on) hashes the name and the image only.
	EraNameImage = "name-image"
)

var knownEras = map[string]bool{EraJSON: true, EraJSONWithoutResources: true, EraNameImage: true}

// DefaultPath is where the kubelet looks, unless PathEnv names another file.
const DefaultPath = "/var/lib/kubelet/kubelift-hash-skip.json"

// PathEnv overrides DefaultPath (for kubelets with another --root-dir).
const PathEnv = "KUBELIFT_HASH_SKIP_FILE"

// File is the on-node cache.
type File struct {
	SchemaVersion int `json:"schemaVersion"`
	// OldKubeletVersion is the version the node ran before the upgrade.
	OldKubeletVersion string `json:"oldKubeletVersion"`
	// OldHashEra is that kubelet's hash era: the one the hashes of the
	// containers it started are in.
	OldHashEra string `json:"oldHashEra"`
	// NewKubeletVersion is the version it was upgraded to (informational).
	NewKubeletVersion string `json:"newKubeletVersion,omitempty"`
	// UpgradedAt is when the file was written, just before the restart
	// (informational: the rule does not depend on time).
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
	if err := f.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &f, nil
}

// Write stores f atomically (temporary file, sync, rename).
func Write(path string, f *File) error {
	if f.SchemaVersion == 0 {
		f.SchemaVersion = SchemaVersion
	}
	if err := f.check(); err != nil {
		return err
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

// check refuses a file whose old version or era is not one.
func (f *File) check() error {
	if _, err := parseVersion(f.OldKubeletVersion); err != nil {
		return fmt.Errorf("oldKubeletVersion: %w", err)
	}
	if !knownEras[f.OldHashEra] {
		return fmt.Errorf("oldHashEra %q: want %s, %s or %s", f.OldHashEra, EraJSON, EraJSONWithoutResources, EraNameImage)
	}
	return nil
}

// Keep reports whether a running container whose recorded hash differs
// from what this kubelet computes for its spec keeps running: exactly when
// recorded equals oldEraHash(f.OldHashEra), the hash of the container's
// current spec in the old kubelet's era (ok false: the kubelet cannot
// compute that era's hash, and keeps nothing). A nil File keeps nothing.
func (f *File) Keep(recorded uint64, oldEraHash func(era string) (hash uint64, ok bool)) bool {
	if f == nil || oldEraHash == nil {
		return false
	}
	h, ok := oldEraHash(f.OldHashEra)
	return ok && h == recorded
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
