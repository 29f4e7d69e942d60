package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/config"
)

// configFlags are the root's --config and --context: which kubelift
// config file, and which of its contexts, gives the flags a command was
// not given.
type configFlags struct {
	File, Context string
	// getenv reads the environment (os.Getenv unless a test sets it).
	getenv func(string) string
}

func (f *configFlags) addFlags(root *cobra.Command) {
	root.PersistentFlags().StringVar(&f.File, "config", "", "the kubelift config file: contexts naming a cluster, its registry, key and nodes (default $"+config.Env+", else ~/.config/kubelift/config.yaml)")
	root.PersistentFlags().StringVar(&f.Context, "context", "", "the kubelift context to use (default $"+config.ContextEnv+", else the file's current context)")
}

// load reads the file (its path, the config). A file the user named
// (--config, $KUBELIFT_CONFIG) must be there, but for a command that
// writes it.
func (f *configFlags) load() (string, *config.Config, error) { return f.read(false) }

// loadToWrite reads the file a config command writes: it may be new.
func (f *configFlags) loadToWrite() (string, *config.Config, error) { return f.read(true) }

func (f *configFlags) read(mayCreate bool) (string, *config.Config, error) {
	path, explicit, err := config.Path(f.File, f.getenv)
	if err != nil && !mayCreate {
		// No home to look in (a pod's process, the agents' and the
		// controller's): no config, as where the file is not there.
		return "", &config.Config{}, nil
	}
	if err != nil {
		return "", nil, err
	}
	if explicit && !mayCreate {
		if _, err := os.Stat(path); err != nil {
			return "", nil, fmt.Errorf("kubelift config %s (--config or $%s): %w", path, config.Env, err)
		}
	}
	c, err := config.Load(path)
	return path, c, err
}

// contextName is --context, else $KUBELIFT_CONTEXT, else "" (the current).
func (f *configFlags) contextName() string {
	if f.Context != "" {
		return f.Context
	}
	return f.getenv(config.ContextEnv)
}

// current is the context in use: the one named, else c's current one.
func (f *configFlags) current(c *config.Config) string {
	if name := f.contextName(); name != "" {
		return name
	}
	return c.CurrentContext
}

// apply gives cmd's flags the context's values (flag > environment >
// context > default). Commands under 'config' take none.
func (f *configFlags) apply(cmd *cobra.Command) error {
	for c := cmd; c != nil; c = c.Parent() {
		if c.Name() == "config" && c.HasParent() {
			return nil
		}
	}
	path, c, err := f.load()
	if err != nil {
		return err
	}
	x, err := c.Context(f.contextName())
	if err != nil {
		return fmt.Errorf("kubelift config %s: %w", path, err)
	}
	if x == nil {
		return nil
	}
	_, err = config.Apply(cmd.Flags(), x, filepath.Dir(path), f.contextName() != "", f.getenv)
	return err
}

func newCmdConfig(s *cli.IO, cf *configFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Name clusters once: contexts with the kubeconfig, registry, key and nodes",
		Long: `A kubelift config holds contexts, as a kubeconfig does: per cluster its
kubeconfig (and context in it), its private registry (domain, namespace,
user, CA; never a password: a credential helper, the docker config, stdin or
$KUBELIFT_REGISTRY_PASSWORD gives it), the team's public key, the inventory
and SSH settings. Every command takes the current context's values for the
flags it was not given: a flag wins over the environment (KUBECONFIG,
KUBELIFT_INVENTORY), which wins over the context, which wins over the flag's
default. --context (or $KUBELIFT_CONTEXT) picks another context for one
command; --config (or $KUBELIFT_CONFIG) another file.`,
		Example: `  upgrade config set-context prod --kubeconfig ~/.kube/prod --domain registry.corp:5000 --namespace library \
      --username admin --password-stdin --ca-file ca.crt --key team.pub --inventory nodes.yaml --current
  echo "$PASS" | upgrade plan --to v1.31.4
  upgrade config get-contexts
  upgrade --context staging status`,
	}
	cmd.AddCommand(newCmdSetContext(s, cf), newCmdUseContext(s, cf), newCmdGetContexts(s, cf), newCmdCurrentContext(s, cf),
		newCmdDeleteContext(s, cf), newCmdConfigView(s, cf))
	return cmd
}

