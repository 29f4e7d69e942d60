package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// makeNetwork creates the admin namespace with the bridge and the
// sandbox's first address, then one namespace per node, joined to the
// bridge by a veth pair. There is no uplink: nothing routes out.
func (s *State) makeNetwork() error {
	admin := s.Admin()
	for i := range s.Machines {
		m := &s.Machines[i]
		if _, err := os.Stat("/run/netns/" + m.NetNS); err == nil {
			return fmt.Errorf("network namespace %s exists already: another sandbox uses the name %q (pick another with --name, or take that one down in its own directory; a leftover goes with 'ip netns del %s')",
				m.NetNS, s.Name, m.NetNS)
		}
		if err := ip("netns", "add", m.NetNS); err != nil {
			return err
		}
		m.NetNSMade = true
		if err := ip("-n", m.NetNS, "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	if err := ipBatch(admin.NetNS,
		"link add br0 type bridge",
		fmt.Sprintf("addr add %s/24 dev br0", admin.Address),
		"link set br0 up"); err != nil {
		return err
	}
	for _, m := range s.Machines {
		if m.Role == "admin" || m.Role == "internet" { // the internet has no link to the air gap
			continue
		}
		peer := vethName(m.Name)
		if err := ip("-n", admin.NetNS, "link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", m.NetNS); err != nil {
			return err
		}
		if err := ipBatch(admin.NetNS, "link set "+peer+" master br0", "link set "+peer+" up"); err != nil {
			return err
		}
		if err := ipBatch(m.NetNS,
			fmt.Sprintf("addr add %s/24 dev eth0", m.Address),
			"link set eth0 up",
			"route add default via "+admin.Address); err != nil {
			return err
		}
	}
	if s.Runtime == RuntimeContainerd {
		return s.podRoutes()
	}
	return nil
}

// podRoutes routes every node's pod CIDR to that node, from every other
// node and from the admin machine, as kindnetd does: pods reach pods on
// other nodes by their own addresses.
func (s *State) podRoutes() error {
	for _, from := range append([]Machine{s.Admin()}, s.Nodes()...) {
		var cmds []string
		for _, to := range s.Nodes() {
			if to.Name != from.Name {
				cmds = append(cmds, fmt.Sprintf("route add %s via %s", s.PodCIDR(to), to.Address))
			}
		}
		if err := ipBatch(from.NetNS, cmds...); err != nil {
			return err
		}
	}
	return nil
}

// vethName is the bridge-side end of a node's link (at most 15 bytes).
func vethName(node string) string {
	n := "v-" + node
	if len(n) > 15 {
		n = n[:15]
	}
	return n
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func ipBatch(netns string, cmds ...string) error {
	c := exec.Command("ip", "-n", netns, "-batch", "-")
	c.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	out, err := c.CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip -n %s: %q: %v: %s", netns, cmds, err, strings.TrimSpace(string(out)))
	}
	return nil
}
