package nodescript

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runtimeNode is a node's runtime laid out in a temporary directory:
// containerd v1.7's programs (shell scripts standing in for them), runc,
// a config in 1.x's schema holding a registry's credentials, a staged
// containerd v2 release archive and runc, and a systemctl that records
// what it was asked.
type runtimeNode struct {
	t                               *testing.T
	root, bin, runc, config, backup string
	archive, archiveSum, newRunc    string
	newRuncSum, systemctlLog, stubs string
	oldPrograms                     map[string]string
	oldConfig                       string
}

const oldRuntimeConfig = `version = 2
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "/etc/containerd/certs.d"
[plugins."io.containerd.grpc.v1.cri".registry.configs."registry.example:5000".auth]
  username = "kubelift"
  password = "secret"
`

// fakeContainerd is a containerd that says its version and, asked to
// migrate its config, prints version 3 followed by the config it was
// given (so the test sees which one it read).
func fakeContainerd(version string) string {
	return `#!/bin/sh
case "$*" in
  --version) echo "containerd github.com/containerd/containerd/v2 ` + version + ` 0123abc" ;;
  *"config migrate"*) echo "version = 3"; echo "# migrated by ` + version + ` from:"; cat "$2" ;;
  *) exit 2 ;;
esac
`
}

func newRuntimeNode(t *testing.T) *runtimeNode {
	t.Helper()
	root := t.TempDir()
	n := &runtimeNode{
		t: t, root: root,
		bin:          filepath.Join(root, "usr/local/bin"),
		runc:         filepath.Join(root, "usr/local/sbin/runc"),
		config:       filepath.Join(root, "etc/containerd/config.toml"),
		backup:       filepath.Join(root, "var/lib/kubelift/backup/v1.31.4"),
		stubs:        filepath.Join(root, "stubs"),
		systemctlLog: filepath.Join(root, "systemctl.log"),
		oldPrograms: map[string]string{
			"containerd":              fakeContainerd("v1.7.35"),
			"ctr":                     "#!/bin/sh\necho ctr 1.7\n",
			"containerd-shim-runc-v2": "#!/bin/sh\necho shim 1.7\n",
			"containerd-shim":         "#!/bin/sh\necho old shim\n",
		},
		oldConfig: oldRuntimeConfig,
	}
	for name, content := range n.oldPrograms {
		n.write(filepath.Join(n.bin, name), content, 0o755)
	}
	n.write(n.runc, "runc 1.1\n", 0o755)
	n.write(n.config, n.oldConfig, 0o600)
	n.write(filepath.Join(n.stubs, "systemctl"), "#!/bin/sh\necho \"$*\" >>"+quoteForTest(n.systemctlLog)+"\n", 0o755)

	// containerd v2's release archive, as its project ships it: bin/...
	archive := tgz(t, [][3]string{
		{"bin/containerd", fakeContainerd("v2.3.7"), "x"},
		{"bin/ctr", "#!/bin/sh\necho ctr 2.3\n", "x"},
		{"bin/containerd-shim-runc-v2", "#!/bin/sh\necho shim 2.3\n", "x"},
		{"bin/containerd-stress", "#!/bin/sh\necho stress 2.3\n", "x"},
	})
	n.archive = filepath.Join(root, "var/lib/kubelift/staged/v1.31.4/containerd")
	n.write(n.archive, string(archive), 0o644)
	n.archiveSum = sha256hex(archive)
	n.newRunc = filepath.Join(root, "var/lib/kubelift/staged/v1.31.4/runc")
	n.write(n.newRunc, "runc 1.5\n", 0o644)
	n.newRuncSum = sha256hex([]byte("runc 1.5\n"))
	return n
}

// write writes content to p with mode, making its directories.
func (n *runtimeNode) write(p, content string, mode os.FileMode) {
	n.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		n.t.Fatal(err)
	}
}

func (n *runtimeNode) run(cmd string) (string, int) {
	n.t.Helper()
	c := exec.Command("sh", "-c", cmd)
	c.Env = append(os.Environ(), "PATH="+n.stubs+":"+os.Getenv("PATH"))
	c.Dir = n.root
	out, err := c.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	n.t.Fatalf("%v: %s", err, out)
	return "", -1
}

func (n *runtimeNode) swap(archiveSum, from string) (string, int) {
	return n.run(RuntimeSwap.Command(n.backup, n.archive, archiveSum, n.newRunc, n.newRuncSum, n.runc, n.bin, n.config, "migrate", "containerd", from))
}

func (n *runtimeNode) restore() (string, int) {
	return n.run(RuntimeRestore.Command(n.backup, n.bin, n.runc, n.config, "containerd"))
}

func (n *runtimeNode) read(p string) string {
	n.t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		n.t.Fatal(err)
	}
	return string(b)
}

// onlyOld checks the node runs the old runtime, byte for byte, with no
// file of kubelift's left beside it.
func (n *runtimeNode) onlyOld(when string) {
	n.t.Helper()
	for name, content := range n.oldPrograms {
		if got := n.read(filepath.Join(n.bin, name)); got != content {
			n.t.Errorf("%s: %s is %q, not the old program", when, name, got)
		}
	}
	if got := n.read(n.runc); got != "runc 1.1\n" {
		n.t.Errorf("%s: runc is %q", when, got)
	}
	if got := n.read(n.config); got != n.oldConfig {
		n.t.Errorf("%s: the config is %q", when, got)
	}
	if _, err := os.Stat(filepath.Join(n.bin, "containerd-stress")); err == nil {
		n.t.Errorf("%s: containerd-stress, which only the new release has, is in %s", when, n.bin)
	}
	n.noLeftovers(when)
}

