package catalog

import (
	"strings"
	"testing"
)

const stackGood = `schemaVersion: 1
arches: [amd64]
kubeletHashEras:
  - {era: name-image, from: v1.31.0}
versions:
  - version: v1.31.4
    kubeletHashEra: name-image
    upgradeFrom: [v1.30]
    downgradeTo: []
    removedKubeletFlags: []
    removedAPIs: []
    containerRuntimes:
      containerd: [v2.1.0+, v1.7.20+]
    images: [registry.k8s.io/pause:3.10, registry.k8s.io/etcd:3.5.15-0]
    files:
      - name: kubelet
        url: https://dl.k8s.io/release/v1.31.4/bin/linux/{arch}/kubelet
    nodeStack:
      - name: containerd
        version: v2.3.7
        url: https://github.com/containerd/containerd/releases/download/v2.3.7/containerd-2.3.7-linux-{arch}.tar.gz
      - name: runc
        version: v1.5.2
        url: https://github.com/opencontainers/runc/releases/download/v1.5.2/runc.{arch}
`

func TestNodeStackParsed(t *testing.T) {
	c, err := Parse("stack.yaml", []byte(stackGood))
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Lookup("v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	p, ok := r.StackPart(StackContainerd)
	if !ok || p.Parsed() != (Version{2, 3, 7}) || p.File().URLFor("arm64") != "https://github.com/containerd/containerd/releases/download/v2.3.7/containerd-2.3.7-linux-arm64.tar.gz" {
		t.Errorf("containerd part %+v (listed %v)", p, ok)
	}
	if _, ok := r.StackPart(StackEtcd); ok {
		t.Error("etcd found in a node stack that lists none")
	}
}

func TestNodeStackErrorsNameVersionField(t *testing.T) {
	for _, tc := range []struct{ name, from, to, want string }{
		{"unknown part", "name: runc", "name: crun", `nodeStack[1].name: "crun": want one of containerd, runc, etcd`},
		{"twice", "name: runc", "name: containerd", `nodeStack[1].name: "containerd" listed twice`},
		{"clashes with a file", "{arch}/kubelet\n", "{arch}/kubelet\n      - name: runc\n        url: https://example.com/runc\n", `nodeStack[1].name: "runc" is also one of the release's files`},
		{"version", "version: v1.5.2", "version: 1.5.2", `nodeStack[1].version: "1.5.2": want vMAJOR.MINOR.PATCH`},
		{"pre-release", "version: v1.5.2", "version: v1.5.2-rc.1", `nodeStack[1].version: "v1.5.2-rc.1"`},
		{"url", "url: https://github.com/opencontainers", "url: ftp://github.com/opencontainers", "nodeStack[1].url"},
		{"url names another version", "version: v1.5.2", "version: v1.5.3", `nodeStack[1].url: "https://github.com/opencontainers/runc/releases/download/v1.5.2/runc.{arch}" does not name version v1.5.3`},
		{"unsupported containerd", "version: v2.3.7\n        url: https://github.com/containerd/containerd/releases/download/v2.3.7/containerd-2.3.7", "version: v1.7.1\n        url: https://github.com/containerd/containerd/releases/download/v1.7.1/containerd-1.7.1", `version v1.31.4: nodeStack[0].version: containerd v1.7.1 is not one this release supports (containerRuntimes.containerd: v2.1.0+, v1.7.20+)`},
		{"runc without containerd", "      - name: containerd\n        version: v2.3.7\n        url: https://github.com/containerd/containerd/releases/download/v2.3.7/containerd-2.3.7-linux-{arch}.tar.gz\n", "", "nodeStack: containerd and runc go together"},
		{"etcd not the image's", "runc.{arch}\n", "runc.{arch}\n      - name: etcd\n        version: v3.5.16\n        url: https://github.com/etcd-io/etcd/releases/download/v3.5.16/etcd-v3.5.16-linux-{arch}.tar.gz\n", `nodeStack[2].version: etcd v3.5.16, but the release's etcd image is 3.5.15-0`},
		{"sha", "runc.{arch}", "runc.{arch}\n        sha256: {amd64: abc}", "nodeStack[1].sha256.amd64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := strings.Replace(stackGood, tc.from, tc.to, 1)
			if data == stackGood {
				t.Fatalf("replacement %q not applied", tc.from)
			}
			_, err := Parse("stack.yaml", []byte(data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "stack.yaml") {
				t.Errorf("error %v does not name the file", err)
			}
		})
	}
}
