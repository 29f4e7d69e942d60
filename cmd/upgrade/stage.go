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
func (f *clusterFlags) target(ctx context.Context, c kubernetes.Interface) (*inplace.Target, error) {
	if f.To == "" {
		return nil, cli.Usagef("--to VERSION is required")
	}
	trust, err := f.Trust.Trust()
	if err != nil {
		return nil, err
	}
	return inplace.LoadTarget(ctx, c, f.To, trust)
}

// registryAccess reaches the record's registry unless --domain names another.
func registryAccess(in io.Reader, rf *cli.RegistryFlags, t *inplace.Target) (registry.Access, error) {
	if rf.Domain == "" && t.Record != nil {
		rf.Domain = t.Record.Registry
	}
	if rf.Domain == "" {
		return registry.Access{}, nil
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
	Output   string
	Quiet    bool
}

func newCmdStage(s *cli.IO, runF func(context.Context, *stageOptions) error) *cobra.Command {
	opts := &stageOptions{IO: s}
	cmd := &cobra.Command{
		Use:   "stage --to VERSION --key PUB [FILE] [flags]",
		Short: "Put a version's binaries on every node, ready for the swap",
		Long: `Stage copies each node's binaries of the version (every node: kubelet,
kube-proxy, kubectl; control-plane nodes also kube-apiserver,
kube-controller-manager, kube-scheduler) to STAGE-DIR/VERSION/ on it, over
SSH. Nothing running is touched: apply later swaps them in by rename.

The files come from the private registry, where import pushed them as OCI
artifacts (the cluster record names them, and its signed bundle.json is
verified with --key first), or from a bundle FILE (for registries that
refuse artifacts). Each file is fetched and checked against its signed
sha256 once, compressed once, sent compressed to every node that lacks it,
checked again on the node, and renamed into place. A file already there
with the right sha256 is not sent: a second stage sends nothing.

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
	cmd.Flags().StringVarP(&opts.Output, "output", "o", "", "output format: text or json")
	cmd.Flags().BoolVarP(&opts.Quiet, "quiet", "q", false, "no progress on stderr")
	return cmd
}

func addStageFlags(cmd *cobra.Command, stageDir, cacheDir *string) {
	cmd.Flags().StringVar(stageDir, "stage-dir", inplace.DefaultStageDir, "where binaries are staged on the nodes (VERSION/NAME below it)")
	cmd.Flags().StringVar(cacheDir, "cache-dir", cli.DefaultCacheDir(), "where fetched and compressed files are kept on this machine")
}

func stageRun(ctx context.Context, opts *stageOptions) error {
	asJSON, err := cli.OutputFlag(opts.Output)
	if err != nil {
		return err
	}
	client, err := opts.Cluster.client()
	if err != nil {
		return err
	}
	var target *inplace.Target
	var source inplace.Source
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
		if target, err = inplace.TargetFromBundle(v.Manifest); err != nil {
			return err
		}
		if opts.Cluster.To != "" && opts.Cluster.To != target.Version.String() {
			return cli.Usagef("--to %s, but %s holds %s", opts.Cluster.To, opts.Bundle, target.Version)
		}
		source = inplace.BundleSource{Bundle: v}
	} else {
		if target, err = opts.Cluster.target(ctx, client); err != nil {
			return err
		}
		access, err := registryAccess(opts.IO.In, &opts.Registry, target)
		if err != nil {
			return err
		}
		source = inplace.RegistrySource{Access: access}
	}
	res, err := stage(ctx, opts.IO, client, &opts.Nodes, target, source, opts.StageDir, opts.CacheDir, opts.Quiet)
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
func stage(ctx context.Context, s *cli.IO, client kubernetes.Interface, nf *cli.NodeFlags, target *inplace.Target, source inplace.Source,
	stageDir, cacheDir string, quiet bool) (*inplace.StageResult, error) {
	inv, dialer, err := nf.Access()
	if err != nil {
		return nil, err
	}
	return inplace.StageCluster(ctx, client, inv, inplace.StageOptions{Target: target, Source: source, Connector: dialer,
		Parallel: nf.Parallel, StageDir: stageDir, CacheDir: cacheDir, Log: s.Logger(quiet)})
}

func printStage(w io.Writer, res *inplace.StageResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSENT\tALREADY STAGED\tBYTES SENT\tERROR")
	for _, n := range res.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Node, orDash(strings.Join(n.Sent, ",")), orDash(strings.Join(n.Present, ",")), bundle.HumanBytes(n.BytesSent), n.Error)
	}
	tw.Flush()
	sent, size := res.BytesSent()
	failed := 0
	for _, n := range res.Nodes {
		if n.Error != "" {
			failed++
		}
	}
	fmt.Fprintf(w, "staged %s on %d of %d nodes in %s: sent %s (files %s uncompressed) (%s)\n", res.Version, len(res.Nodes)-failed, len(res.Nodes),
		res.Dir+"/"+res.Version, bundle.HumanBytes(sent), bundle.HumanBytes(size), res.Took)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
