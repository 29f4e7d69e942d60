package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/config"
)

const twoContexts = `apiVersion: kubelift.io/v1alpha1
kind: Config
currentContext: prod
contexts:
- name: prod
  kubeconfig: kc/prod.yaml
  kubeContext: prod-admin
  registry:
    domain: reg.prod:5000
    namespace: library
    username: admin
    passwordStdin: true
    caFile: /etc/kubelift/ca.crt
  key: team.pub
  inventory: ~/inv.yaml
  ssh:
    user: ops
    key: id_ed25519
    port: 2222
- name: staging
  kubeconfig: /srv/staging.kubeconfig
  registry:
    domain: 10.0.0.1:5000
    credentialHelper: vault
`

// rootWith is the root over a plan, an import and an apply that keep
// their options, with the environment env (KUBECONFIG and
// KUBELIFT_INVENTORY are set for real: the flags read them too).
func rootWith(t *testing.T, env map[string]string, plan **planOptions, imp **importOptions, apply **applyOptions) func(args ...string) (string, error) {
	t.Helper()
	for _, k := range []string{"KUBECONFIG", cli.InventoryEnv, config.Env, config.ContextEnv, "HOME"} {
		v, ok := env[k]
		if !ok && k == "HOME" {
			continue
		}
		t.Setenv(k, v)
	}
	return func(args ...string) (string, error) {
		out := &bytes.Buffer{}
		s := &cli.IO{In: strings.NewReader("pw\n"), Out: out, ErrOut: &bytes.Buffer{}}
		root := newRoot(s, os.Getenv, func(cf *configFlags) []*cobra.Command {
			return []*cobra.Command{
				newCmdPlan(s, func(_ context.Context, o *planOptions) error { *plan = o; return nil }),
				newCmdImport(s, func(_ context.Context, o *importOptions) error { *imp = o; return nil }),
				newCmdApply(s, func(_ context.Context, o *applyOptions) error { *apply = o; return nil }),
				newCmdConfig(s, cf),
			}
		})
		root.SetArgs(args)
		root.SetOut(out)
		root.SetErr(&bytes.Buffer{})
		err := root.ExecuteContext(context.Background())
		return out.String(), err
	}
}

func writeConfig(t *testing.T, body string) (dir, path string) {
	t.Helper()
	dir = t.TempDir()
	path = filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, path
}

