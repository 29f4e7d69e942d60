package kubeletcompat

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestRealKubeletVectors compares with hashes the real kubelet code
// computed (testdata/README.md says how they were made).
func TestRealKubeletVectors(t *testing.T) {
	data, err := os.ReadFile("testdata/containers.json")
	if err != nil {
		t.Fatal(err)
	}
	var containers []corev1.Container
	if err := json.Unmarshal(data, &containers); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("testdata/vectors-*.json")
	if len(files) < 2 {
		t.Fatalf("want vector files for at least two eras, found %v", files)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var vf struct {
			KubeletVersion string
			Vectors        []struct{ Name, Hash, HashWithoutResources string }
		}
		if err := json.Unmarshal(raw, &vf); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if len(vf.Vectors) != len(containers) {
			t.Fatalf("%s: %d vectors for %d containers: run make hash-vectors", f, len(vf.Vectors), len(containers))
		}
		h := hasher(t, vf.KubeletVersion)
		for i, v := range vf.Vectors {
			c := &containers[i]
			got, err := h.Hash(c)
			if err != nil || Label(got) != v.Hash {
				t.Errorf("%s %s: Hash = %s, %v; the kubelet computes %s", vf.KubeletVersion, v.Name, Label(got), err, v.Hash)
			}
			wr, ok, err := h.HashWithoutResources(c)
			if (v.HashWithoutResources != "") != ok || (ok && Label(wr) != v.HashWithoutResources) || err != nil {
				t.Errorf("%s %s: HashWithoutResources = %s (%v, %v); the kubelet computes %q", vf.KubeletVersion, v.Name, Label(wr), ok, err, v.HashWithoutResources)
			}
		}
	}
}
