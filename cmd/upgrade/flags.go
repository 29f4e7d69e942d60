package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/registry"
)

// The flags several commands share: the cluster and its API server, the
// version and the key that verifies it, how nodes are staged, the health
// window and the workload gate.

// kubeFlags reach the API server, at a bounded request rate.
type kubeFlags struct {
	Kubeconfig  string
	KubeContext string
	QPS         float32
	Burst       int
}

func (f *kubeFlags) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.Kubeconfig, "kubeconfig", "", "the cluster (default: KUBECONFIG, or in-cluster)")
	kubeContextFlag(cmd, &f.KubeContext)
	cmd.Flags().Float32Var(&f.QPS, "kube-qps", 50, "API requests per second at most (client-go's default is 5)")
	cmd.Flags().IntVar(&f.Burst, "kube-burst", 100, "API requests in a burst at most")
}

func kubeContextFlag(cmd *cobra.Command, v *string) {
	cmd.Flags().StringVar(v, "kube-context", "", "the kubeconfig's context to use (default: its current one)")
}

// config is the REST config with kubelift's user agent and rate.
func (f *kubeFlags) config() (*rest.Config, error) {
	cfg, err := cluster.Config(f.Kubeconfig, f.KubeContext)
	if err != nil {
		return nil, err
	}
	cfg.UserAgent, cfg.QPS, cfg.Burst = "kubelift", f.QPS, f.Burst
	// One limiter for every client made from this configuration (the
	// typed and dynamic clients, /readyz probes), so --kube-qps bounds
	// them all.
	cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(f.QPS, f.Burst)
	return cfg, nil
}

// stepClient is the client agent mode goes through (its step requests,
// and the agents' pods and namespace): the same API server and user
// agent, at a rate of its own (--agent-qps, burst twice it; 0 is the
// flag's default). A node step is one request through an agent where it
// is an SSH command otherwise: at 1000 nodes and a window of 100 the
// steps alone need more than --kube-qps's default, and sharing it
// slowed the engine's own requests (docs/scale.md).
func (f *kubeFlags) stepClient(qps float32) (kubernetes.Interface, error) {
	cfg, err := f.stepConfig(qps)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

func (f *kubeFlags) stepConfig(qps float32) (*rest.Config, error) {
	cfg, err := f.config()
	if err != nil {
		return nil, err
	}
	if qps <= 0 {
		qps = defaultAgentQPS
	}
	cfg.QPS, cfg.Burst = qps, max(1, int(2*qps))
	cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	return cfg, nil
}

const defaultAgentQPS, maxAgentQPS = 100, 100000

// agentQPSFlag is --agent-qps, beside --via.
func agentQPSFlag(cmd *cobra.Command, qps *float32) {
	cmd.Flags().Float32Var(qps, "agent-qps", defaultAgentQPS, "with --via agent: API requests per second at most for agent mode (a node step is one; also the agents' pods), a budget of its own beside --kube-qps (0: 100)")
}

// clients makes the API clients: typed and dynamic (Upgrades, CRDs).
func (f *kubeFlags) clients() (kubernetes.Interface, dynamic.Interface, error) {
	cfg, err := f.config()
	if err != nil {
		return nil, nil, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	return kube, dyn, err
}

// dynamic makes the dynamic API client (Upgrades).
func (f *kubeFlags) dynamic() (dynamic.Interface, error) {
	_, dyn, err := f.clients()
	return dyn, err
}

func (f *kubeFlags) client() (kubernetes.Interface, error) {
	cfg, err := f.config()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// clusterFlags name the cluster and the version to work on.
type clusterFlags struct {
	kubeFlags
	To    string
	Trust cli.TrustOptions
	// Bundle, when set, is the digest of the imported bundle To must
	// come from (an Upgrade's spec.bundle).
	Bundle string
}

func (f *clusterFlags) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.To, "to", "", "the Kubernetes version to upgrade to (imported with --upgrade / import)")
	f.Trust.AddFlags(cmd)
	f.kubeFlags.addFlags(cmd)
}

// target loads the version's cluster record, verified with --key.
func (f *clusterFlags) target(ctx context.Context, c kubernetes.Interface) (*release.Release, error) {
	if f.To == "" {
		return nil, cli.Usagef("--to VERSION is required")
	}
	trust, err := f.Trust.Trust()
	if err != nil {
		return nil, err
	}
	t, err := release.Load(ctx, c, f.To, trust)
	if err == nil && f.Bundle != "" && t.Record.BundleDigest != f.Bundle {
		return nil, fmt.Errorf("%s: the cluster's newest imported bundle of it that verifies is %s, not %s (import that bundle again)", f.To, t.Record.BundleDigest, f.Bundle)
	}
	return t, err
}

// registryAccess reaches the record's registry unless --domain names
// another; every artifact the record names must be in it.
func registryAccess(in io.Reader, rf *cli.RegistryFlags, t *release.Release) (registry.Access, error) {
	if rf.Domain == "" && t.Record != nil {
		rf.Domain = t.Record.Registry
	}
	if rf.Domain == "" {
		return registry.Access{}, nil
	}
	if err := t.CheckArtifacts(rf.Domain); err != nil {
		return registry.Access{}, err
	}
	return rf.Access(in)
}

// stagePath is how nodes get their files: --via, --codec and
// --node-credentials.
type stagePath struct {
	Via, Codec, NodeCredentials string
	AgentQPS                    float32
}

func (p *stagePath) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&p.Via, "via", stage.ViaAuto, "how nodes are reached and get their files: auto (over SSH; nodes that reach the private registry pull from it, the others are sent them over SSH), registry, ssh, or agent (no SSH: an agent the run starts on each node runs its steps, and nodes pull their files from the registry; docs/agent-mode.md)")
	nodeCredentialsFlag(cmd.Flags(), &p.NodeCredentials)
	agentQPSFlag(cmd, &p.AgentQPS)
	cmd.Flags().StringVar(&p.Codec, "codec", stage.CodecAuto, "how files sent over SSH are encoded: auto (the registry's zstd copies where the node has zstd, else zstd or gzip or none, whichever the first megabytes measure faster), zstd, gzip, or none")
}

