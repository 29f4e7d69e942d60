package nodescript

import (
	"os"
	"path/filepath"
	"testing"
)

// etcd-swap checks the staged archive, backs the member's programs up
// once (etcdutl, which 3.4 nodes lack, listed as added), renames the
// bundle's over them and restarts the unit; run again it keeps the first
// backup; etcd-restore puts the old ones back, removes the added one and
// restarts the unit; a tampered archive changes nothing.
func TestEtcdSwapAndRestore(t *testing.T) {
	n := newRuntimeNode(t)
	old := map[string]string{"etcd": "#!/bin/sh\necho etcd Version: 3.5.35\n", "etcdctl": "#!/bin/sh\necho etcdctl 3.5.35\n"}
	for name, content := range old {
		n.write(filepath.Join(n.bin, name), content, 0o755)
	}
	archive := tgz(t, [][3]string{
		{"etcd-v3.6.16-linux-amd64/README.md", "# etcd\n", ""},
		{"etcd-v3.6.16-linux-amd64/etcd", "#!/bin/sh\necho etcd Version: 3.6.16\n", "x"},
		{"etcd-v3.6.16-linux-amd64/etcdctl", "#!/bin/sh\necho etcdctl 3.6.16\n", "x"},
		{"etcd-v3.6.16-linux-amd64/etcdutl", "#!/bin/sh\necho etcdutl 3.6.16\n", "x"},
	})
	staged := filepath.Join(n.root, "var/lib/kubelift/staged/v1.31.14/etcd")
	n.write(staged, string(archive), 0o644)
	backup := filepath.Join(n.backup, "etcd")

	if out, code := n.run(EtcdSwap.Command(backup, staged, sha256hex([]byte("not it")), n.bin, "etcd")); code != 65 {
		t.Fatalf("a tampered archive: exit %d, want 65: %s", code, out)
	}
	if got := n.read(filepath.Join(n.bin, "etcd")); got != old["etcd"] {
		t.Fatalf("a tampered archive changed etcd: %q", got)
	}
	for i := 0; i < 2; i++ {
		if out, code := n.run(EtcdSwap.Command(backup, staged, sha256hex(archive), n.bin, "etcd")); code != 0 {
			t.Fatalf("etcd-swap (run %d): exit %d: %s", i+1, code, out)
		}
	}
	if got := n.read(filepath.Join(n.bin, "etcdutl")); got != "#!/bin/sh\necho etcdutl 3.6.16\n" {
		t.Errorf("etcdutl after the swap: %q", got)
	}
	if _, err := os.Stat(filepath.Join(n.bin, "README.md")); err == nil {
		t.Error("the archive's README.md was put among the programs")
	}
	if got := n.read(filepath.Join(backup, "etcd")); got != old["etcd"] {
		t.Errorf("the backup of etcd after two swaps: %q, want the first one's", got)
	}
	if got := n.read(filepath.Join(backup, "etcd-added")); got != "etcdutl\n" {
		t.Errorf("etcd-added: %q", got)
	}
	if out, code := n.run(EtcdRestore.Command(backup, n.bin, "etcd")); code != 0 {
		t.Fatalf("etcd-restore: exit %d: %s", code, out)
	}
	for name, content := range old {
		if got := n.read(filepath.Join(n.bin, name)); got != content {
			t.Errorf("%s after the restore: %q", name, got)
		}
	}
	if _, err := os.Stat(filepath.Join(n.bin, "etcdutl")); !os.IsNotExist(err) {
		t.Errorf("etcdutl, which the swap added, is still there after the restore (%v)", err)
	}
	// The swaps and the restore queue the restart (the engine waits for
	// the member: a large database may outlast a node command's limit).
	if got := n.read(n.systemctlLog); got != "restart --no-block etcd\nrestart --no-block etcd\nrestart --no-block etcd\n" {
		t.Errorf("systemctl was asked %q", got)
	}
	// Put back already and running: nothing restarts.
	if out, code := n.run(EtcdRestore.Command(backup, n.bin, "etcd")); code != 0 || out != "### same\n" {
		t.Errorf("etcd-restore again: exit %d: %q, want ### same", code, out)
	}
	if got := n.read(n.systemctlLog); got != "restart --no-block etcd\nrestart --no-block etcd\nrestart --no-block etcd\nis-active --quiet etcd\n" {
		t.Errorf("etcd-restore again asked systemctl %q", got)
	}
	if out, _ := n.run(EtcdRestore.Command(filepath.Join(n.root, "nothing"), n.bin, "etcd")); out != "### none\n" {
		t.Errorf("etcd-restore without a backup said %q", out)
	}
}
