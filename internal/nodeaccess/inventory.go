package nodeaccess

import (
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// The apiVersion and kind an inventory file declares.
const (
	InventoryAPIVersion = "kubelift.io/v1alpha1"
	InventoryKind       = "Inventory"
)

// Inventory says how to reach the cluster's nodes over SSH where their Node
// objects do not: credentials, known_hosts, a jump host, and the address,
// port and user per role and per node.
type Inventory struct {
	APIVersion string                `json:"apiVersion"`
	Kind       string                `json:"kind"`
	SSH        SSHConfig             `json:"ssh"`
	Roles      map[string]RoleConfig `json:"roles,omitempty"`
	Nodes      []NodeConfig          `json:"nodes,omitempty"`

	file string // where it was loaded from, for messages
}

// SSHConfig is the inventory's ssh section: credentials and defaults for
// every node. Relative paths are relative to the inventory file.
type SSHConfig struct {
	IdentityFile   string `json:"identityFile,omitempty"`
	KnownHostsFile string `json:"knownHostsFile,omitempty"`
	User           string `json:"user,omitempty"` // default root
	Port           int    `json:"port,omitempty"` // default 22
	Jump           string `json:"jump,omitempty"` // [user@]host[:port]
}

// RoleConfig is the user and port for every node of one role.
type RoleConfig struct {
	User string `json:"user,omitempty"`
	Port int    `json:"port,omitempty"`
}

// NodeConfig overrides, for the node of that name, what the cluster and the
// rest of the inventory say. Empty fields override nothing.
type NodeConfig struct {
	Name    string `json:"name"`
	Role    string `json:"role,omitempty"`
	Address string `json:"address,omitempty"` // IP address or DNS name, without the port
	User    string `json:"user,omitempty"`
	Port    int    `json:"port,omitempty"`
}

// LoadInventory reads and checks an inventory file. Unknown fields are
// errors, so that a misspelt override is not silently ignored.
func LoadInventory(file string) (*Inventory, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	inv := &Inventory{file: file}
	if err := yaml.UnmarshalStrict(data, inv); err != nil {
		var doc any
		if yaml.Unmarshal(data, &doc) == nil {
			if field := unknownField(doc, reflect.TypeFor[Inventory](), ""); field != "" {
				err = fmt.Errorf("%s: unknown field", field)
			}
		}
		return nil, fmt.Errorf("inventory %s: %w", file, err)
	}
	if err := inv.validate(); err != nil {
		return nil, fmt.Errorf("inventory %s: %w", file, err)
	}
	for _, p := range []*string{&inv.SSH.IdentityFile, &inv.SSH.KnownHostsFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(filepath.Dir(file), *p)
		}
	}
	return inv, nil
}

// DialerOptions are the options for NewDialer that the ssh section sets;
// its known_hosts file is NewDialer's first argument.
func (inv *Inventory) DialerOptions() []Option {
	var opts []Option
	if inv.SSH.IdentityFile != "" {
		opts = append(opts, WithIdentityFile(inv.SSH.IdentityFile))
	}
	if inv.SSH.Jump != "" {
		opts = append(opts, WithJump(inv.SSH.Jump))
	}
	return opts
}

func (inv *Inventory) validate() error {
	if inv.APIVersion != InventoryAPIVersion || inv.Kind != InventoryKind {
		return fmt.Errorf("apiVersion/kind: got %q/%q, want %s/%s", inv.APIVersion, inv.Kind, InventoryAPIVersion, InventoryKind)
	}
	if err := checkPort("ssh.port", inv.SSH.Port); err != nil {
		return err
	}
	if inv.SSH.Jump != "" {
		if _, err := parseJump(inv.SSH.Jump); err != nil {
			return fmt.Errorf("ssh.jump: %w", err)
		}
	}
	for role, r := range inv.Roles {
		if err := checkPort("roles."+role+".port", r.Port); err != nil {
			return err
		}
	}
	seen := make(map[string]int)
	for i, n := range inv.Nodes {
		field := fmt.Sprintf("nodes[%d]", i)
		if n.Name == "" {
			return fmt.Errorf("%s.name: missing", field)
		}
		if j, dup := seen[n.Name]; dup {
			return fmt.Errorf("%s.name: %q is also nodes[%d]", field, n.Name, j)
		}
		seen[n.Name] = i
		if n.Address != "" && !validAddress(n.Address) {
			return fmt.Errorf("%s.address: %q is not an IP address or DNS name", field, n.Address)
		}
		if err := checkPort(field+".port", n.Port); err != nil {
			return err
		}
	}
	return nil
}

func checkPort(field string, port int) error {
	if port < 0 || port > 65535 {
		return fmt.Errorf("%s: %d is not a port", field, port)
	}
	return nil
}

// validAddress accepts an IP address or a DNS name, and not something like
// 10.0.0.300 that is neither, though a DNS label may be all digits.
func validAddress(a string) bool {
	if net.ParseIP(a) != nil {
		return true
	}
	return strings.Trim(a, "0123456789.") != "" && len(validation.IsDNS1123Subdomain(strings.ToLower(a))) == 0
}

// unknownField is the path, like nodes[2].prot, of the first field in doc
// (decoded YAML) that typ has no field for; the decoder's own message names
// the field but not where it is.
func unknownField(doc any, typ reflect.Type, at string) string {
	switch typ.Kind() {
	case reflect.Struct, reflect.Map:
		m, _ := doc.(map[string]any)
		for _, k := range slices.Sorted(maps.Keys(m)) {
			path, elem := strings.TrimPrefix(at+"."+k, "."), typ
			if typ.Kind() == reflect.Map {
				elem = typ.Elem()
			} else if elem = jsonFieldType(typ, k); elem == nil {
				return path
			}
			if p := unknownField(m[k], elem, path); p != "" {
				return p
			}
		}
	case reflect.Slice:
		s, _ := doc.([]any)
		for i, v := range s {
			if p := unknownField(v, typ.Elem(), fmt.Sprintf("%s[%d]", at, i)); p != "" {
				return p
			}
		}
	}
	return ""
}

// jsonFieldType is the type of struct typ's field that encoding/json
// decodes key into, or nil.
func jsonFieldType(typ reflect.Type, key string) reflect.Type {
	for f := range typ.Fields() {
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); f.IsExported() && strings.EqualFold(name, key) {
			return f.Type
		}
	}
	return nil
}
