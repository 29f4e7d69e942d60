package driver

import (
	"strings"
	"testing"
)

// A snapshot's name becomes a tag a registry takes: other bytes are '-',
// it keeps its last 128, and starts with neither '.' nor '-'.
func TestSnapshotTag(t *testing.T) {
	for in, want := range map[string]string{
		"cp-1-etcd-snapshot-20261202T040821Z.db": "cp-1-etcd-snapshot-20261202T040821Z.db",
		"cp 1:etcd@snap.db":                      "cp-1-etcd-snap.db",
		".hidden":                                "_hidden",
		"-x":                                     "_x",
		strings.Repeat("a", 200) + ".db":         strings.Repeat("a", 125) + ".db",
	} {
		if got := snapshotTag(in); got != want {
			t.Errorf("snapshotTag(%q) = %q, want %q", in, got, want)
		}
	}
}