// A flag beats the environment, which beats the context, which beats
// the flag's default; --context beats $KUBELIFT_CONTEXT, which beats
// the file's current context.
func TestContextPrecedence(t *testing.T) {
	dir, path := writeConfig(t, twoContexts)
	home := t.TempDir()
	var plan *planOptions
	var imp *importOptions
	var apply *applyOptions

	run := rootWith(t, map[string]string{config.Env: path, "HOME": home}, &plan, &imp, &apply)
	if _, err := run("plan", "--to", "v1.31.4"); err != nil {
		t.Fatal(err)
	}
	if plan.Cluster.Kubeconfig != filepath.Join(dir, "kc/prod.yaml") || plan.Cluster.KubeContext != "prod-admin" ||
		plan.Registry.Domain != "reg.prod:5000" || plan.Registry.Username != "admin" || !plan.Registry.PasswordStdin ||
		plan.Registry.CAFile != "/etc/kubelift/ca.crt" || plan.Cluster.Trust.KeyFile != filepath.Join(dir, "team.pub") ||
		plan.Nodes.Inventory != filepath.Join(home, "inv.yaml") || plan.Nodes.User != "ops" || plan.Nodes.IdentityFile != filepath.Join(dir, "id_ed25519") ||
		plan.Nodes.Port != 2222 {
		t.Errorf("context prod gave plan %+v %+v %+v %+v", plan.Cluster, plan.Registry, plan.Nodes, plan.Cluster.Trust)
	}
	// The flag beats the context.
	if _, err := run("plan", "--to", "v1.31.4", "--domain", "flag.reg:5000", "--ssh-port", "22"); err != nil {
		t.Fatal(err)
	}
	// ... and never mixes with its group's values: another registry takes
	// none of the context's registry (user, CA).
	if plan.Registry.Domain != "flag.reg:5000" || plan.Nodes.Port != 22 || plan.Registry.Username != "" || plan.Registry.CAFile != "" ||
		plan.Nodes.User != "ops" {
		t.Errorf("flags over context prod: %+v %+v", plan.Registry, plan.Nodes)
	}
	// Another cluster typed takes none of the context's cluster or node
	// values (its inventory names prod's nodes); a typed credential none
	// of its credentials.
	if _, err := run("plan", "--to", "v1.31.4", "--kubeconfig", "/srv/other.kubeconfig", "--password", "pw", "--username", "ci"); err != nil {
		t.Fatal(err)
	}
	if plan.Cluster.Kubeconfig != "/srv/other.kubeconfig" || plan.Cluster.KubeContext != "" || plan.Nodes.Inventory != "" || plan.Nodes.User != "" || plan.Nodes.Port != 0 ||
		plan.Registry.Username != "ci" || plan.Registry.PasswordStdin || plan.Registry.Domain != "reg.prod:5000" || plan.Cluster.Trust.KeyFile != filepath.Join(dir, "team.pub") {
		t.Errorf("another cluster and user typed over context prod: %+v %+v %+v", plan.Cluster, plan.Registry, plan.Nodes)
	}
	// --context, and the file named by --config.
	if _, err := run("--context", "staging", "plan", "--to", "v1.31.4"); err != nil {
		t.Fatal(err)
	}
	if plan.Registry.Domain != "10.0.0.1:5000" || plan.Registry.CredentialHelper != "vault" || plan.Registry.Username != "" || plan.Nodes.Port != 0 ||
		plan.Cluster.Trust.KeyFile != "" {
		t.Errorf("context staging gave %+v %+v", plan.Registry, plan.Nodes)
	}
	// No context at all: the defaults.
	_, empty := writeConfig(t, "apiVersion: kubelift.io/v1alpha1\nkind: Config\ncontexts: []\n")
	if _, err := run("--config", empty, "plan", "--to", "v1.31.4"); err != nil {
		t.Fatal(err)
	}
	if plan.Registry.Domain != "" || plan.Nodes.Port != 0 || plan.Cluster.Kubeconfig != "" {
		t.Errorf("no context gave %+v %+v", plan.Registry, plan.Nodes)
	}

	// The environment beats the file's current context: KUBECONFIG (none
	// of the context's cluster and nodes then), KUBELIFT_INVENTORY.
	run = rootWith(t, map[string]string{config.Env: path, "HOME": home, "KUBECONFIG": "/env/kubeconfig", cli.InventoryEnv: "/env/inv.yaml"}, &plan, &imp, &apply)
	if _, err := run("plan", "--to", "v1.31.4"); err != nil {
		t.Fatal(err)
	}
	if plan.Cluster.Kubeconfig != "" || plan.Cluster.KubeContext != "" || plan.Nodes.Inventory != "/env/inv.yaml" || plan.Nodes.User != "" ||
		plan.Registry.Domain != "reg.prod:5000" {
		t.Errorf("environment over context prod: kubeconfig %q, context %q, inventory %q, ssh user %q, domain %q",
			plan.Cluster.Kubeconfig, plan.Cluster.KubeContext, plan.Nodes.Inventory, plan.Nodes.User, plan.Registry.Domain)
	}
	// The password in the environment beats the context's stdin.
	t.Setenv(cli.PasswordEnv, "from-env")
	if _, err := run("--context", "prod", "plan", "--to", "v1.31.4"); err != nil {
		t.Fatal(err)
	}
	if plan.Registry.PasswordStdin || plan.Registry.Username != "admin" {
		t.Errorf("KUBELIFT_REGISTRY_PASSWORD over the context's passwordStdin: %+v", plan.Registry)
	}
	// A context named (--context, KUBELIFT_CONTEXT) picks its own
	// cluster, as kubectl --context does, whatever KUBECONFIG says.
	if _, err := run("--context", "prod", "plan", "--to", "v1.31.4"); err != nil {
		t.Fatal(err)
	}
	if plan.Cluster.Kubeconfig != filepath.Join(dir, "kc/prod.yaml") || plan.Cluster.KubeContext != "prod-admin" || plan.Nodes.User != "ops" {
		t.Errorf("--context prod with KUBECONFIG set: kubeconfig %q, context %q, ssh user %q", plan.Cluster.Kubeconfig, plan.Cluster.KubeContext, plan.Nodes.User)
	}
	t.Setenv(config.ContextEnv, "staging")
	if _, err := run("plan", "--to", "v1.31.4"); err != nil {
		t.Fatal(err)
	}
	if plan.Registry.Domain != "10.0.0.1:5000" || plan.Cluster.Kubeconfig != "/srv/staging.kubeconfig" {
		t.Errorf("KUBELIFT_CONTEXT=staging gave domain %q, kubeconfig %q", plan.Registry.Domain, plan.Cluster.Kubeconfig)
	}
	if _, err := run("--context", "prod", "plan", "--to", "v1.31.4"); err != nil || plan.Registry.Domain != "reg.prod:5000" {
		t.Errorf("--context prod over KUBELIFT_CONTEXT=staging: domain %q, %v", plan.Registry.Domain, err)
	}
	t.Setenv(config.ContextEnv, "")
}

