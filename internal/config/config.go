// Package config is kubelift's own config file: named contexts, each a
// cluster with its kubeconfig, its private registry, the team's public
// key and how its nodes are reached, so that a command names a cluster
// once (kubectl's kubeconfig contexts, k0sctl's cluster file). It holds
// no password: the registry's comes from a credential helper, the docker
// config, stdin or the environment. Flags override it, the environment
// overrides it where a flag has a variable, and it overrides the flags'
// defaults (Apply).
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/kubelift/kubelift/internal/atomicfile"
)

// The apiVersion and kind the file declares.
const (
	APIVersion = "kubelift.io/v1alpha1"
	Kind       = "Config"
)

// Env names the file when --config does not; ContextEnv the context when
// --context does not.
const (
	Env        = "KUBELIFT_CONFIG"
	ContextEnv = "KUBELIFT_CONTEXT"
)

// maxSize bounds the file read: contexts are a few hundred bytes each.
const maxSize = 1 << 20

// Config is the file.
type Config struct {
	APIVersion     string    `json:"apiVersion"`
	Kind           string    `json:"kind"`
	CurrentContext string    `json:"currentContext,omitempty"`
	Contexts       []Context `json:"contexts"`
}

// Context is one cluster. Relative paths are relative to the file.
type Context struct {
	Name string `json:"name"`
	// Kubeconfig and KubeContext reach its API server.
	Kubeconfig  string   `json:"kubeconfig,omitempty"`
	KubeContext string   `json:"kubeContext,omitempty"`
	Registry    Registry `json:"registry,omitempty"`
	// Key is the team's public key bundles must be signed with.
	Key       string `json:"key,omitempty"`
	Inventory string `json:"inventory,omitempty"`
	SSH       SSH    `json:"ssh,omitempty"`
}

// Registry is the cluster's private registry. Its password is never
// here: CredentialHelper (docker-credential-NAME) gives user and
// password, else PasswordStdin reads it from stdin, else
// $KUBELIFT_REGISTRY_PASSWORD; without a Username the docker config's
// credentials are used.
type Registry struct {
	Domain           string `json:"domain,omitempty"`
	Namespace        string `json:"namespace,omitempty"`
	Username         string `json:"username,omitempty"`
	PasswordStdin    bool   `json:"passwordStdin,omitempty"`
	CredentialHelper string `json:"credentialHelper,omitempty"`
	CAFile           string `json:"caFile,omitempty"`
}

// SSH is how the nodes are reached where the inventory does not say.
type SSH struct {
	User       string `json:"user,omitempty"`
	Key        string `json:"key,omitempty"`
	KnownHosts string `json:"knownHosts,omitempty"`
	Port       int    `json:"port,omitempty"`
	Jump       string `json:"jump,omitempty"`
}

// DefaultPath is where the file is when neither --config nor
// $KUBELIFT_CONFIG names one: kubelift/config.yaml in the user's config
// directory ($XDG_CONFIG_HOME, else ~/.config).
func DefaultPath() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("the kubelift config's default place: %w", err)
	}
	return filepath.Join(dir, "kubelift", "config.yaml"), nil
}

// Path is the file: flag, else $KUBELIFT_CONFIG, else DefaultPath.
// explicit says whether the user named it (a missing file is then an
// error).
func Path(flag string, getenv func(string) string) (path string, explicit bool, err error) {
	if flag != "" {
		return flag, true, nil
	}
	if p := getenv(Env); p != "" {
		return p, true, nil
	}
	p, err := DefaultPath()
	return p, false, err
}

// Load reads and checks the file at path. A missing file is an empty
// config.
func Load(path string) (*Config, error) {
	data, err := readBounded(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Config{APIVersion: APIVersion, Kind: Kind}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kubelift config %s: %w", path, err)
	}
	return Parse(path, data)
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxSize {
		return nil, fmt.Errorf("more than %d bytes", maxSize)
	}
	return data, nil
}

// Parse checks data, the file at path: unknown keys and values that do
// not parse are refused, naming the file, the context and the key.
func Parse(path string, data []byte) (*Config, error) {
	c, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("kubelift config %s: %w", path, err)
	}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("kubelift config %s: %w", path, err)
	}
	return c, nil
}

