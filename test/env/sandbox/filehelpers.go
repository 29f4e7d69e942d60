package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// writeUnit writes a unit file and, if enable, its multi-user.target.wants
// link, as "systemctl enable" does.
func writeUnit(m *Machine, name, content string, enable bool) error {
	path := "/etc/systemd/system/" + name
	if err := os.WriteFile(m.fsPath(path), []byte(content), 0o644); err != nil {
		return err
	}
	if !enable {
		return nil
	}
	return os.Symlink(path, m.fsPath("/etc/systemd/system/multi-user.target.wants/"+name))
}

func (s *State) writeInventory() error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Nodes of the kubelift sandbox; reach them from the admin namespace %s.\n", s.Admin().NetNS)
	fmt.Fprintf(&b, "apiVersion: kubelift.io/v1alpha1\nkind: Inventory\nssh:\n  identityFile: %s\n  knownHostsFile: %s\nnodes:\n",
		filepath.Join(s.Dir, "ssh", "id_ed25519"), filepath.Join(s.Dir, "ssh", "known_hosts"))
	for _, m := range s.Nodes() {
		fmt.Fprintf(&b, "- name: %s\n  role: %s\n  address: %s\n  user: root\n", m.Name, m.Role, m.Address)
	}
	return os.WriteFile(filepath.Join(s.Dir, "inventory.yaml"), []byte(b.String()), 0o644)
}

func (s *State) writeEnv() error {
	admin := s.Admin()
	var cases strings.Builder
	for _, m := range s.Nodes() {
		fmt.Fprintf(&cases, "%s) a=%s;; ", m.Name, m.Address)
	}
	env := fmt.Sprintf(`# Source this file: . %[1]s/env.sh
# The sandbox's addresses exist only inside its namespaces: run tools on
# the admin machine (the bastion inside the air gap) with 'sandbox CMD...',
# and log in to a node with 'sandbox-ssh NODE'.
export KUBELIFT_SANDBOX=%[1]s
export KUBECONFIG=%[1]s/kubeconfig
export KUBELIFT_INVENTORY=%[1]s/inventory.yaml
export KUBELIFT_REGISTRY=%[2]s
export KUBELIFT_REGISTRY_USER=%[3]s
export KUBELIFT_REGISTRY_CA=%[4]s
export KUBELIFT_OLD_VERSION=%[5]s
export KUBELIFT_NEW_VERSION=%[6]s
export PATH=%[7]s:$PATH
sandbox() { nsenter --net=/run/netns/%[8]s -- "$@"; }
# The stand-in internet (outside the air gap): 'internet bundle create ... $KUBELIFT_BUNDLE_FLAGS'.
internet() { nsenter --net=/run/netns/%[10]s -- "$@"; }
export KUBELIFT_BUNDLE_FLAGS="%[11]s"
sandbox-ssh() { local n=$1 a; shift; case $n in %[9]s *) a=$n;; esac
  sandbox ssh -i %[1]s/ssh/id_ed25519 -o UserKnownHostsFile=%[1]s/ssh/known_hosts -o StrictHostKeyChecking=yes -o BatchMode=yes root@"$a" "$@"; }
`, s.Dir, s.Registry.Address, s.Registry.User, s.Registry.CAFile, s.OldVersion, s.NewVersion, s.Binaries.Old, admin.NetNS, cases.String(), s.Internet.NetNS, strings.Join(s.Internet.BundleFlags, " "))
	return os.WriteFile(filepath.Join(s.Dir, "env.sh"), []byte(env), 0o644)
}

func sshKeygen(path, comment string) error {
	_ = os.Remove(path)
	_ = os.Remove(path + ".pub")
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ssh-keygen %s (Debian openssh-client): %v: %s", path, err, out)
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst+".partial", os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(dst+".partial", dst)
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
