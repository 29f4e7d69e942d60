package internet

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestSeedManyTagsOfOneRepository seeds eight tags of one repository, which
// share their base layers, into a fresh docker-registry, five times. Pushed
// at once, as Seed pushed them until a sandbox run's seeding failed so, a
// manifest put while another push rewrote the repository's link to the
// shared blob was refused (DIGEST_INVALID, MANIFEST_BLOB_UNKNOWN): here 5
// rounds of 15 failed.
func TestSeedManyTagsOfOneRepository(t *testing.T) {
	var repos []string
	for i := range 8 {
		repos = append(repos, fmt.Sprintf("kube-apiserver:v1.%d.0", 30+i))
	}
	for round := range 5 {
		reg, err := StartRegistry(context.Background(), filepath.Join(t.TempDir(), "registry"), RegistryOptions{})
		if err != nil {
			t.Fatal(err)
		}
		digests, err := Seed(context.Background(), reg.Host, repos, ImageShape{Arches: []string{"amd64", "arm64"}, BaseBytes: 8 << 20, UniqueBytes: 2 << 20})
		if err != nil {
			reg.Stop()
			t.Fatalf("round %d: %v", round, err)
		}
		for _, r := range repos {
			ref, err := name.ParseReference(reg.Host+"/"+r, name.Insecure)
			if err != nil {
				t.Fatal(err)
			}
			d, err := remote.Head(ref)
			if err != nil {
				reg.Stop()
				t.Fatalf("round %d: %s: %v", round, r, err)
			}
			if d.Digest.String() != digests[r] {
				t.Errorf("round %d: %s is %s, Seed said %s", round, r, d.Digest, digests[r])
			}
		}
		reg.Stop()
	}
}
