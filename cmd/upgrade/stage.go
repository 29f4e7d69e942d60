package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/registry"
)

// kubeFlags reach the API server, at a bounded request rate.
type kubeFlags struct {
	Kubeconfig string
	QPS        float32
	Burst      int
}

func (f *kubeFlags) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.Kubeconfig, "kubeconfig", "", "the cluster (default: KUBECONFIG, or in-cluster)")
	cmd.Flags().Float32Var(&f.QPS, "kube-qps", 50, "API requests per second at most (client-go's default is 5)")
	cmd.Flags().IntVar(&f.Burst, "kube-burst", 100, "API requests in a burst at most")
}

// config is the REST config with kubelift's user agent and rate.
func (f *kubeFlags) config() (*rest.Config, error) {
	cfg, err := cluster.Config(f.Kubeconfig)
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
	return release.Load(ctx, c, f.To, trust)
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

type stageOptions struct {
	IO       *cli.IO
	Cluster  clusterFlags
	Nodes    cli.NodeFlags
	Registry cli.RegistryFlags
	Bundle   string
	StageDir string
	CacheDir string
	Path     stagePath
	Output   string
	Quiet    bool
}

func newCmdStage(s *cli.IO, runF func(context.Context, *stageOptions) error) *cobra.Command {
	opts := &stageOptions{IO: s}
	cmd := &cobra.Command{
		Use:   "stage --to VERSION --key PUB [FILE] [flags]",
		Short: "Put a version's binaries on every node, ready for the swap",
		Long: `Stage puts each node's binaries of the version (every node: kubelet,
kube-proxy, kubectl; control-plane nodes also kube-apiserver,
kube-controller-manager, kube-scheduler) in STAGE-DIR/VERSION/ on it.
Nothing running is touched: apply later swaps them in by rename.

The files come from the private registry, where import pushed them as OCI
artifacts (the cluster record names them, and its signed bundle.json is
verified with --key first), or from a bundle FILE (for registries that
refuse artifacts).

How each node gets them (--via auto):
  registry  a node that reaches the registry (its curl, the CA its
            containerd trusts for it) pulls the files itself, the zstd
            copies import pushed where it has zstd: this machine sends it
            only the blob, the signed sha256 and, on stdin, a pull-scoped
            token (or, with --node-credentials password, the registry
            password of a registry that takes nothing else), so what it
            sends does not grow with the fleet;
  ssh       the others, or every node with --via ssh, are sent the files
            over SSH. --codec auto: where the node has zstd, the zstd
            copies import pushed are relayed as they are (nothing is
            encoded here); otherwise (a bundle FILE, a node without zstd)
            the first megabytes of the first file go as they are, and
            the link's rate is weighed against this machine's rate of
            encoding (zstd, else gzip): files are encoded, once for all
            nodes, only where that is faster.
Either way the node checks the size and signed sha256 before it renames
the file into place; a file already there is not moved (a second stage
moves nothing), and a file a stage cut off is gone on from, not sent
again. The table and -o json say each node's path, bytes and time.

Nodes come from the API (InternalIP, role from node-role labels); an
--inventory file overrides address, port and user per node or role. Host
keys are always checked against --known-hosts. An unreachable node is
named, the others are staged, and the exit code is 1.`,
		Example: `  upgrade stage --to v1.31.4 --key team.pub --ssh-key ~/.ssh/id_ed25519 --known-hosts known_hosts
  upgrade stage --to v1.31.4 --key team.pub k8s-v1.31.4-linux-amd64.run --inventory nodes.yaml`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				opts.Bundle = args[0]
			}
			if opts.Bundle == "" && opts.Cluster.To == "" {
				return cli.Usagef("--to VERSION is required (or a bundle FILE)")
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return stageRun(cmd.Context(), opts)
		},
	}
	opts.Cluster.addFlags(cmd)
	opts.Nodes.AddFlags(cmd)
	opts.Registry.AddFlags(cmd)
	addStageFlags(cmd, &opts.StageDir, &opts.CacheDir)
	opts.Path.addFlags(cmd)
	cmd.Flags().StringVarP(&opts.Output, "output", "o", "", "output format: text or json")
	cmd.Flags().BoolVarP(&opts.Quiet, "quiet", "q", false, "no progress on stderr")
	return cmd
}

// stagePath is how nodes get their files: --via, --codec and
// --node-credentials.
type stagePath struct{ Via, Codec, NodeCredentials string }

func (p *stagePath) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&p.Via, "via", stage.ViaAuto, "how nodes get their files: auto (nodes that reach the private registry pull from it, the others are sent them over SSH), registry, or ssh")
	cmd.Flags().StringVar(&p.NodeCredentials, "node-credentials", stage.NodeTokens, "what nodes pulling from the registry are handed, on stdin: token (a pull-scoped token where the registry has a token service; nodes of a registry that takes only passwords are sent their files over SSH) or password (also this machine's registry password, which on an htpasswd registry can usually push too)")
	cmd.Flags().StringVar(&p.Codec, "codec", stage.CodecAuto, "how files sent over SSH are encoded: auto (the registry's zstd copies where the node has zstd, else zstd or gzip or none, whichever the first megabytes measure faster), zstd, gzip, or none")
}