// parse decodes strictly, a context at a time, so that an unknown key
// is named with its context.
func parse(data []byte) (*Config, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	var top struct {
		APIVersion     string            `json:"apiVersion"`
		Kind           string            `json:"kind"`
		CurrentContext string            `json:"currentContext,omitempty"`
		Contexts       []json.RawMessage `json:"contexts"`
	}
	if err := strict(js, &top); err != nil {
		return nil, err
	}
	c := &Config{APIVersion: top.APIVersion, Kind: top.Kind, CurrentContext: top.CurrentContext}
	for i, raw := range top.Contexts {
		var named struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(raw, &named)
		where := fmt.Sprintf("contexts[%d]", i)
		if named.Name != "" {
			where = "context " + named.Name
		}
		var x Context
		if err := strict(raw, &x); err != nil {
			if strings.Contains(err.Error(), `"password"`) {
				return nil, fmt.Errorf("%s: a registry password is never kept in it: use registry.credentialHelper, registry.passwordStdin, $KUBELIFT_REGISTRY_PASSWORD or the docker config", where)
			}
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		c.Contexts = append(c.Contexts, x)
	}
	return c, nil
}

func strict(js []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(js))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

var (
	nameRE   = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.@-]{0,62}$`)
	helperRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)
	// A repository path below the domain: lowercase components.
	namespaceRE = regexp.MustCompile(`^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$`)
	userRE      = regexp.MustCompile(`^[a-z_][a-z0-9_.-]{0,31}$`)
)

func (c *Config) check() error {
	if c.APIVersion != APIVersion || c.Kind != Kind {
		return fmt.Errorf("apiVersion %q, kind %q: want %s, %s", c.APIVersion, c.Kind, APIVersion, Kind)
	}
	seen := map[string]bool{}
	for i := range c.Contexts {
		x := &c.Contexts[i]
		if !nameRE.MatchString(x.Name) {
			return fmt.Errorf("contexts[%d]: name %q: want letters, digits and _.@- (at most 63)", i, x.Name)
		}
		if seen[x.Name] {
			return fmt.Errorf("context %s: named twice", x.Name)
		}
		seen[x.Name] = true
		if err := x.Check(); err != nil {
			return err
		}
	}
	if c.CurrentContext != "" && !seen[c.CurrentContext] {
		return fmt.Errorf("currentContext %q: no such context", c.CurrentContext)
	}
	return nil
}

// Check refuses a value of x that does not parse, naming the context
// and the key.
func (x *Context) Check() error {
	bad := func(key, value, want string) error {
		return fmt.Errorf("context %s: %s %q: %s", x.Name, key, value, want)
	}
	r := x.Registry
	if r.Domain != "" {
		if err := checkDomain(r.Domain); err != nil {
			return bad("registry.domain", r.Domain, err.Error())
		}
	}
	if r.Namespace != "" && !namespaceRE.MatchString(r.Namespace) {
		return bad("registry.namespace", r.Namespace, "want a repository path such as library or team/k8s")
	}
	if strings.ContainsAny(r.Username, ":\n\r\x00") {
		return bad("registry.username", r.Username, "a user name has no ':' or control characters")
	}
	if r.CredentialHelper != "" {
		if !helperRE.MatchString(r.CredentialHelper) {
			return bad("registry.credentialHelper", r.CredentialHelper, "want the NAME of a docker-credential-NAME program")
		}
		if r.Username != "" || r.PasswordStdin {
			return fmt.Errorf("context %s: registry.credentialHelper gives the user and password: no registry.username or registry.passwordStdin beside it", x.Name)
		}
	}
	if r.PasswordStdin && r.Username == "" {
		return fmt.Errorf("context %s: registry.passwordStdin needs registry.username", x.Name)
	}
	for key, p := range map[string]string{"kubeconfig": x.Kubeconfig, "registry.caFile": r.CAFile, "key": x.Key, "inventory": x.Inventory, "ssh.key": x.SSH.Key, "ssh.knownHosts": x.SSH.KnownHosts} {
		if strings.ContainsAny(p, "\n\r\x00") {
			return bad(key, p, "a path has no control characters")
		}
	}
	if strings.ContainsAny(x.KubeContext, "\n\r\x00") {
		return bad("kubeContext", x.KubeContext, "no control characters")
	}
	if x.SSH.User != "" && !userRE.MatchString(x.SSH.User) {
		return bad("ssh.user", x.SSH.User, "want a user name (lowercase letters, digits, _.-)")
	}
	if x.SSH.Port < 0 || x.SSH.Port > 65535 {
		return bad("ssh.port", strconv.Itoa(x.SSH.Port), "want 1 to 65535")
	}
	if x.SSH.Jump != "" {
		if err := checkJump(x.SSH.Jump); err != nil {
			return bad("ssh.jump", x.SSH.Jump, err.Error())
		}
	}
	return nil
}

// checkDomain takes host[:port].
func checkDomain(d string) error {
	host, port := d, ""
	if h, p, err := net.SplitHostPort(d); err == nil {
		host, port = h, p
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %q: want 1 to 65535", port)
		}
	}
	if net.ParseIP(host) != nil {
		return nil
	}
	if host == "" || len(host) > 253 || !hostRE.MatchString(host) {
		return errors.New("want host[:port], e.g. registry.corp:5000")
	}
	return nil
}

var hostRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*$`)

// checkJump takes [user@]host[:port].
func checkJump(j string) error {
	if u, rest, ok := strings.Cut(j, "@"); ok {
		if !userRE.MatchString(u) {
			return fmt.Errorf("user %q: want a user name", u)
		}
		j = rest
	}
	if err := checkDomain(j); err != nil {
		return errors.New("want [user@]host[:port]")
	}
	return nil
}

// Context returns the named context; "" is the current one (nil, nil
// when there is none).
func (c *Config) Context(name string) (*Context, error) {
	if name == "" {
		name = c.CurrentContext
		if name == "" {
			return nil, nil
		}
	}
	for i := range c.Contexts {
		if c.Contexts[i].Name == name {
			return &c.Contexts[i], nil
		}
	}
	return nil, fmt.Errorf("no context %q (upgrade config get-contexts lists them)", name)
}

// Set adds x, or replaces the context of its name.
func (c *Config) Set(x Context) {
	for i := range c.Contexts {
		if c.Contexts[i].Name == x.Name {
			c.Contexts[i] = x
			return
		}
	}
	c.Contexts = append(c.Contexts, x)
}

// Delete removes the named context; the current one is then none.
func (c *Config) Delete(name string) error {
	i := slices.IndexFunc(c.Contexts, func(x Context) bool { return x.Name == name })
	if i < 0 {
		return fmt.Errorf("no context %q", name)
	}
	c.Contexts = slices.Delete(c.Contexts, i, i+1)
	if c.CurrentContext == name {
		c.CurrentContext = ""
	}
	return nil
}

// Save checks c and writes it to path atomically, readable by the user
// only.
func (c *Config) Save(path string) error {
	c.APIVersion, c.Kind = APIVersion, Kind
	if err := c.check(); err != nil {
		return fmt.Errorf("kubelift config %s: %w", path, err)
	}
	data, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("kubelift config %s: %w", path, err)
	}
	if err := atomicfile.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("kubelift config %s: %w", path, err)
	}
	return nil
}
