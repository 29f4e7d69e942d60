package hashskip

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The dual-era rule: kept exactly when the recorded hash is the old era's
// hash of the current spec.
func TestKeepRule(t *testing.T) {
	f := &File{OldKubeletVersion: "v1.30.14", OldHashEra: EraJSONWithoutResources}
	// oldEra is the kubelet's copy of the old eras' hashes of the spec it
	// holds now: 0x1111 in the JSON eras.
	oldEra := func(era string) (uint64, bool) {
		if era == EraJSON || era == EraJSONWithoutResources {
			return 0x1111, true
		}
		return 0, false
	}
	for _, tc := range []struct {
		name     string
		file     *File
		recorded uint64
		want     bool
	}{
		{"started by the old kubelet, spec unchanged", f, 0x1111, true},
		{"started by the old kubelet, spec changed since (image set in place)", f, 0x2222, false},
		{"no file", nil, 0x1111, false},
		{"an era this kubelet cannot hash", &File{OldKubeletVersion: "v1.31.4", OldHashEra: EraNameImage}, 0x1111, false},
	} {
		if got := tc.file.Keep(tc.recorded, oldEra); got != tc.want {
			t.Errorf("%s: Keep = %v, want %v", tc.name, got, tc.want)
		}
	}
	if f.Keep(0x1111, nil) {
		t.Error("kept without an old-era hash")
	}
}

func TestConverged(t *testing.T) {
	if !Converged(nil) || !Converged([]Hashes{{1, 1}, {2, 2}}) || Converged([]Hashes{{1, 1}, {0x3c42280f, 0x8e45cbd0}}) {
		t.Error("Converged")
	}
}

func TestFileRoundTripAndErrors(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "kubelift-hash-skip.json")
	if f, err := Read(p); f != nil || err != nil {
		t.Fatalf("missing file: %v %v", f, err)
	}
	at := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	if err := Write(p, &File{OldKubeletVersion: "v1.30.14", OldHashEra: EraJSONWithoutResources, NewKubeletVersion: "v1.31.4", UpgradedAt: at}); err != nil {
		t.Fatal(err)
	}
	f, err := Read(p)
	if err != nil || f.OldKubeletVersion != "v1.30.14" || f.OldHashEra != EraJSONWithoutResources || !f.UpgradedAt.Equal(at) || f.SchemaVersion != SchemaVersion {
		t.Fatalf("read back %+v, %v", f, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files in dir after an atomic write", len(entries))
	}
	if err := Write(p, &File{OldKubeletVersion: "1.30", OldHashEra: EraJSON}); err == nil {
		t.Error("wrote a bad version")
	}
	if err := Write(p, &File{OldKubeletVersion: "v1.30.14", OldHashEra: "spew"}); err == nil {
		t.Error("wrote an era the rule cannot use")
	}
	for name, body := range map[string]string{
		"garbage":    "{",
		"schema":     `{"schemaVersion": 9, "oldKubeletVersion": "v1.30.14", "oldHashEra": "json"}`,
		"schema 1":   `{"schemaVersion": 1, "oldKubeletVersion": "v1.30.14"}`,
		"no version": `{"schemaVersion": 2, "oldHashEra": "json"}`,
		"no era":     `{"schemaVersion": 2, "oldKubeletVersion": "v1.30.14"}`,
	} {
		os.WriteFile(p, []byte(body), 0o644)
		if _, err := Read(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v", name, err)
		}
	}
	t.Setenv(PathEnv, "/elsewhere/f.json")
	if Path() != "/elsewhere/f.json" {
		t.Error("PathEnv ignored")
	}
}
