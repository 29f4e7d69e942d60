package upstream

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubelift/kubelift/internal/catalog"
)

// TestCatalogMatchesTheSource holds every release of the built-in catalog
// to k8s.io/kubernetes at its tag (from the module proxy, as the builds
// take it): the pause, etcd and CoreDNS images are the ones that
// release's kubeadm pulls (cmd/kubeadm/app/constants), the CNI plugins
// the version it was built with (build/dependencies.yaml). The entries
// before v1.33 were written by hand, and one said etcd 3.5.15-0 for
// v1.31.14, whose kubeadm pulls 3.5.24-0: an air-gapped kubeadm upgrade
// to it found no etcd image, and plan, which reads the catalog, saw
// nothing wrong.
func TestCatalogMatchesTheSource(t *testing.T) {
	cat, err := catalog.Default()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	for _, rel := range cat.Versions {
		dir := moduleSource(ctx, t, "k8s.io/kubernetes@"+rel.Version)
		consts := readFile(t, filepath.Join(dir, "cmd", "kubeadm", "app", "constants", "constants.go"))
		for _, c := range []struct{ constant, repo string }{
			{"PauseVersion", "registry.k8s.io/pause"},
			{"DefaultEtcdVersion", "registry.k8s.io/etcd"},
			{"CoreDNSVersion", "registry.k8s.io/coredns/coredns"},
		} {
			tag := goStringConst(t, rel.Version, consts, c.constant)
			if want := c.repo + ":" + tag; !slices.Contains(rel.Images, want) {
				t.Errorf("catalog %s: images %v lack %s, which its kubeadm pulls (%s = %q in cmd/kubeadm/app/constants)", rel.Version, rel.Images, want, c.constant, tag)
			}
		}
		cni := dependencyVersion(t, rel.Version, readFile(t, filepath.Join(dir, "build", "dependencies.yaml")), "cni")
		var url string
		for _, f := range rel.Files {
			if f.Name == "cni-plugins" {
				url = f.URL
			}
		}
		if !strings.Contains(url, "/v"+cni+"/") {
			t.Errorf("catalog %s: cni-plugins %q is not v%s, which build/dependencies.yaml names", rel.Version, url, cni)
		}
	}
}

// moduleSource is the directory of MODULE@VERSION in the Go module cache,
// downloaded from the module proxy when it is not there.
func moduleSource(ctx context.Context, t *testing.T, module string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module)
	cmd.Dir = t.TempDir() // outside kubelift's module: its go.mod and go.sum stay as they are
	out, err := cmd.Output()
	var m struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &m); err != nil || jerr != nil || m.Dir == "" {
		t.Fatalf("go mod download %s: %v %v %s", module, err, jerr, m.Error)
	}
	return m.Dir
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// goStringConst is the value of `NAME = "VALUE"` in Go source.
func goStringConst(t *testing.T, version, src, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*` + name + `\s*=\s*"([^"]+)"`).FindStringSubmatch(src)
	if m == nil {
		t.Fatalf("%s: no %s = \"...\" in cmd/kubeadm/app/constants/constants.go", version, name)
	}
	return m[1]
}

// dependencyVersion is the version build/dependencies.yaml gives NAME
// (`- name: "NAME"` followed by `version: V`).
func dependencyVersion(t *testing.T, version, src, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*- name: "` + regexp.QuoteMeta(name) + `"\s*\n\s*version: ([^\s]+)`).FindStringSubmatch(src)
	if m == nil {
		t.Fatalf("%s: no %q in build/dependencies.yaml", version, name)
	}
	return m[1]
}
