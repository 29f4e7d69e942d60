//go:build ignore

// Command hashvectors prints the container hashes the real kubelet code
// computes, for kubeletcompat's tests. hack/kubelet-hash-vectors.sh builds it
// against k8s.io/kubernetes at a release tag (it is not part of kubelift's
// module) and runs it on internal/kubeletcompat/testdata/containers.json.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/version"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
)

type vector struct {
	Name                 string `json:"name"`
	Hash                 string `json:"hash"`
	HashWithoutResources string `json:"hashWithoutResources,omitempty"`
}

func main() {
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		panic(err)
	}
	var containers []v1.Container
	if err := json.Unmarshal(data, &containers); err != nil {
		panic(err)
	}
	out := struct {
		KubeletVersion string   `json:"kubeletVersion"`
		Vectors        []vector `json:"vectors"`
	}{KubeletVersion: version.Get().GitVersion}
	for i := range containers {
		c := &containers[i]
		v := vector{Name: c.Name, Hash: fmt.Sprintf("%x", kubecontainer.HashContainer(c))}
		// HashContainerWithoutResources exists from 1.27 to 1.30 only (the
		// script writes the shim that sets hashWithoutResources, or leaves
		// it nil).
		if hashWithoutResources != nil {
			v.HashWithoutResources = fmt.Sprintf("%x", hashWithoutResources(c))
		}
		out.Vectors = append(out.Vectors, v)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		panic(err)
	}
}