func (p *stagePath) check() error {
	if err := stage.CheckChoice(p.stageVia(), p.Codec, p.NodeCredentials); err != nil {
		return cli.Usagef("%v", err)
	}
	return checkAgentQPS(p.AgentQPS)
}

func checkAgentQPS(qps float32) error {
	if !(qps >= 0 && qps <= maxAgentQPS) { // NaN too
		return cli.Usagef("--agent-qps %v: want requests per second, 0 (%d) to %d", qps, defaultAgentQPS, maxAgentQPS)
	}
	return nil
}

// stageVia is how staging gets files to the nodes: through agents, from
// the registry.
func (p *stagePath) stageVia() string {
	if p.Via == viaAgent {
		return stage.ViaRegistry
	}
	return p.Via
}

func addStageFlags(cmd *cobra.Command, stageDir, cacheDir *string) {
	cmd.Flags().StringVar(stageDir, "stage-dir", release.DefaultStageDir, "where binaries are staged on the nodes (VERSION/NAME below it)")
	cmd.Flags().StringVar(cacheDir, "cache-dir", cli.DefaultCacheDir(), "where fetched and compressed files are kept on this machine")
}

// addHealthWindowFlag adds --health-window: a health probe is judged over
// it, not on one answer.
func addHealthWindowFlag(f *pflag.FlagSet, d *time.Duration) {
	f.DurationVar(d, "health-window", 30*time.Second, "how long an API server's /readyz or a leader's lease may fail, probed with backoff, before the plan calls it unhealthy; how long each control-plane part must keep its process after a step; how long the workload gate waits after each node")
}

// addWorkloadGateFlag adds --no-workload-gate.
func addWorkloadGateFlag(f *pflag.FlagSet, off *bool) {
	f.BoolVar(off, "no-workload-gate", false, "do not hold each node to the workloads (Deployments, StatefulSets, DaemonSets) fully available before its swap being fully available again within --health-window")
}

// nodeCredentialsFlag registers --node-credentials.
func nodeCredentialsFlag(f *pflag.FlagSet, v *string) {
	f.StringVar(v, "node-credentials", stage.NodeTokens, "what nodes pulling from the registry are handed, on stdin: token (a pull-scoped token where the registry has a token service; nodes of a registry that takes only passwords are sent their files over SSH) or password (also this machine's registry password, which on an htpasswd registry can usually push too)")
}
