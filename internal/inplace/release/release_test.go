package release

import (
	"strings"
	"testing"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
)

// The record is not signed: an artifact it names on another host than the
// run's registry (where nodes and this machine would send the registry's
// credentials), or one that does not parse, is refused, naming the file.
func TestCheckArtifacts(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	target := func(artifact string) *Release {
		return &Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 4}, Record: &cluster.Available{Registry: "registry.local:5000",
			Files: []cluster.BinaryRecord{{Path: "bin/linux/amd64/kubelet", Artifact: artifact}}}}
	}
	if err := target("registry.local:5000/kubelift/files/kubelet@sha256:" + sum).CheckArtifacts("registry.local:5000"); err != nil {
		t.Fatalf("an artifact in the run's registry: %v", err)
	}
	if err := target("").CheckArtifacts("registry.local:5000"); err != nil {
		t.Fatalf("no artifact (--skip-binaries): %v", err)
	}
	for artifact, want := range map[string]string{
		"evil.example/kubelift/files/kubelet@sha256:" + sum: "is on evil.example, not the registry this run uses (registry.local:5000)",
		"registry.local:5000/kubelift/files/kubelet:v1":     `artifact "registry.local:5000/kubelift/files/kubelet:v1"`,
		"registry.local:5000/x@sha256:ZZ":                   "file bin/linux/amd64/kubelet",
	} {
		if err := target(artifact).CheckArtifacts("registry.local:5000"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("artifact %s: %v, want %q", artifact, err, want)
		}
	}
}
