package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// Setting is one value a context gives a flag.
type Setting struct {
	// Key is where it is in the file (registry.domain), Flag the flag it
	// sets (domain).
	Key, Flag, Value string
	// Env, when set, is the variable that overrides the context.
	Env string
}

// Settings are x's values as flags, paths made absolute against dir
// (the file's directory) and ~ expanded.
func (x *Context) Settings(dir string) []Setting {
	path := func(p string) string { return absPath(dir, p) }
	all := []Setting{
		{Key: "kubeconfig", Flag: "kubeconfig", Value: path(x.Kubeconfig), Env: "KUBECONFIG"},
		{Key: "kubeContext", Flag: "kube-context", Value: x.KubeContext},
		{Key: "registry.domain", Flag: "domain", Value: x.Registry.Domain},
		{Key: "registry.namespace", Flag: "namespace", Value: x.Registry.Namespace},
		{Key: "registry.username", Flag: "username", Value: x.Registry.Username},
		{Key: "registry.credentialHelper", Flag: "credential-helper", Value: x.Registry.CredentialHelper},
		{Key: "registry.caFile", Flag: "ca-file", Value: path(x.Registry.CAFile)},
		{Key: "key", Flag: "key", Value: path(x.Key)},
		{Key: "inventory", Flag: "inventory", Value: path(x.Inventory), Env: "KUBELIFT_INVENTORY"},
		{Key: "ssh.user", Flag: "ssh-user", Value: x.SSH.User},
		{Key: "ssh.key", Flag: "ssh-key", Value: path(x.SSH.Key)},
		{Key: "ssh.knownHosts", Flag: "known-hosts", Value: path(x.SSH.KnownHosts)},
		{Key: "ssh.jump", Flag: "ssh-jump", Value: x.SSH.Jump},
	}
	if x.Registry.PasswordStdin {
		all = append(all, Setting{Key: "registry.passwordStdin", Flag: "password-stdin", Value: "true", Env: "KUBELIFT_REGISTRY_PASSWORD"})
	}
	if x.SSH.Port != 0 {
		all = append(all, Setting{Key: "ssh.port", Flag: "ssh-port", Value: strconv.Itoa(x.SSH.Port)})
	}
	var out []Setting
	for _, s := range all {
		if s.Value != "" {
			out = append(out, s)
		}
	}
	return out
}

func absPath(dir, p string) string {
	switch {
	case p == "":
		return ""
	case p == "~" || strings.HasPrefix(p, "~/"):
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, p[1:])
		}
		return p
	case filepath.IsAbs(p):
		return p
	}
	return filepath.Join(dir, p)
}

// AnnotationFromContext marks a flag whose value a context gave: the
// value is the context's name.
const AnnotationFromContext = "kubelift.io/from-context"

// The groups of a context's values that go together: a cluster and how
// its nodes are reached; a registry and its credentials.
var (
	clusterGroup    = []string{"kubeconfig", "kube-context", "inventory", "ssh-user", "ssh-key", "known-hosts", "ssh-port", "ssh-jump"}
	registryGroup   = []string{"domain", "namespace", "username", "password-stdin", "credential-helper", "ca-file"}
	credentialGroup = []string{"username", "password-stdin", "credential-helper"}
	credentialFlags = []string{"username", "password", "password-stdin", "credential-helper"}
)

// Apply gives fs's flags the context's values where the command line
// did not set them and no environment variable overrides them (flag >
// environment > context > default). A flag the command lacks is left
// out: each command takes what it needs. Changed stays false, so a
// command can still tell what was typed.
//
// Values that go together are never mixed with another's: where the
// cluster is chosen otherwise (--kubeconfig or --kube-context typed, or
// KUBECONFIG set, other than the context's), none of the context's
// cluster and node values apply (its inventory would name another
// cluster's nodes); where --domain is typed, none of its registry
// values; where a credential is typed, none of its credentials.
//
// named says the context was named (--context, $KUBELIFT_CONTEXT), not
// the file's current one: its cluster then beats KUBECONFIG, as
// kubectl's --context picks its cluster whatever KUBECONFIG's current
// context is.
func Apply(fs *pflag.FlagSet, x *Context, dir string, named bool, getenv func(string) string) ([]Setting, error) {
	typed := func(names ...string) bool {
		for _, n := range names {
			if fl := fs.Lookup(n); fl != nil && fl.Changed {
				return true
			}
		}
		return false
	}
	skip := map[string]bool{}
	settings := x.Settings(dir)
	own := ""
	for _, st := range settings {
		if st.Flag == "kubeconfig" {
			own = st.Value
		}
	}
	envCluster := getenv("KUBECONFIG") != "" && getenv("KUBECONFIG") != own && !named
	if typed("kubeconfig", "kube-context") || envCluster {
		for _, n := range clusterGroup {
			skip[n] = true
		}
	}
	if typed("domain") {
		for _, n := range registryGroup {
			skip[n] = true
		}
	}
	if typed(credentialFlags...) {
		for _, n := range credentialGroup {
			skip[n] = true
		}
	}
	var applied []Setting
	for _, s := range settings {
		fl := fs.Lookup(s.Flag)
		overridden := s.Env != "" && getenv(s.Env) != "" && !(named && s.Flag == "kubeconfig")
		if fl == nil || fl.Changed || skip[s.Flag] || overridden {
			continue
		}
		if err := fl.Value.Set(s.Value); err != nil {
			return nil, fmt.Errorf("context %s: %s %q: %w", x.Name, s.Key, s.Value, err)
		}
		if fl.Annotations == nil {
			fl.Annotations = map[string][]string{}
		}
		fl.Annotations[AnnotationFromContext] = []string{x.Name}
		applied = append(applied, s)
	}
	return applied, nil
}

// FromContext says whether a context gave the flag its value.
func FromContext(fs *pflag.FlagSet, name string) bool {
	fl := fs.Lookup(name)
	return fl != nil && len(fl.Annotations[AnnotationFromContext]) > 0
}
