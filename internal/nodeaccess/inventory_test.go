package nodeaccess

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const goodInventory = `apiVersion: kubelift.io/v1alpha1
kind: Inventory
ssh:
  identityFile: id_ed25519
  knownHostsFile: /etc/kubelift/known_hosts
  user: admin
  port: 2200
  jump: ops@bastion:22
roles:
  worker: {user: ubuntu, port: 2222}
nodes:
- name: cp-1
  role: control-plane
  address: 10.77.0.11
  user: root
  port: 22
- name: worker-1
  address: worker-1.cluster.internal
`

func TestLoadInventory(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "inventory.yaml")
	if err := os.WriteFile(file, []byte(goodInventory), 0o644); err != nil {
		t.Fatal(err)
	}
	inv, err := LoadInventory(file)
	if err != nil {
		t.Fatal(err)
	}
	want := &Inventory{
		APIVersion: InventoryAPIVersion,
		Kind:       InventoryKind,
		SSH: SSHConfig{
			IdentityFile:   filepath.Join(dir, "id_ed25519"), // relative to the inventory
			KnownHostsFile: "/etc/kubelift/known_hosts",
			User:           "admin",
			Port:           2200,
			Jump:           "ops@bastion:22",
		},
		Roles: map[string]RoleConfig{"worker": {User: "ubuntu", Port: 2222}},
		Nodes: []NodeConfig{
			{Name: "cp-1", Role: "control-plane", Address: "10.77.0.11", User: "root", Port: 22},
			{Name: "worker-1", Address: "worker-1.cluster.internal"},
		},
		file: file,
	}
	if !reflect.DeepEqual(inv, want) {
		t.Errorf("inventory = %+v\nwant %+v", inv, want)
	}
	if got := len(inv.DialerOptions()); got != 2 {
		t.Errorf("%d dialer options, want identity file and jump host", got)
	}
}

func TestLoadInventoryErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown field", strings.Replace(goodInventory, "  user: admin", "  usr: admin", 1), `ssh.usr: unknown field`},
		{"unknown node field", strings.Replace(goodInventory, "  port: 22\n", "  prot: 22\n", 1), `nodes[0].prot: unknown field`},
		{"wrong kind", strings.Replace(goodInventory, "kind: Inventory", "kind: Cluster", 1), `apiVersion/kind: got "kubelift.io/v1alpha1"/"Cluster", want kubelift.io/v1alpha1/Inventory`},
		{"wrong apiVersion", strings.Replace(goodInventory, "v1alpha1", "v2", 1), `apiVersion/kind: got "kubelift.io/v2"`},
		{"duplicate name", goodInventory + "- name: cp-1\n", `nodes[2].name: "cp-1" is also nodes[0]`},
		{"missing name", goodInventory + "- address: 10.0.0.1\n", `nodes[2].name: missing`},
		{"bad address", strings.Replace(goodInventory, "10.77.0.11", "10.77.0.300", 1), `nodes[0].address: "10.77.0.300" is not an IP address or DNS name`},
		{"address with port", strings.Replace(goodInventory, "10.77.0.11", "10.77.0.11:22", 1), `nodes[0].address: "10.77.0.11:22" is not`},
		{"bad port", strings.Replace(goodInventory, "port: 2222", "port: 70000", 1), `roles.worker.port: 70000 is not a port`},
		{"bad jump", strings.Replace(goodInventory, "ops@bastion:22", "ops@bastion:ssh", 1), `ssh.jump: jump host "ops@bastion:ssh": bad port`},
		{"not yaml", "nodes: [", "yaml"},
		{"wrong type", strings.Replace(goodInventory, "  jump: ops@bastion:22", "  jump: [ops@bastion]", 1), "cannot unmarshal array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "inventory.yaml")
			if err := os.WriteFile(file, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadInventory(file)
			if err == nil || !strings.HasPrefix(err.Error(), "inventory "+file+": ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to name %s and say %q", err, file, tc.want)
			}
		})
	}
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	if _, err := LoadInventory(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: err = %v", err)
	}
}