// What a context gives is not typed: apply --in-cluster, which refuses
// a typed --key, takes a context with one; import stages the nodes of a
// context that says how to reach them.
func TestContextIsNotTyped(t *testing.T) {
	_, path := writeConfig(t, twoContexts)
	var plan *planOptions
	var imp *importOptions
	var apply *applyOptions
	run := rootWith(t, map[string]string{config.Env: path, "HOME": t.TempDir()}, &plan, &imp, &apply)
	if _, err := run("apply", "--to", "v1.31.4", "--in-cluster"); err != nil {
		t.Fatalf("apply --in-cluster with context prod: %v", err)
	}
	if _, err := run("apply", "--to", "v1.31.4", "--in-cluster", "--key", "x.pub"); err == nil || !strings.Contains(err.Error(), "--key with --in-cluster") {
		t.Errorf("a typed --key with --in-cluster: %v", err)
	}
	if _, err := run("import", "b.tar"); err != nil {
		t.Fatal(err)
	}
	if !imp.Stage || imp.Registry.Domain != "reg.prod:5000" || imp.Namespace != "library" {
		t.Errorf("import with context prod: stage %v, registry %+v, namespace %q", imp.Stage, imp.Registry, imp.Namespace)
	}
}

// A file that does not parse is refused, naming the file, the context
// and the key; so is a context or a file that is not there.
func TestContextFileRefused(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{strings.Replace(twoContexts, "reg.prod:5000", "reg prod", 1), `context prod: registry.domain "reg prod"`},
		{strings.Replace(twoContexts, "port: 2222", "port: 70000", 1), `context prod: ssh.port "70000"`},
		{strings.Replace(twoContexts, "user: ops", "user: \"ops;rm\"", 1), `context prod: ssh.user "ops;rm"`},
		{strings.Replace(twoContexts, "namespace: library", "namespace: Lib", 1), `context prod: registry.namespace "Lib"`},
		{strings.Replace(twoContexts, "credentialHelper: vault", "credentialHelper: ../x", 1), `context staging: registry.credentialHelper "../x"`},
		{strings.Replace(twoContexts, "    username: admin\n", "    username: admin\n    password: hunter2\n", 1), "a registry password is never kept in it"},
		{strings.Replace(twoContexts, "  kubeContext: prod-admin\n", "  kubeContxt: prod-admin\n", 1), `context prod: unknown field "kubeContxt"`},
		{strings.Replace(twoContexts, "currentContext: prod", "currentContext: dev", 1), `currentContext "dev": no such context`},
		{strings.Replace(twoContexts, "name: staging", "name: prod", 1), "context prod: named twice"},
		{strings.Replace(twoContexts, "kind: Config", "kind: Inventory", 1), `kind "Inventory"`},
		{strings.Replace(twoContexts, "port: 2222", "port: many", 1), "port"},
	} {
		_, path := writeConfig(t, tc.body)
		var plan *planOptions
		var imp *importOptions
		var apply *applyOptions
		run := rootWith(t, map[string]string{config.Env: path}, &plan, &imp, &apply)
		_, err := run("plan", "--to", "v1.31.4")
		if err == nil || !strings.Contains(err.Error(), "kubelift config "+path) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error naming %s and %q, got %v", path, tc.want, err)
		}
		if strings.Contains(tc.body, "hunter2") && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("the error shows the password: %v", err)
		}
		if plan != nil {
			t.Errorf("plan ran on a bad config")
		}
	}
	_, path := writeConfig(t, twoContexts)
	var plan *planOptions
	var imp *importOptions
	var apply *applyOptions
	run := rootWith(t, map[string]string{config.Env: path}, &plan, &imp, &apply)
	if _, err := run("--context", "dev", "plan", "--to", "v1.31.4"); err == nil || !strings.Contains(err.Error(), `no context "dev"`) {
		t.Errorf("--context dev: %v", err)
	}
	if _, err := run("--config", filepath.Join(t.TempDir(), "none.yaml"), "plan", "--to", "v1.31.4"); err == nil || !strings.Contains(err.Error(), "none.yaml") {
		t.Errorf("--config of a missing file: %v", err)
	}
}