func (n *runtimeNode) noLeftovers(when string) {
	n.t.Helper()
	for _, dir := range []string{n.bin, filepath.Dir(n.runc), filepath.Dir(n.config)} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			n.t.Fatal(err)
		}
		for _, e := range entries {
			if strings.Contains(e.Name(), "kubelift") {
				n.t.Errorf("%s: %s left in %s", when, e.Name(), dir)
			}
		}
	}
}

// runtime-swap moves containerd's programs and runc, migrates the config
// with the new containerd from the user's own (its registry settings and
// credentials kept, its mode too), and restarts containerd; run again
// (a resumed run) it ends the same, the config migrated once from the
// backup; runtime-restore puts back every file byte for byte.
func TestRuntimeSwapAndRestore(t *testing.T) {
	n := newRuntimeNode(t)
	out, code := n.swap(n.archiveSum, "v1.7.35")
	if code != 0 {
		t.Fatalf("runtime-swap: exit %d: %s", code, out)
	}
	if !strings.Contains(out, "### restart ") {
		t.Errorf("runtime-swap did not time the restart: %q", out)
	}
	swapped := func(when string) {
		t.Helper()
		for name, want := range map[string]string{"ctr": "ctr 2.3", "containerd-shim-runc-v2": "shim 2.3", "containerd-stress": "stress 2.3", "containerd-shim": "old shim"} {
			if got := n.read(filepath.Join(n.bin, name)); !strings.Contains(got, want) {
				t.Errorf("%s: %s is %q, want %q", when, name, got, want)
			}
		}
		if got := n.read(filepath.Join(n.bin, "containerd")); got != fakeContainerd("v2.3.7") {
			t.Errorf("%s: containerd is not the new one: %q", when, got)
		}
		if got := n.read(n.runc); got != "runc 1.5\n" {
			t.Errorf("%s: runc is %q", when, got)
		}
		want := "version = 3\n# migrated by v2.3.7 from:\n" + n.oldConfig
		if got := n.read(n.config); got != want {
			t.Errorf("%s: the config is\n%s\nwant\n%s", when, got, want)
		}
		if fi, err := os.Stat(n.config); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: the config's mode: %v %v, want 0600 (it holds credentials)", when, fi.Mode(), err)
		}
		n.noLeftovers(when)
	}
	swapped("after runtime-swap")
	if got := n.read(filepath.Join(n.backup, "runtime-files")); got != "containerd\ncontainerd-shim-runc-v2\nctr\nrunc\nconfig.toml\n" {
		t.Errorf("backed up %q", got)
	}
	if got := n.read(n.systemctlLog); got != "restart containerd\n" {
		t.Errorf("systemctl was asked %q", got)
	}

	// Again, as a resumed run would: the running containerd is the new
	// one now, and the backup taken first stays the old runtime.
	if out, code := n.swap(n.archiveSum, "v1.7.35"); code != 0 {
		t.Fatalf("runtime-swap again: exit %d: %s", code, out)
	}
	swapped("after runtime-swap ran twice")
	if got := n.read(filepath.Join(n.backup, "containerd")); got != n.oldPrograms["containerd"] {
		t.Errorf("the second run took the new containerd for the old: %q", got)
	}

	if out, code := n.restore(); code != 0 {
		t.Fatalf("runtime-restore: exit %d: %s", code, out)
	}
	n.onlyOld("after runtime-restore")
	if fi, err := os.Stat(n.config); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("restored config's mode: %v %v", fi.Mode(), err)
	}
	if got := n.read(n.systemctlLog); got != "restart containerd\nrestart containerd\nrestart containerd\n" {
		t.Errorf("systemctl was asked %q", got)
	}
}

// A staged archive that is not the one signed, or a node whose
// containerd is not the version the plan read (no backup taken yet),
// changes nothing: exit 65 and 66, the old runtime in place, nothing
// restarted; restore without a backup puts nothing back.
func TestRuntimeSwapRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		sum, from string
		code      int
	}{
		"tampered archive":    {sum: strings.Repeat("0", 64), from: "v1.7.35", code: ExitDataErr},
		"another old version": {from: "v1.7.20", code: ExitNoInput},
		"the new one running": {from: "v2.3.7-not", code: ExitNoInput},
	} {
		t.Run(name, func(t *testing.T) {
			n := newRuntimeNode(t)
			sum := tc.sum
			if sum == "" {
				sum = n.archiveSum
			}
			out, code := n.swap(sum, tc.from)
			if code != tc.code {
				t.Fatalf("exit %d, want %d: %s", code, tc.code, out)
			}
			n.onlyOld("after the refusal")
			if _, err := os.Stat(n.systemctlLog); err == nil {
				t.Errorf("containerd was restarted: %s", n.read(n.systemctlLog))
			}
			if out, code := n.restore(); code != 0 || strings.TrimSpace(out) != "nothing to restore" {
				t.Errorf("runtime-restore with no backup: exit %d: %q", code, out)
			}
			n.onlyOld("after runtime-restore with no backup")
		})
	}
}
