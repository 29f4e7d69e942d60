package nodefacts

import "strings"

// ContainerdPaths are where a node's containerd runs from: its program
// (the unit's main process), the config it was started with (-c or
// --config; empty: its default) and the runc on the node's PATH.
type ContainerdPaths struct {
	Binary string `json:"binary,omitempty"`
	Config string `json:"config,omitempty"`
	Runc   string `json:"runc,omitempty"`
}

// parse reads facts.sh's containerd section ("binary PATH", "config
// PATH", "runc PATH"), refusing a path that is not absolute and clean.
func (c *ContainerdPaths) parse(node, body string) []BadValue {
	var bad []BadValue
	for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
		key, value, _ := strings.Cut(line, " ")
		var field string
		var to *string
		switch key {
		case "binary":
			field, to = "containerd program (/proc/PID/exe)", &c.Binary
		case "config":
			field, to = "containerd --config", &c.Config
		case "runc":
			field, to = "runc (command -v runc)", &c.Runc
		default:
			continue
		}
		if b := CheckPath(node, field, value); b != nil {
			bad = append(bad, *b)
			continue
		}
		*to = value
	}
	return bad
}