// set-context, use-context, get-contexts and view, as kubectl's; the
// file is the user's alone, and no password is ever written or shown.
func TestConfigCommands(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubelift", "config.yaml")
	var plan *planOptions
	var imp *importOptions
	var apply *applyOptions
	run := rootWith(t, map[string]string{config.Env: path, "KUBELIFT_REGISTRY_PASSWORD": "hunter2"}, &plan, &imp, &apply)
	t.Setenv(cli.PasswordEnv, "hunter2")
	if _, err := run("config", "set-context", "prod", "--domain", "reg.prod:5000", "--username", "admin", "--password", "hunter2"); err == nil ||
		!strings.Contains(err.Error(), "never kept") {
		t.Errorf("set-context --password: %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("a refused set-context wrote the file: %v", err)
	}
	out, err := run("config", "set-context", "prod", "--domain", "reg.prod:5000", "--username", "admin", "--key", "team.pub", "--ssh-port", "2222")
	if err != nil || !strings.Contains(out, "context prod set in "+path+" (current)") {
		t.Fatalf("set-context prod: %q %v", out, err)
	}
	if _, err := run("config", "set-context", "staging", "--domain", "bad domain"); err == nil || !strings.Contains(err.Error(), `context staging: registry.domain "bad domain"`) {
		t.Errorf("set-context with a bad domain: %v", err)
	}
	if _, err := run("config", "set-context", "staging", "--domain", "10.0.0.1:5000"); err != nil {
		t.Fatal(err)
	}
	// A second set-context keeps the values it is not given.
	if _, err := run("config", "set-context", "prod", "--inventory", "nodes.yaml"); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the file's mode: %v %v", fi.Mode(), err)
	}
	out, err = run("config", "get-contexts")
	if err != nil || !strings.Contains(out, "*        prod") || !strings.Contains(out, "reg.prod:5000") || !strings.Contains(out, "nodes.yaml") ||
		!strings.Contains(out, "staging") {
		t.Errorf("get-contexts: %q %v", out, err)
	}
	if out, err = run("config", "use-context", "staging"); err != nil || out != "switched to context staging\n" {
		t.Errorf("use-context: %q %v", out, err)
	}
	if out, err = run("config", "current-context"); err != nil || out != "staging\n" {
		t.Errorf("current-context: %q %v", out, err)
	}
	if _, err = run("config", "use-context", "dev"); err == nil || !strings.Contains(err.Error(), `no context "dev"`) {
		t.Errorf("use-context dev: %v", err)
	}
	for _, o := range []string{"text", "json"} {
		out, err = run("config", "view", "-o", o)
		if err != nil || !strings.Contains(out, "reg.prod:5000") || !strings.Contains(out, "2222") || strings.Contains(out, "hunter2") {
			t.Errorf("view -o %s: %q %v", o, out, err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil || strings.Contains(string(data), "hunter2") {
		t.Errorf("the file: %q %v", data, err)
	}
	// The prod context gives plan what it holds.
	if _, err := run("--context", "prod", "plan", "--to", "v1.31.4"); err != nil {
		t.Fatal(err)
	}
	inv, _ := filepath.Abs("nodes.yaml")
	if plan.Registry.Domain != "reg.prod:5000" || plan.Nodes.Port != 2222 || plan.Nodes.Inventory != inv {
		t.Errorf("plan from context prod: %+v %+v", plan.Registry, plan.Nodes)
	}
	if _, err := run("config", "delete-context", "staging"); err != nil {
		t.Fatal(err)
	}
	if _, err = run("config", "current-context"); err == nil || !strings.Contains(err.Error(), "no current context") {
		t.Errorf("current-context after deleting it: %v", err)
	}
}

// --all-contexts reads every context's cluster and says, in its row,
// why one could not be read; the command then fails.
func TestAllContexts(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kc.yaml")
	// A cluster nobody listens for.
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, path := writeConfig(t, "apiVersion: kubelift.io/v1alpha1\nkind: Config\ncontexts:\n- name: dead\n  kubeconfig: "+kc+"\n- name: nokube\n  kubeContext: none\n- name: registryonly\n  registry: {domain: reg.corp}\n")
	t.Setenv(config.Env, path)
	t.Setenv("KUBECONFIG", kc)
	for _, mk := range []func(*cli.IO) *cobra.Command{
		func(s *cli.IO) *cobra.Command { return newCmdStatus(s, nil) },
		func(s *cli.IO) *cobra.Command { return newCmdVersions(s, nil) },
	} {
		out := &bytes.Buffer{}
		s := &cli.IO{In: strings.NewReader(""), Out: out, ErrOut: &bytes.Buffer{}}
		root := newRoot(s, os.Getenv, func(*configFlags) []*cobra.Command { return []*cobra.Command{mk(s)} })
		name := mk(s).Name()
		root.SetArgs([]string{name, "--all-contexts"})
		root.SetOut(&bytes.Buffer{})
		root.SetErr(&bytes.Buffer{})
		err := root.ExecuteContext(context.Background())
		if err == nil || !strings.Contains(err.Error(), "3 of 3 clusters could not be read") {
			t.Errorf("%s --all-contexts: %v", name, err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 4 || !strings.HasPrefix(lines[1], "dead ") || !strings.Contains(lines[1], "127.0.0.1:1") ||
			!strings.HasPrefix(lines[2], "nokube ") || !strings.Contains(lines[2], `context "none" does not exist`) ||
			!strings.HasPrefix(lines[3], "registryonly ") || !strings.Contains(lines[3], "names no cluster") {
			t.Errorf("%s --all-contexts printed\n%s", name, out)
		}
	}
}

// A process with no home (an agent's or the controller's pod) reads no
// config rather than failing.
func TestNoHomeNoConfig(t *testing.T) {
	var plan *planOptions
	var imp *importOptions
	var apply *applyOptions
	run := rootWith(t, map[string]string{"HOME": ""}, &plan, &imp, &apply)
	t.Setenv("XDG_CONFIG_HOME", "")
	if _, err := run("plan", "--to", "v1.31.4"); err != nil || plan.Registry.Domain != "" {
		t.Errorf("plan with no home: %v", err)
	}
	if _, err := run("config", "set-context", "x", "--domain", "reg.corp"); err == nil || !strings.Contains(err.Error(), "HOME") {
		t.Errorf("set-context with no home and no --config: %v", err)
	}
}
