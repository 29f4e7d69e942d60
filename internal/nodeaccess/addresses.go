package nodeaccess

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

const roleLabelPrefix = "node-role.kubernetes.io/"

// Addresses says where and as whom to reach each of the cluster's nodes, in
// their order. A node's address is its InternalIP, else its ExternalIP,
// else its Hostname; its role comes from its node-role.kubernetes.io/
// labels: "control-plane" (for control-plane or master), else the first
// other role, else "worker". The inventory (which may be nil) overrides
// these per node; the port and user come from the inventory's node entry,
// else its role entry, else its ssh section, else 22 and root. A node in
// the inventory but not in the cluster is an error, and so is a node with
// no address, an address that is neither an IP nor a DNS name, and two
// nodes reached at one address and port (a node's status may name
// another's address: commands meant for one would run on the other).
func Addresses(nodes []corev1.Node, inv *Inventory) ([]Address, error) {
	if inv == nil {
		inv = &Inventory{}
	}
	byName := make(map[string]NodeConfig, len(inv.Nodes))
	for _, n := range inv.Nodes {
		byName[n.Name] = n
	}
	var errs []error
	targets := make([]Address, 0, len(nodes))
	at := map[string]string{} // address:port -> the node reached there
	for _, n := range nodes {
		o, inInventory := byName[n.Name]
		delete(byName, n.Name)
		t := Address{
			Name:    n.Name,
			Role:    cmp.Or(o.Role, nodeRole(n.Labels)),
			Address: cmp.Or(o.Address, nodeAddress(n.Status.Addresses)),
		}
		if t.Address == "" {
			where := "its status"
			if inInventory {
				where += " nor the inventory"
			}
			errs = append(errs, fmt.Errorf("node %s: no address in %s", n.Name, where))
			continue
		}
		where := "status.addresses"
		if o.Address != "" {
			where = strings.TrimSpace("the inventory " + inv.file)
		}
		if net.ParseIP(t.Address) == nil && len(validation.IsDNS1123Subdomain(strings.ToLower(strings.TrimSuffix(t.Address, ".")))) > 0 {
			errs = append(errs, fmt.Errorf("node %s: address %q in %s: not an IP address or a DNS name", n.Name, t.Address, where))
			continue
		}
		r := inv.Roles[t.Role]
		t.Port = cmp.Or(o.Port, r.Port, inv.SSH.Port, 22)
		t.User = cmp.Or(o.User, r.User, inv.SSH.User, "root")
		hp := net.JoinHostPort(t.Address, strconv.Itoa(t.Port))
		if other, dup := at[hp]; dup {
			errs = append(errs, fmt.Errorf("node %s: address %s (from %s) is node %s's too: give each node its own address in the inventory", n.Name, hp, where, other))
			continue
		}
		at[hp] = n.Name
		targets = append(targets, t)
	}
	invName := strings.TrimSpace("the inventory " + inv.file)
	for _, n := range inv.Nodes {
		if _, missing := byName[n.Name]; missing {
			errs = append(errs, fmt.Errorf("node %s: in %s but not in the cluster", n.Name, invName))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return targets, nil
}

func nodeRole(labels map[string]string) string {
	var roles []string
	for k := range labels {
		r, ok := strings.CutPrefix(k, roleLabelPrefix)
		switch {
		case !ok || r == "":
		case r == "control-plane" || r == "master":
			return "control-plane"
		default:
			roles = append(roles, r)
		}
	}
	if len(roles) == 0 {
		return "worker"
	}
	return slices.Min(roles)
}

func nodeAddress(addrs []corev1.NodeAddress) string {
	for _, typ := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP, corev1.NodeHostName} {
		for _, a := range addrs {
			if a.Type == typ && a.Address != "" {
				return a.Address
			}
		}
	}
	return ""
}
