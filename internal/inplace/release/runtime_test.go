package release

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// A node is moved to the bundle's containerd only from an older
// containerd, and gets runc with it where the bundle carries one, each
// with the signed manifest's sum; a
// bundle without containerd for the node's arch, another runtime, or one
// at or past the bundle's is left alone; a signed version that does not
// parse is refused, naming the file.
func TestRuntimeMoveFor(t *testing.T) {
	rel := func(files ...bundle.File) *Release {
		return &Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 4}, Manifest: &bundle.Manifest{Files: files}}
	}
	containerd := bundle.File{Name: FileContainerd, Version: "v2.3.7", Arch: "amd64", Path: "stack/linux/amd64/containerd", SHA256: "aaa"}
	runc := bundle.File{Name: FileRunc, Version: "v1.5.2", Arch: "amd64", Path: "stack/linux/amd64/runc", SHA256: "bbb"}
	kubelet := bundle.File{Name: "kubelet", Arch: "amd64", Path: "bin/linux/amd64/kubelet"}
	rt := func(s string) nodefacts.Runtime {
		r, bad := nodefacts.ParseRuntime("worker-1", s)
		if bad != nil {
			t.Fatal(bad)
		}
		return r
	}
	for _, tc := range []struct {
		name    string
		target  *Release
		runtime string
		arch    string
		files   []string // nil: no move
		major   bool
	}{
		{"1.7 to 2.3 with runc", rel(kubelet, containerd, runc), "containerd://1.7.35", "", []string{"containerd", "runc"}, true},
		{"2.1 to 2.3, no runc bundled", rel(kubelet, containerd), "containerd://2.1.4", "amd64", []string{"containerd"}, false},
		{"already there", rel(kubelet, containerd, runc), "containerd://2.3.7", "amd64", nil, false},
		{"past it", rel(kubelet, containerd, runc), "containerd://2.4.0", "amd64", nil, false},
		{"another runtime", rel(kubelet, containerd, runc), "cri-o://1.31.2", "amd64", nil, false},
		{"no containerd bundled", rel(kubelet), "containerd://1.7.35", "amd64", nil, false},
		{"none for the node's arch", rel(kubelet, containerd, runc), "containerd://1.7.35", "arm64", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := tc.target.RuntimeMoveFor(rt(tc.runtime), tc.arch)
			if err != nil {
				t.Fatal(err)
			}
			if tc.files == nil {
				if m != nil {
					t.Fatalf("a move %+v", m)
				}
				return
			}
			if m == nil || !slices.Equal(m.Files, tc.files) || m.Major != tc.major || m.To.String() != "v2.3.7" || m.From != rt(tc.runtime).Version {
				t.Fatalf("move %+v, want files %v, major %v, to v2.3.7", m, tc.files, tc.major)
			}
			runcSum := ""
			if slices.Contains(tc.files, FileRunc) {
				runcSum = "bbb"
			}
			if m.ArchiveSHA256 != "aaa" || m.RuncSHA256 != runcSum {
				t.Errorf("sums %q and %q, want the manifest's aaa and %q", m.ArchiveSHA256, m.RuncSHA256, runcSum)
			}
		})
	}
	bad := containerd
	bad.Version = "2.3"
	if _, err := rel(bad).RuntimeMoveFor(rt("containerd://1.7.35"), "amd64"); err == nil || !strings.Contains(err.Error(), "stack/linux/amd64/containerd") || !strings.Contains(err.Error(), `"2.3"`) {
		t.Errorf("a containerd whose version does not parse: %v", err)
	}
}

