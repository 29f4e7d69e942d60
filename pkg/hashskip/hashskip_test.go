package hashskip

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSkipRule(t *testing.T) {
	kubeletStart := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	before, after := kubeletStart.Add(-time.Hour), kubeletStart.Add(time.Second)
	f := &File{OldKubeletVersion: "v1.30.14"}
	for _, tc := range []struct {
		name           string
		file           *File
		kubelet        string
		containerStart time.Time
		want           bool
	}{
		{"upgraded kubelet, old container", f, "v1.31.4", before, true},
		{"upgraded kubelet, container it created", f, "v1.31.4", after, false},
		{"started at the same instant", f, "v1.31.4", kubeletStart, false},
		{"same version as recorded", f, "v1.30.14", before, false},
		{"older than recorded (rolled back)", f, "v1.30.2", before, false},
		{"patch upgrade within the minor", f, "v1.30.15", before, true},
		{"version with build metadata", f, "v1.31.4+kubelift", before, true},
		{"no file", nil, "v1.31.4", before, false},
		{"unparsable kubelet version", f, "devel", before, false},
		{"unknown container start", f, "v1.31.4", time.Time{}, false},
	} {
		if got := tc.file.Skip(tc.kubelet, kubeletStart, tc.containerStart); got != tc.want {
			t.Errorf("%s: Skip = %v, want %v", tc.name, got, tc.want)
		}
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
	if err := Write(p, &File{OldKubeletVersion: "v1.30.14", NewKubeletVersion: "v1.31.4", UpgradedAt: at}); err != nil {
		t.Fatal(err)
	}
	f, err := Read(p)
	if err != nil || f.OldKubeletVersion != "v1.30.14" || !f.UpgradedAt.Equal(at) || f.SchemaVersion != SchemaVersion {
		t.Fatalf("read back %+v, %v", f, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files in dir after an atomic write", len(entries))
	}
	if err := Write(p, &File{OldKubeletVersion: "1.30"}); err == nil {
		t.Error("wrote a bad version")
	}
	for name, body := range map[string]string{
		"garbage":    "{",
		"schema":     `{"schemaVersion": 9, "oldKubeletVersion": "v1.30.14"}`,
		"no version": `{"schemaVersion": 1}`,
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
