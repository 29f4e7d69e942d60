package nodescript

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// toolsNode is a node's CNI plugins and crictl laid out in a temporary
// directory (a vendor's plugin among the reference ones), with the
// bundle's CNI and crictl archives staged, and a systemctl that records
// what it was asked (the tools restart nothing).
type toolsNode struct {
	*runtimeNode
	cniDir, crictl           string
	cniArchive, cniSum       string
	crictlArchive, crictlSum string
	oldPlugins               map[string]string
	bundlePlugins            map[string]string
	oldCrictl, bundleCrictl  string
}

// tgz is a gzipped tar of files (name to content), programs with mode
// 0755 and the rest 0644, in the order given.
func tgz(t *testing.T, files [][3]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range files {
		mode := int64(0o644)
		if f[2] == "x" {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Name: f[0], Mode: mode, Size: int64(len(f[1])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func newToolsNode(t *testing.T) *toolsNode {
	t.Helper()
	n := &toolsNode{runtimeNode: newRuntimeNode(t)}
	n.cniDir = filepath.Join(n.root, "opt/cni/bin")
	n.crictl = filepath.Join(n.bin, "crictl")
	n.oldPlugins = map[string]string{
		"bridge":   "#!/bin/sh\necho bridge v1.1.1\n",
		"loopback": "#!/bin/sh\necho loopback\n",
		"calico":   "#!/bin/sh\necho a vendor's plugin\n",
	}
	n.bundlePlugins = map[string]string{
		"bridge":   "#!/bin/sh\necho bridge v1.5.1\n",
		"loopback": n.oldPlugins["loopback"],
		"portmap":  "#!/bin/sh\necho portmap v1.5.1\n",
	}
	n.oldCrictl, n.bundleCrictl = "#!/bin/sh\necho crictl v1.30.0\n", "#!/bin/sh\necho crictl v1.31.0\n"
	for name, content := range n.oldPlugins {
		n.write(filepath.Join(n.cniDir, name), content, 0o755)
	}
	n.write(n.crictl, n.oldCrictl, 0o755)
	// As the projects ship them: the CNI plugins at the archive's top
	// with a LICENSE and README.md beside them; crictl alone.
	cni := tgz(t, [][3]string{
		{"./LICENSE", "Apache License\n", ""},
		{"./README.md", "# plugins\n", ""},
		{"./bridge", n.bundlePlugins["bridge"], "x"},
		{"./loopback", n.bundlePlugins["loopback"], "x"},
		{"./portmap", n.bundlePlugins["portmap"], "x"},
	})
	crictl := tgz(t, [][3]string{{"crictl", n.bundleCrictl, "x"}})
	n.cniArchive = filepath.Join(n.root, "var/lib/kubelift/staged/v1.31.4/cni-plugins")
	n.crictlArchive = filepath.Join(n.root, "var/lib/kubelift/staged/v1.31.4/crictl")
	n.write(n.cniArchive, string(cni), 0o644)
	n.write(n.crictlArchive, string(crictl), 0o644)
	n.cniSum, n.crictlSum = sha256hex(cni), sha256hex(crictl)
	return n
}

func (n *toolsNode) swapTools(cniSum, crictlArchive string) (string, int) {
	crictlSum := n.crictlSum
	if crictlArchive == "-" {
		crictlSum = "-"
	}
	return n.run(ToolsSwap.Command(n.backup, n.cniArchive, cniSum, n.cniDir, crictlArchive, crictlSum, n.crictl))
}

func (n *toolsNode) restoreTools() (string, int) {
	return n.run(ToolsRestore.Command(n.backup))
}

// has checks dir holds exactly want (name to content) and nothing of
// kubelift's.
func (n *toolsNode) has(when, dir string, want map[string]string) {
	n.t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		n.t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range entries {
		got[e.Name()] = n.read(filepath.Join(dir, e.Name()))
	}
	for name, content := range want {
		if got[name] != content {
			n.t.Errorf("%s: %s/%s is %q, want %q", when, dir, name, got[name], content)
		}
		delete(got, name)
	}
	for name := range got {
		n.t.Errorf("%s: %s/%s is there, and should not be", when, dir, name)
	}
}

func merged(maps ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range maps {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// tools-swap puts the bundle's CNI plugins and crictl where they
// differ (a vendor's plugin and the archive's LICENSE and README.md
// left as they are), backs up what it replaces, restarts nothing; run
// again (a resumed run) it says the tools are the same and keeps the
// first backup; tools-restore puts every file back byte for byte and
// removes the plugin the bundle added.
func TestToolsSwapAndRestore(t *testing.T) {
	n := newToolsNode(t)
	out, code := n.swapTools(n.cniSum, n.crictlArchive)
	if code != 0 {
		t.Fatalf("tools-swap: exit %d: %s", code, out)
	}
	if !strings.Contains(out, "### moved 3") {
		t.Errorf("tools-swap said %q, want 3 programs moved (bridge, portmap, crictl)", out)
	}
	moved := func(when string) {
		t.Helper()
		n.has(when, n.cniDir, merged(n.bundlePlugins, map[string]string{"calico": n.oldPlugins["calico"]}))
		if got := n.read(n.crictl); got != n.bundleCrictl {
			t.Errorf("%s: crictl is %q", when, got)
		}
		n.noLeftovers(when)
	}
	moved("after tools-swap")
	// What it replaces, not what is the same (loopback), and where.
	if got := n.read(filepath.Join(n.backup, "tools-files")); got != "cni/bridge\ncrictl\n" {
		t.Errorf("backed up %q", got)
	}
	if got, want := n.read(filepath.Join(n.backup, "tools-paths")), "cni "+n.cniDir+"\ncrictl "+n.crictl+"\n"; got != want {
		t.Errorf("tools-paths %q, want %q", got, want)
	}
	if got := n.read(filepath.Join(n.backup, "tools-added")); got != "cni/portmap\n" {
		t.Errorf("listed as added %q", got)
	}
	if _, err := os.Stat(n.systemctlLog); err == nil {
		t.Errorf("tools-swap asked systemctl %q", n.read(n.systemctlLog))
	}

	out, code = n.swapTools(n.cniSum, n.crictlArchive)
	if code != 0 || !strings.Contains(out, "### same") {
		t.Fatalf("tools-swap again: exit %d: %q, want the tools the same", code, out)
	}
	moved("after tools-swap ran twice")
	if got := n.read(filepath.Join(n.backup, "cni/bridge")); got != n.oldPlugins["bridge"] {
		t.Errorf("the second run took the new bridge for the old: %q", got)
	}

	if out, code := n.restoreTools(); code != 0 {
		t.Fatalf("tools-restore: exit %d: %s", code, out)
	}
	n.has("after tools-restore", n.cniDir, n.oldPlugins)
	if got := n.read(n.crictl); got != n.oldCrictl {
		t.Errorf("after tools-restore: crictl is %q", got)
	}
	n.noLeftovers("after tools-restore")
	if _, err := os.Stat(n.systemctlLog); err == nil {
		t.Errorf("tools-restore asked systemctl %q", n.read(n.systemctlLog))
	}
}

// A node whose tools are the bundle's already changes nothing and takes
// no backup; a staged archive that is not the one signed changes
// nothing (exit 65); "-" leaves crictl as it is; restore without a
// backup puts nothing back.
func TestToolsSwapRefusesAndKeeps(t *testing.T) {
	t.Run("same", func(t *testing.T) {
		n := newToolsNode(t)
		for name, content := range n.bundlePlugins {
			if err := os.WriteFile(filepath.Join(n.cniDir, name), []byte(content), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(n.crictl, []byte(n.bundleCrictl), 0o755); err != nil {
			t.Fatal(err)
		}
		out, code := n.swapTools(n.cniSum, n.crictlArchive)
		if code != 0 || !strings.Contains(out, "### same") {
			t.Fatalf("tools-swap: exit %d: %q, want the tools the same", code, out)
		}
		if _, err := os.Stat(filepath.Join(n.backup, "tools-files")); err == nil {
			t.Error("a backup was taken of tools that did not change")
		}
		n.noLeftovers("after tools-swap")
	})
	t.Run("forged", func(t *testing.T) {
		n := newToolsNode(t)
		out, code := n.swapTools(sha256hex([]byte("another archive")), n.crictlArchive)
		if code != ExitDataErr || !strings.Contains(out, "is not the staged archive the bundle signed") {
			t.Fatalf("tools-swap of a forged archive: exit %d: %q, want %d", code, out, ExitDataErr)
		}
		n.has("after a refused swap", n.cniDir, n.oldPlugins)
		if got := n.read(n.crictl); got != n.oldCrictl {
			t.Errorf("after a refused swap: crictl is %q", got)
		}
		if out, code := n.restoreTools(); code != 0 || !strings.Contains(out, "nothing to restore") {
			t.Errorf("tools-restore without a backup: exit %d: %q", code, out)
		}
		n.has("after restore without a backup", n.cniDir, n.oldPlugins)
	})
	t.Run("no crictl", func(t *testing.T) {
		n := newToolsNode(t)
		out, code := n.swapTools(n.cniSum, "-")
		if code != 0 || !strings.Contains(out, "### moved 2") {
			t.Fatalf("tools-swap without crictl: exit %d: %q", code, out)
		}
		if got := n.read(n.crictl); got != n.oldCrictl {
			t.Errorf("crictl changed without an archive: %q", got)
		}
		if got := n.read(filepath.Join(n.backup, "tools-files")); got != "cni/bridge\n" {
			t.Errorf("backed up %q", got)
		}
	})
	// A second archive (the same upgrade's, after a rollback, at another
	// patch) that replaces a program the first did not: backed up then,
	// the first backup of the rest kept, and restore puts back what the
	// node had before the first.
	t.Run("a second archive", func(t *testing.T) {
		n := newToolsNode(t)
		if out, code := n.swapTools(n.cniSum, "-"); code != 0 {
			t.Fatalf("tools-swap: exit %d: %q", code, out)
		}
		second := tgz(t, [][3]string{
			{"./bridge", "#!/bin/sh\necho bridge v1.5.2\n", "x"},
			{"./loopback", "#!/bin/sh\necho loopback v1.5.2\n", "x"},
		})
		n.write(n.cniArchive, string(second), 0o644)
		if out, code := n.swapTools(sha256hex(second), "-"); code != 0 || !strings.Contains(out, "### moved 2") {
			t.Fatalf("tools-swap of a second archive: exit %d: %q", code, out)
		}
		if got := n.read(filepath.Join(n.backup, "tools-files")); got != "cni/bridge\ncni/loopback\n" {
			t.Errorf("backed up %q", got)
		}
		if got := n.read(filepath.Join(n.backup, "cni/bridge")); got != n.oldPlugins["bridge"] {
			t.Errorf("the second archive's run took the first's bridge for the old: %q", got)
		}
		if out, code := n.restoreTools(); code != 0 {
			t.Fatalf("tools-restore: exit %d: %s", code, out)
		}
		n.has("after tools-restore", n.cniDir, n.oldPlugins)
	})
	// A backup that does not say where the tools were is refused, and
	// nothing is put back.
	t.Run("no paths", func(t *testing.T) {
		n := newToolsNode(t)
		if out, code := n.swapTools(n.cniSum, n.crictlArchive); code != 0 {
			t.Fatalf("tools-swap: exit %d: %q", code, out)
		}
		if err := os.Remove(filepath.Join(n.backup, "tools-paths")); err != nil {
			t.Fatal(err)
		}
		if out, code := n.restoreTools(); code != ExitDataErr || !strings.Contains(out, "names no CNI directory") {
			t.Errorf("tools-restore without tools-paths: exit %d: %q", code, out)
		}
		if got := n.read(n.crictl); got != n.bundleCrictl {
			t.Errorf("crictl put back without tools-paths: %q", got)
		}
	})
}
