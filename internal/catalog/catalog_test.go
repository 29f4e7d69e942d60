package catalog

import (
	"errors"
	"strings"
	"testing"
)

func TestDefaultCatalog(t *testing.T) {
	c, err := Default()
	if err != nil {
		t.Fatalf("built-in catalog: %v", err)
	}
	// Every minor from 1.28 to 1.37, and the two versions the sandbox uses.
	minors := map[int]bool{}
	for _, r := range c.Versions {
		minors[r.Parsed().Minor] = true
	}
	for m := 28; m <= 37; m++ {
		if !minors[m] {
			t.Errorf("no release of minor 1.%d", m)
		}
	}
	for _, v := range []string{"v1.30.14", "v1.31.4"} {
		if _, err := c.Lookup(v); err != nil {
			t.Errorf("Lookup(%s): %v", v, err)
		}
	}
	r, _ := c.Lookup("v1.31.4")
	if r.KubeletHashEra != EraNameImage {
		t.Errorf("v1.31.4 era = %s", r.KubeletHashEra)
	}
	old, _ := c.Lookup("v1.30.14")
	if old.KubeletHashEra != EraJSONWithoutResources {
		t.Errorf("v1.30.14 era = %s", old.KubeletHashEra)
	}
	want := []string{"registry.k8s.io/pause:3.10", "registry.k8s.io/etcd:3.5.15-0", "registry.k8s.io/coredns/coredns:v1.11.3", "registry.k8s.io/kube-apiserver:v1.31.4"}
	for _, w := range want {
		if !contains(r.Images, w) {
			t.Errorf("v1.31.4 images lack %s: %v", w, r.Images)
		}
	}
	if !contains(r.RemovedKubeletFlags, "--keep-terminated-pod-volumes") {
		t.Errorf("v1.31.4 removed flags: %v", r.RemovedKubeletFlags)
	}
	r37, err := c.Lookup("v1.37.2")
	if err != nil {
		t.Fatal(err)
	}
	want37 := RemovedAPI{Group: "networking.k8s.io", Version: "v1beta1", Resource: "servicecidrs"}
	found := false
	for _, a := range r37.Removed() {
		found = found || a == want37
	}
	if !found {
		t.Errorf("v1.37.2 removes %v, want %v among them", r37.Removed(), want37)
	}
}

func TestUpgradePaths(t *testing.T) {
	c, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	r, _ := c.Lookup("v1.31.4")
	for _, tc := range []struct {
		from    string
		upgrade bool
		down    bool
	}{
		{"v1.30.0", true, false},
		{"v1.30.14", true, false},
		{"v1.31.0", true, true},
		{"v1.31.3", true, true},
		{"v1.31.4", false, false},
		{"v1.31.5", false, false},
		{"v1.29.15", false, false},
		{"v1.32.0", false, false},
	} {
		v, _ := ParseVersion(tc.from)
		if got := r.CanUpgradeFrom(v); got != tc.upgrade {
			t.Errorf("v1.31.4 CanUpgradeFrom(%s) = %v", tc.from, got)
		}
		if got := r.CanDowngradeTo(v); got != tc.down {
			t.Errorf("v1.31.4 CanDowngradeTo(%s) = %v", tc.from, got)
		}
	}
}

const good = `schemaVersion: 1
arches: [amd64]
kubeletHashEras:
  - {era: json, from: v1.16.0}
  - {era: name-image, from: v1.31.0}
versions:
  - version: v1.31.4
    kubeletHashEra: name-image
    upgradeFrom: [v1.30]
    downgradeTo: []
    removedKubeletFlags: []
    removedAPIs: []
    images: [registry.k8s.io/pause:3.10]
    files:
      - name: kubelet
        url: https://dl.k8s.io/release/v1.31.4/bin/linux/{arch}/kubelet
`

