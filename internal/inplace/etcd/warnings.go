package etcd

import (
	"fmt"
	"strings"

	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// Warning is what plan says of a move it does not block: what the API
// will see, and what to do about it.
type Warning struct {
	Message, Fix string
}

// Warnings are plan's words on a planned move of members (the nodes'
// facts tell their API servers): a cluster of one or two members, which
// loses its quorum while each restarts, and API servers that fail a read
// at the leader's handover (Unretried).
func Warnings(nodes []nodeaccess.Address, facts map[string]*nodefacts.Facts, members []Member) []Warning {
	var out []Warning
	if len(members) > 0 && len(members) <= 2 {
		names := make([]string, len(members))
		for i, m := range members {
			names[i] = m.Node
		}
		out = append(out, Warning{
			Message: fmt.Sprintf("etcd has %s (%s): its quorum needs every one, so while each restarts (about 10 s on the sandbox) etcd answers nothing, and the API fails its requests",
				[]string{"", "one member", "two members"}[len(members)], strings.Join(names, ", ")),
			Fix: "move at a quiet time, or add members first (three tolerate one restart: etcd's own guide for runtime reconfiguration)",
		})
	}
	if msg, fix := Unretried(nodes, facts); msg != "" {
		out = append(out, Warning{Message: msg, Fix: fix})
	}
	return out
}
