package nodefacts

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"
)

// ContainerdPaths are where a node's containerd runs from: its program
// (the unit's main process), the config it was started with (-c or
// --config; empty: its default), the runc and crictl on the node's PATH,
// and where it takes the CNI plugins from.
type ContainerdPaths struct {
	Binary string `json:"binary,omitempty"`
	Config string `json:"config,omitempty"`
	Runc   string `json:"runc,omitempty"`
	// Crictl is the crictl on the node's PATH.
	Crictl string `json:"crictl,omitempty"`
	// CNIBinDir is where the runtime takes the CNI plugins from, as it
	// says in `crictl info` (its CRI config's first cni.binDirs, or 1.x's
	// cni.binDir); CNIErr says why it is empty when crictl info failed or
	// named none.
	CNIBinDir string `json:"cniBinDir,omitempty"`
	CNIErr    string `json:"cniError,omitempty"`
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
		case "crictl":
			field, to = "crictl (command -v crictl)", &c.Crictl
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

// setCNI reads the CNI plugins' directory from `crictl info`'s JSON (the
// runtime's CRI config, "config": {"cni": {...}}), or says why there is
// none (CNIErr): crictl info failed, its output is not JSON, the runtime
// names no directory (not containerd), or one that is not an absolute
// path of plain characters (named, with its value). Only a tools move
// needs the directory, so what does not parse refuses that move (plan
// blocks it), not the whole node.
func (c *ContainerdPaths) setCNI(node, body string, failed bool) {
	if failed {
		c.CNIErr = "crictl info failed"
		return
	}
	var info struct {
		Config struct {
			CNI struct {
				BinDir  string   `json:"binDir"`
				BinDirs []string `json:"binDirs"`
			} `json:"cni"`
		} `json:"config"`
	}
	if err := json.Unmarshal([]byte(body), &info); err != nil {
		c.CNIErr = fmt.Sprintf("crictl info is not JSON (%v): %q", err, firstLine(body))
		return
	}
	dir := info.Config.CNI.BinDir
	if len(info.Config.CNI.BinDirs) > 0 {
		dir = info.Config.CNI.BinDirs[0]
	}
	if dir == "" {
		c.CNIErr = "crictl info names no config.cni.binDirs or config.cni.binDir"
		return
	}
	// "/opt/cni/bin/" as written in a config is /opt/cni/bin.
	if strings.HasPrefix(dir, "/") {
		dir = path.Clean(dir)
	}
	if b := CheckPath(node, "crictl info: config.cni.binDirs", dir); b != nil {
		c.CNIErr = b.Error()
		return
	}
	c.CNIBinDir = dir
}

// firstLine is s's first line, cut at 80 bytes, for an error message.
func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	if len(l) > 80 {
		l = l[:80] + "..."
	}
	return l
}
