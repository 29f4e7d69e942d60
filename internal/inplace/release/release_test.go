package release

import (
	"strings"
	"testing"

	"github.com/kubelift/kubelift/internal/bundle"
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

// The agents' image is the one the signed manifest names, at its signed
// digest, pushed to the run's registry; a record that says otherwise is
// refused, and a bundle without one says how to make one that has it.
func TestAgentImage(t *testing.T) {
	const repo, domain = "kubelift.dev/kubelift-agent", "registry.local:5000"
	signed := "sha256:" + strings.Repeat("a", 64)
	ref := repo + ":sha256-aaaaaaaaaaaaaaaa"
	target := func(pushedTo, digest string) *Release {
		return &Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 4},
			Manifest: &bundle.Manifest{Images: []bundle.Image{{Ref: ref, Digest: signed}, {Ref: "registry.k8s.io/pause:3.10", Digest: "sha256:" + strings.Repeat("b", 64)}}},
			Record: &cluster.Available{Registry: domain, Images: []cluster.ImageRecord{
				{Ref: "registry.k8s.io/pause:3.10", Target: domain + "/library/pause:3.10", Digest: "sha256:" + strings.Repeat("b", 64)},
				{Ref: ref, Target: pushedTo, Digest: digest}}}}
	}
	got, err := target(domain+"/library/kubelift-agent:sha256-aaaaaaaaaaaaaaaa", signed).AgentImage(repo, domain)
	if err != nil || got != domain+"/library/kubelift-agent@"+signed {
		t.Fatalf("AgentImage: %q, %v", got, err)
	}
	for name, tc := range map[string]struct {
		t    *Release
		want string
	}{
		"another digest":   {target(domain+"/library/kubelift-agent:x", "sha256:"+strings.Repeat("c", 64)), "not the signed " + signed},
		"another registry": {target("evil.example/library/kubelift-agent:x", signed), "is on evil.example, not the registry this run uses"},
		"not pushed":       {&Release{Manifest: target("", "").Manifest, Record: &cluster.Available{}}, "was not pushed"},
		"no agent":         {&Release{Manifest: &bundle.Manifest{}, Record: &cluster.Available{}}, "bundle create --agent"},
	} {
		if _, err := tc.t.AgentImage(repo, domain); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}