func (p *stagePath) check() error {
	if err := stage.CheckChoice(p.Via, p.Codec, p.NodeCredentials); err != nil {
		return cli.Usagef("%v", err)
	}
	return nil
}

func addStageFlags(cmd *cobra.Command, stageDir, cacheDir *string) {
	cmd.Flags().StringVar(stageDir, "stage-dir", release.DefaultStageDir, "where binaries are staged on the nodes (VERSION/NAME below it)")
	cmd.Flags().StringVar(cacheDir, "cache-dir", cli.DefaultCacheDir(), "where fetched and compressed files are kept on this machine")
}

func stageRun(ctx context.Context, opts *stageOptions) error {
	asJSON, err := cli.OutputFlag(opts.Output)
	if err != nil {
		return err
	}
	if err := opts.Path.check(); err != nil {
		return err
	}
	client, err := opts.Cluster.client()
	if err != nil {
		return err
	}
	var target *release.Release
	var source stage.Source
	if opts.Bundle != "" {
		trust, err := opts.Cluster.Trust.Trust()
		if err != nil {
			return err
		}
		v, err := bundle.Open(ctx, opts.Bundle, trust)
		if err != nil {
			return err
		}
		defer v.Close()
		if target, err = release.FromBundle(v.Manifest); err != nil {
			return err
		}
		if opts.Cluster.To != "" && opts.Cluster.To != target.Version.String() {
			return cli.Usagef("--to %s, but %s holds %s", opts.Cluster.To, opts.Bundle, target.Version)
		}
		source = stage.BundleSource{Bundle: v}
	} else {
		if target, err = opts.Cluster.target(ctx, client); err != nil {
			return err
		}
		access, err := registryAccess(opts.IO.In, &opts.Registry, target)
		if err != nil {
			return err
		}
		source = stage.RegistrySource{Access: access}
	}
	res, err := stageNodes(ctx, opts.IO, client, &opts.Nodes, target, source, opts.StageDir, opts.CacheDir, opts.Path, opts.Quiet)
	if res != nil {
		if asJSON {
			if perr := cli.PrintJSON(opts.IO.Out, res); perr != nil {
				return perr
			}
		} else {
			printStage(opts.IO.Out, res)
		}
	}
	return err
}

// stage stages target on every node of the cluster.
func stageNodes(ctx context.Context, s *cli.IO, client kubernetes.Interface, nf *cli.NodeFlags, target *release.Release, source stage.Source,
	stageDir, cacheDir string, path stagePath, quiet bool) (*stage.Result, error) {
	inv, dialer, err := nf.Access()
	if err != nil {
		return nil, err
	}
	sink, finish := s.Progress(quiet, "staging")
	defer finish()
	return inplace.StageCluster(ctx, client, inv, stage.Options{Release: target, Source: source, Connector: dialer,
		Parallel: nf.Parallel, StageDir: stageDir, CacheDir: cacheDir, Via: path.Via, Codec: path.Codec, NodeCredentials: path.NodeCredentials, Progress: sink, Log: s.Logger(quiet)})
}

func printStage(w io.Writer, res *stage.Result) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPATH\tSTAGED\tALREADY STAGED\tSENT BY SSH\tPULLED BY NODE\tTOOK\tERROR")
	for _, n := range res.Nodes {
		path := orDash(n.Path)
		if n.Path == stage.ViaSSH {
			path += " (" + n.Codec + ")"
		}
		if n.PathReason != "" {
			path += ": " + n.PathReason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.1fs\t%s\n", n.Node, path, orDash(strings.Join(n.Sent, ",")), orDash(strings.Join(n.Present, ",")),
			bundle.HumanBytes(n.BytesSent), bundle.HumanBytes(n.BytesPulled), n.Seconds, n.Error)
	}
	tw.Flush()
	for _, n := range res.Nodes {
		if n.CodecReason != "" {
			fmt.Fprintf(w, "%s: codec %s (%s)\n", n.Node, n.Codec, n.CodecReason)
		}
	}
	sent, size := res.BytesSent()
	failed := 0
	for _, n := range res.Nodes {
		if n.Error != "" {
			failed++
		}
	}
	var pulled int64
	for _, n := range res.Nodes {
		pulled += n.BytesPulled
	}
	fmt.Fprintf(w, "staged %s on %d of %d nodes in %s: this machine sent %s, the nodes pulled %s from the registry (files %s in all) (%s)\n", res.Version, len(res.Nodes)-failed, len(res.Nodes),
		res.Dir+"/"+res.Version, bundle.HumanBytes(sent), bundle.HumanBytes(pulled), bundle.HumanBytes(size), res.Took)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