func newCmdSetContext(s *cli.IO, cf *configFlags) *cobra.Command {
	var x config.Context
	var current bool
	cmd := &cobra.Command{
		Use:   "set-context NAME [flags]",
		Short: "Add a context, or set some of its values",
		Long: `set-context adds the context NAME, or sets the values given on one that
exists (the others stay). Paths typed are made absolute (a path written in
the file by hand may be relative to the file, or start with ~/). A password is never written: --password is refused.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("password") {
				return cli.Usagef("--password: a password is never kept in the kubelift config: --credential-helper, --password-stdin (read when a command runs), $%s or the docker config", cli.PasswordEnv)
			}
			path, c, err := cf.loadToWrite()
			if err != nil {
				return err
			}
			old, err := c.Context(args[0])
			if err != nil {
				old = &config.Context{}
			}
			merged := mergeContext(cmd, *old, x)
			merged.Name = args[0]
			if err := merged.Check(); err != nil {
				return fmt.Errorf("kubelift config %s: %w", path, err)
			}
			c.Set(merged)
			if current || len(c.Contexts) == 1 {
				c.CurrentContext = merged.Name
			}
			if err := c.Save(path); err != nil {
				return err
			}
			fmt.Fprintf(s.Out, "context %s set in %s", merged.Name, path)
			if c.CurrentContext == merged.Name {
				fmt.Fprint(s.Out, " (current)")
			}
			fmt.Fprintln(s.Out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&x.Kubeconfig, "kubeconfig", "", "the cluster's kubeconfig")
	f.StringVar(&x.KubeContext, "kube-context", "", "the kubeconfig's context")
	f.StringVar(&x.Registry.Domain, "domain", "", "private registry host[:port]")
	f.StringVar(&x.Registry.Namespace, "namespace", "", "path below the domain, e.g. library")
	f.StringVar(&x.Registry.Username, "username", "", "registry user (its password: --password-stdin, $"+cli.PasswordEnv+")")
	f.BoolVar(&x.Registry.PasswordStdin, "password-stdin", false, "commands read the registry password from standard input")
	f.StringVar(&x.Registry.CredentialHelper, "credential-helper", "", "a docker credential helper NAME (docker-credential-NAME) gives user and password")
	f.StringVar(&x.Registry.CAFile, "ca-file", "", "PEM CA bundle that signed the registry's certificate")
	f.StringVar(&x.Key, "key", "", "the team's public key bundles must be signed with")
	f.StringVar(&x.Inventory, "inventory", "", "inventory file (nodes' addresses, ports, users)")
	f.StringVar(&x.SSH.User, "ssh-user", "", "SSH user")
	f.StringVar(&x.SSH.Key, "ssh-key", "", "private key file for SSH")
	f.StringVar(&x.SSH.KnownHosts, "known-hosts", "", "known_hosts file")
	f.IntVar(&x.SSH.Port, "ssh-port", 0, "SSH port")
	f.StringVar(&x.SSH.Jump, "ssh-jump", "", "jump host, [user@]host[:port]")
	f.String("password", "", "refused: a password is never kept in the file")
	_ = f.MarkHidden("password")
	f.BoolVar(&current, "current", false, "make it the current context (the file's first context is)")
	return cmd
}

// mergeContext sets on old the values of the flags given.
func mergeContext(cmd *cobra.Command, old, x config.Context) config.Context {
	set := func(flag string, dst *string, v string) {
		if cmd.Flags().Changed(flag) {
			*dst = v
		}
	}
	// A path typed is the one the user means where they typed it.
	path := func(flag string, dst *string, v string) {
		if abs, err := filepath.Abs(v); err == nil && v != "" && !strings.HasPrefix(v, "~") {
			v = abs
		}
		set(flag, dst, v)
	}
	path("kubeconfig", &old.Kubeconfig, x.Kubeconfig)
	set("kube-context", &old.KubeContext, x.KubeContext)
	set("domain", &old.Registry.Domain, x.Registry.Domain)
	set("namespace", &old.Registry.Namespace, x.Registry.Namespace)
	set("username", &old.Registry.Username, x.Registry.Username)
	set("credential-helper", &old.Registry.CredentialHelper, x.Registry.CredentialHelper)
	path("ca-file", &old.Registry.CAFile, x.Registry.CAFile)
	path("key", &old.Key, x.Key)
	path("inventory", &old.Inventory, x.Inventory)
	set("ssh-user", &old.SSH.User, x.SSH.User)
	path("ssh-key", &old.SSH.Key, x.SSH.Key)
	path("known-hosts", &old.SSH.KnownHosts, x.SSH.KnownHosts)
	set("ssh-jump", &old.SSH.Jump, x.SSH.Jump)
	if cmd.Flags().Changed("password-stdin") {
		old.Registry.PasswordStdin = x.Registry.PasswordStdin
	}
	if cmd.Flags().Changed("ssh-port") {
		old.SSH.Port = x.SSH.Port
	}
	return old
}

func newCmdUseContext(s *cli.IO, cf *configFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "use-context NAME",
		Short: "Make a context the current one",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, c, err := cf.load()
			if err != nil {
				return err
			}
			if _, err := c.Context(args[0]); err != nil {
				return fmt.Errorf("kubelift config %s: %w", path, err)
			}
			c.CurrentContext = args[0]
			if err := c.Save(path); err != nil {
				return err
			}
			fmt.Fprintf(s.Out, "switched to context %s\n", args[0])
			return nil
		},
	}
}

func newCmdDeleteContext(s *cli.IO, cf *configFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "delete-context NAME",
		Short: "Remove a context",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, c, err := cf.load()
			if err != nil {
				return err
			}
			if err := c.Delete(args[0]); err != nil {
				return fmt.Errorf("kubelift config %s: %w", path, err)
			}
			if err := c.Save(path); err != nil {
				return err
			}
			fmt.Fprintf(s.Out, "deleted context %s from %s\n", args[0], path)
			return nil
		},
	}
}

func newCmdCurrentContext(s *cli.IO, cf *configFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "current-context",
		Short: "Print the current context's name",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			path, c, err := cf.load()
			if err != nil {
				return err
			}
			name := cf.current(c)
			if name == "" {
				return fmt.Errorf("kubelift config %s: no current context ('upgrade config use-context NAME')", path)
			}
			fmt.Fprintln(s.Out, name)
			return nil
		},
	}
}

func newCmdGetContexts(s *cli.IO, cf *configFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get-contexts [-o json]",
		Short: "List the contexts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := cli.OutputFlag(output)
			if err != nil {
				return err
			}
			_, c, err := cf.load()
			if err != nil {
				return err
			}
			current := cf.current(c)
			if asJSON {
				return cli.PrintJSON(s.Out, struct {
					Current  string           `json:"current,omitempty"`
					Contexts []config.Context `json:"contexts"`
				}{current, c.Contexts})
			}
			tw := tabwriter.NewWriter(s.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "CURRENT\tNAME\tKUBECONFIG\tREGISTRY\tKEY\tINVENTORY")
			for _, x := range c.Contexts {
				mark := ""
				if x.Name == current {
					mark = "*"
				}
				reg := x.Registry.Domain
				if reg != "" && x.Registry.Namespace != "" {
					reg += "/" + x.Registry.Namespace
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", mark, x.Name, orDash(x.Kubeconfig), orDash(reg), orDash(x.Key), orDash(x.Inventory))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: text or json")
	return cmd
}

func newCmdConfigView(s *cli.IO, cf *configFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "view [-o json]",
		Short: "Print the config (it holds no password; a helper's name is shown, never what it gives)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := cli.OutputFlag(output)
			if err != nil {
				return err
			}
			_, c, err := cf.load()
			if err != nil {
				return err
			}
			if asJSON {
				return cli.PrintJSON(s.Out, c)
			}
			data, err := yaml.Marshal(c)
			if err != nil {
				return err
			}
			_, err = s.Out.Write(data)
			return err
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: text (YAML) or json")
	return cmd
}