func TestParseErrorsNameFileVersionField(t *testing.T) {
	for _, tc := range []struct {
		name, from, to, want string
	}{
		{"unknown field", "withdrawn", "withdrawnn", `unknown field "withdrawnn"`},
		{"schema", "schemaVersion: 1", "schemaVersion: 9", "schemaVersion: is 9"},
		{"bad version", "version: v1.31.4", "version: 1.31", `version 1.31: version: version "1.31"`},
		{"era", "kubeletHashEra: name-image", "kubeletHashEra: crc32", "version v1.31.4: kubeletHashEra"},
		{"era disagrees with table", "kubeletHashEra: name-image", "kubeletHashEra: json", `kubeletHashEras puts v1.31.4 in "name-image"`},
		{"era table order", "{era: name-image, from: v1.31.0}", "{era: name-image, from: v1.15.0}", "kubeletHashEras[1].from: v1.15.0: eras must be listed oldest first"},
		{"skip minor", "upgradeFrom: [v1.30]", "upgradeFrom: [v1.29]", "upgradeFrom[0]: \"v1.29\" skips a minor"},
		{"newer source", "upgradeFrom: [v1.30]", "upgradeFrom: [v1.31]", "upgradeFrom[0]: \"v1.31\" reaches v1.31.4"},
		{"minor downgrade", "downgradeTo: []", "downgradeTo: [v1.30.14]", "downgradeTo[0]: \"v1.30.14\": downgrades are to a lower patch of v1.31 only"},
		{"bad range", "upgradeFrom: [v1.30]", "upgradeFrom: [v1.30.5-v1.30.1]", "end is older than start"},
		{"flag", "removedKubeletFlags: []", "removedKubeletFlags: [cloud-config]", "removedKubeletFlags[0]"},
		{"api without version", "removedAPIs: []", "removedAPIs: [flowcontrol.apiserver.k8s.io]", `removedAPIs[0]: "flowcontrol.apiserver.k8s.io": want group/version`},
		{"api version", "removedAPIs: []", "removedAPIs: [networking.k8s.io/beta1]", `removedAPIs[0]: "networking.k8s.io/beta1": "beta1" is not an API version`},
		{"api resource", "removedAPIs: []", "removedAPIs: [networking.k8s.io/v1beta1/IPAddress]", `"IPAddress" is not a resource`},
		{"api group", "removedAPIs: []", "removedAPIs: [\"v1/pods\"]", `"v1" is not an API group`},
		{"runtime name", "removedAPIs: []", "removedAPIs: []\n    containerRuntimes: {Containerd: [v2.0.0+]}", `containerRuntimes.Containerd: "Containerd" is not a runtime name`},
		{"runtime list", "removedAPIs: []", "removedAPIs: []\n    containerRuntimes: {containerd: []}", "containerRuntimes.containerd: is empty"},
		{"runtime line", "removedAPIs: []", "removedAPIs: []\n    containerRuntimes: {containerd: [v2.0.0+, v1.7+]}", `containerRuntimes.containerd[1]: "v1.7+": want vMAJOR.MINOR.PATCH+`},
		{"image", "pause:3.10", "Pause:3.10", "images[0]"},
		{"url", "https://dl.k8s.io", "ftp://dl.k8s.io", "files[0].url"},
		{"sha", "url: https://dl.k8s.io/release/v1.31.4/bin/linux/{arch}/kubelet", "url: https://dl.k8s.io/release/v1.31.4/bin/linux/{arch}/kubelet\n        sha256: {amd64: abc}", "files[0].sha256.amd64"},
		{"sha arch", "url: https://dl.k8s.io/release/v1.31.4/bin/linux/{arch}/kubelet", "url: https://dl.k8s.io/release/v1.31.4/bin/linux/{arch}/kubelet\n        sha256: {s390x: abc}", `arch "s390x" is not in the catalog's arches`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := strings.Replace(good, tc.from, tc.to, 1)
			if data == good && tc.name != "unknown field" {
				t.Fatalf("replacement %q not applied", tc.from)
			}
			if tc.name == "unknown field" {
				data = good + "    withdrawnn: true\n"
			}
			_, err := Parse("my.yaml", []byte(data))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.HasPrefix(err.Error(), "my.yaml") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q: want file name and %q", err, tc.want)
			}
		})
	}
	if _, err := Parse("my.yaml", []byte(good)); err != nil {
		t.Fatalf("good catalog: %v", err)
	}
}

func TestHashEraFor(t *testing.T) {
	c, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]string{"v1.6.0": EraSpew, "v1.15.12": EraSpew, "v1.16.0": EraJSON, "v1.26.15": EraJSON,
		"v1.27.0": EraJSONWithoutResources, "v1.30.14": EraJSONWithoutResources, "v1.31.0": EraNameImage, "v1.40.1": EraNameImage} {
		pv, _ := ParseVersion(v)
		if got, err := c.HashEraFor(pv); err != nil || got != want {
			t.Errorf("HashEraFor(%s) = %q, %v; want %q", v, got, err, want)
		}
	}
	pv, _ := ParseVersion("v1.5.8")
	if _, err := c.HashEraFor(pv); !errors.Is(err, ErrNoHashEra) {
		t.Errorf("v1.5.8: %v", err)
	}
}

func TestLookupUnknown(t *testing.T) {
	c, _ := Parse("my.yaml", []byte(good))
	_, err := c.Lookup("v1.99.0")
	if !errors.Is(err, ErrUnknownVersion) || !strings.Contains(err.Error(), "v1.31.4") {
		t.Fatalf("err = %v", err)
	}
}