// With the node stack in the bundle, a node's CNI plugins and crictl move
// to the bundle's (each it carries for the node's arch, with the signed
// sum), whatever runtime the node runs; without it, they stay.
func TestToolsMoveFor(t *testing.T) {
	rel := func(files ...bundle.File) *Release {
		return &Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 4}, Manifest: &bundle.Manifest{Files: files}}
	}
	containerd := bundle.File{Name: FileContainerd, Version: "v2.3.7", Arch: "amd64", Path: "stack/linux/amd64/containerd", SHA256: "aaa"}
	cni := bundle.File{Name: FileCNIPlugins, Arch: "amd64", Path: "bin/linux/amd64/cni-plugins", SHA256: "ccc"}
	crictl := bundle.File{Name: FileCrictl, Arch: "amd64", Path: "bin/linux/amd64/crictl", SHA256: "ddd"}
	for _, tc := range []struct {
		name   string
		target *Release
		arch   string
		want   *ToolsMove
	}{
		{"both", rel(containerd, cni, crictl), "", &ToolsMove{Files: []string{FileCNIPlugins, FileCrictl}, CNISHA256: "ccc", CrictlSHA256: "ddd"}},
		{"crictl only", rel(containerd, crictl), "amd64", &ToolsMove{Files: []string{FileCrictl}, CrictlSHA256: "ddd"}},
		{"no node stack", rel(cni, crictl), "amd64", nil},
		{"no tools", rel(containerd), "amd64", nil},
		{"none for the node's arch", rel(containerd, cni, crictl), "arm64", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.target.ToolsMoveFor(tc.arch)
			if (got == nil) != (tc.want == nil) || got != nil && (!slices.Equal(got.Files, tc.want.Files) || got.CNISHA256 != tc.want.CNISHA256 || got.CrictlSHA256 != tc.want.CrictlSHA256) {
				t.Errorf("move %+v, want %+v", got, tc.want)
			}
		})
	}
}

// A node's files are its binaries, its runtime move's parts where the
// bundle makes one, and its tools' archives with the node stack.
func TestNodeFiles(t *testing.T) {
	m := &bundle.Manifest{Files: []bundle.File{
		{Name: FileContainerd, Version: "v2.3.7", Arch: "amd64", Path: "stack/linux/amd64/containerd"},
		{Name: "kubelet", Arch: "amd64", Path: "bin/linux/amd64/kubelet"},
		{Name: FileCrictl, Arch: "amd64", Path: "bin/linux/amd64/crictl"},
		{Name: FileCNIPlugins, Arch: "amd64", Path: "bin/linux/amd64/cni-plugins"},
	}}
	rel := &Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 4}, Manifest: m}
	tools := []string{FileCNIPlugins, FileCrictl}
	for _, tc := range []struct {
		runtime string
		want    []string
	}{
		{"containerd://1.7.35", append([]string{"kubelet", "kube-proxy", "kubectl", FileContainerd}, tools...)},
		{"containerd://2.3.7", append([]string{"kubelet", "kube-proxy", "kubectl"}, tools...)},
		{"", append([]string{"kubelet", "kube-proxy", "kubectl"}, tools...)},
	} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}}
		n.Status.NodeInfo.ContainerRuntimeVersion = tc.runtime
		rt, err := NodeRuntime(n)
		if err != nil {
			t.Fatal(err)
		}
		got, err := rel.NodeFiles(KindBinary, RoleWorker, rt, "amd64")
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.runtime, got, err, tc.want)
		}
	}
	// Without the node stack, the binaries alone.
	withoutStack := &Release{Version: rel.Version, Manifest: &bundle.Manifest{Files: m.Files[1:]}}
	if got, err := withoutStack.NodeFiles(KindBinary, RoleWorker, nodefacts.Runtime{}, "amd64"); err != nil || !slices.Equal(got, []string{"kubelet", "kube-proxy", "kubectl"}) {
		t.Errorf("without the node stack: %v, %v", got, err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}}
	n.Status.NodeInfo.ContainerRuntimeVersion = "containerd"
	if _, err := NodeRuntime(n); err == nil || !strings.Contains(err.Error(), "worker-1") || !strings.Contains(err.Error(), "containerRuntimeVersion") {
		t.Errorf("a runtime that does not parse: %v", err)
	}
}
