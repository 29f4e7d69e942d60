package nodeaccess

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func node(name string, labels map[string]string, addrs ...string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	for i := 0; i+1 < len(addrs); i += 2 {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeAddressType(addrs[i]), Address: addrs[i+1]})
	}
	return n
}

func TestAddresses(t *testing.T) {
	nodes := []corev1.Node{
		node("cp-1", map[string]string{"node-role.kubernetes.io/control-plane": ""}, "Hostname", "cp-1", "InternalIP", "10.0.0.11"),
		node("cp-2", map[string]string{"node-role.kubernetes.io/master": "", "node-role.kubernetes.io/etcd": ""}, "ExternalIP", "203.0.113.12", "InternalIP", "10.0.0.12"),
		node("gpu-1", map[string]string{"node-role.kubernetes.io/infra": "", "node-role.kubernetes.io/gpu": "", "kubernetes.io/os": "linux"}, "ExternalIP", "203.0.113.21"),
		node("worker-1", nil, "Hostname", "worker-1.internal"),
		node("worker-2", map[string]string{"master": ""}, "InternalIP", "10.0.0.32"),
	}

	got, err := Addresses(nodes, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []Address{
		{Name: "cp-1", Role: "control-plane", Address: "10.0.0.11", Port: 22, User: "root"},
		{Name: "cp-2", Role: "control-plane", Address: "10.0.0.12", Port: 22, User: "root"},
		{Name: "gpu-1", Role: "gpu", Address: "203.0.113.21", Port: 22, User: "root"},
		{Name: "worker-1", Role: "worker", Address: "worker-1.internal", Port: 22, User: "root"},
		{Name: "worker-2", Role: "worker", Address: "10.0.0.32", Port: 22, User: "root"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Addresses without inventory =\n%+v\nwant\n%+v", got, want)
	}

	inv := &Inventory{
		SSH:   SSHConfig{User: "admin", Port: 2200},
		Roles: map[string]RoleConfig{"worker": {User: "ubuntu", Port: 2222}, "gpu": {Port: 2022}},
		Nodes: []NodeConfig{
			{Name: "cp-1", User: "root", Port: 22},
			{Name: "gpu-1", Address: "10.0.0.21"},
			{Name: "worker-2", Role: "gpu", User: "ops"},
		},
	}
	got, err = Addresses(nodes, inv)
	if err != nil {
		t.Fatal(err)
	}
	want = []Address{
		{Name: "cp-1", Role: "control-plane", Address: "10.0.0.11", Port: 22, User: "root"},          // node entry
		{Name: "cp-2", Role: "control-plane", Address: "10.0.0.12", Port: 2200, User: "admin"},       // ssh defaults
		{Name: "gpu-1", Role: "gpu", Address: "10.0.0.21", Port: 2022, User: "admin"},                // address from node, port from role
		{Name: "worker-1", Role: "worker", Address: "worker-1.internal", Port: 2222, User: "ubuntu"}, // role
		{Name: "worker-2", Role: "gpu", Address: "10.0.0.32", Port: 2022, User: "ops"},               // role from node entry
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Addresses with inventory =\n%+v\nwant\n%+v", got, want)
	}
}

func TestTargetsErrors(t *testing.T) {
	nodes := []corev1.Node{
		node("cp-1", nil, "InternalIP", "10.0.0.11"),
		node("bare-1", nil),
		node("bare-2", nil),
	}
	inv := &Inventory{
		Nodes: []NodeConfig{{Name: "bare-2", Address: "10.0.0.42"}, {Name: "ghost", Address: "10.0.0.99"}},
		file:  "/etc/kubelift/inventory.yaml",
	}
	_, err := Addresses(nodes, inv)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"node bare-1: no address in its status",
		"node ghost: in the inventory /etc/kubelift/inventory.yaml but not in the cluster",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "bare-2") || strings.Contains(err.Error(), "cp-1") {
		t.Errorf("err = %v names nodes that are fine", err)
	}
}

// A node's status is not trusted: an address that is neither an IP nor a
// DNS name is refused, naming node, field and value, and so is an address
// and port another node is reached at (a node reporting its neighbour's
// address would have the neighbour receive its commands); the inventory
// can give each its own, and two nodes behind one address on different
// ports are fine.
func TestTargetsRefuseBadAndSharedAddresses(t *testing.T) {
	nodes := []corev1.Node{
		node("worker-1", nil, "InternalIP", "10.0.0.21"),
		node("worker-2", nil, "InternalIP", "10.0.0.21"),
		node("worker-3", nil, "InternalIP", "10.0.0.23; rm -rf /"),
	}
	_, err := Addresses(nodes, nil)
	for _, want := range []string{
		"node worker-2: address 10.0.0.21:22 (from status.addresses) is node worker-1's too",
		`node worker-3: address "10.0.0.23; rm -rf /" in status.addresses: not an IP address or a DNS name`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to say %q", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "node worker-1:") {
		t.Errorf("err = %v names worker-1, which was first at its address", err)
	}
	inv := &Inventory{Nodes: []NodeConfig{{Name: "worker-2", Address: "10.0.0.22"}, {Name: "worker-3", Address: "10.0.0.21", Port: 2222}}}
	got, err := Addresses(nodes, inv)
	if err != nil || len(got) != 3 {
		t.Fatalf("with the inventory: %v %+v", err, got)
	}
}
