package kubeadm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"

	"sigs.k8s.io/yaml"
)

// MaxUpgradeConfigSize bounds an UpgradeConfiguration file.
const MaxUpgradeConfigSize = 64 << 10

// UpgradeConfigAPIVersion is the kubeadm API that has UpgradeConfiguration
// (kubeadm v1.31 and later).
const UpgradeConfigAPIVersion = "kubeadm.k8s.io/v1beta4"

// UpgradeConfig is an operator's kubeadm UpgradeConfiguration, passed
// as is (`--config`) to every `kubeadm upgrade` kubelift runs: kubeadm's
// own settings for the upgrade, its timeouts for example
// (timeouts.upgradeManifests: how long kubeadm waits for a static pod
// before it puts the old one back).
type UpgradeConfig struct {
	// Data is the file, byte for byte.
	Data []byte
	// Sum is its sha256, hex.
	Sum string
}

// ForNode is the file as a node gets it: with patches (the node has
// PatchesDir), apply.patches.directory and node.patches.directory set to
// it where the file leaves them out (kubeadm refuses --patches beside
// --config), and where on the node it goes, below dir, named by its
// sha256.
func (c *UpgradeConfig) ForNode(dir string, patches bool) (data []byte, at string, err error) {
	data = c.Data
	if patches {
		doc := map[string]any{}
		if err := yaml.Unmarshal(c.Data, &doc); err != nil {
			return nil, "", err
		}
		for _, section := range []string{"apply", "node"} {
			sec, _ := doc[section].(map[string]any)
			if sec == nil {
				sec = map[string]any{}
			}
			p, _ := sec["patches"].(map[string]any)
			if p == nil {
				p = map[string]any{}
			}
			if d, _ := p["directory"].(string); d == "" {
				p["directory"] = PatchesDir
			}
			sec["patches"] = p
			doc[section] = sec
		}
		if data, err = yaml.Marshal(doc); err != nil {
			return nil, "", err
		}
	}
	sum := sha256.Sum256(data)
	return data, dir + "/upgrade-config-" + hex.EncodeToString(sum[:8]) + ".yaml", nil
}

// docSeparator is a YAML document separator line.
var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// ParseUpgradeConfig checks an UpgradeConfiguration file (where names it
// in errors): one YAML document of kind UpgradeConfiguration in
// kubeadm.k8s.io/v1beta4, no bigger than MaxUpgradeConfigSize, that
// leaves to kubelift what kubelift decides: the version
// (apply.kubernetesVersion, when set, must be to) and whether to change
// anything (apply.dryRun and node.dryRun must not be true).
func ParseUpgradeConfig(where string, data []byte, to string) (*UpgradeConfig, error) {
	if len(data) > MaxUpgradeConfigSize {
		return nil, fmt.Errorf("%s: %d bytes, over %d: not an UpgradeConfiguration", where, len(data), MaxUpgradeConfigSize)
	}
	body := bytes.TrimPrefix(bytes.TrimSpace(data), []byte("---"))
	if docSeparator.Match(body) {
		return nil, fmt.Errorf("%s: more than one YAML document: give the UpgradeConfiguration alone", where)
	}
	var doc struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Apply      struct {
			KubernetesVersion string `json:"kubernetesVersion"`
			DryRun            *bool  `json:"dryRun"`
		} `json:"apply"`
		Node struct {
			DryRun *bool `json:"dryRun"`
		} `json:"node"`
	}
	if err := yaml.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if doc.Kind != "UpgradeConfiguration" || doc.APIVersion != UpgradeConfigAPIVersion {
		return nil, fmt.Errorf("%s: kind %q apiVersion %q: want kind UpgradeConfiguration, apiVersion %s (kubeadm v1.31 and later)", where, doc.Kind, doc.APIVersion, UpgradeConfigAPIVersion)
	}
	if v := doc.Apply.KubernetesVersion; v != "" && v != to {
		return nil, fmt.Errorf("%s: apply.kubernetesVersion %q: kubelift upgrades to %s (--to); leave the field out", where, v, to)
	}
	if (doc.Apply.DryRun != nil && *doc.Apply.DryRun) || (doc.Node.DryRun != nil && *doc.Node.DryRun) {
		return nil, fmt.Errorf("%s: dryRun: true: kubeadm would change nothing while kubelift waits for it (use upgrade apply --dry-run)", where)
	}
	sum := sha256.Sum256(data)
	return &UpgradeConfig{Data: data, Sum: hex.EncodeToString(sum[:])}, nil
}
