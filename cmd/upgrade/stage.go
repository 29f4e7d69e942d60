package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/registry"
)

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
			if opts.Bundle != "" && opts.Path.Via == viaAgent {
				return cli.Usagef("--via agent with a bundle FILE: through agents, nodes pull their files from the registry (stage --to VERSION)")
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
	var access registry.Access
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
		if access, err = registryAccess(opts.IO.In, &opts.Registry, target); err != nil {
			return err
		}
		source = stage.RegistrySource{Access: access}
	}
	steps, err := opts.Cluster.stepClient(opts.Path.AgentQPS)
	if err != nil {
		return err
	}
	res, err := stageNodes(ctx, opts.IO, client, steps, &opts.Nodes, target, source, opts.StageDir, opts.CacheDir, opts.Path, access, opts.Registry.Domain, opts.Quiet)
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

// stageNodes stages target on every node of the cluster, reached over
// SSH or, with --via agent, through agents (acc and domain reach the
// registry their image is in).
func stageNodes(ctx context.Context, s *cli.IO, client, steps kubernetes.Interface, nf *cli.NodeFlags, target *release.Release, source stage.Source,
	stageDir, cacheDir string, path stagePath, acc registry.Access, domain string, quiet bool) (_ *stage.Result, err error) {
	r, err := reachForRelease(ctx, path.Via, nf, client, steps, target, acc, domain, "")
	if err != nil {
		return nil, err
	}
	defer r.stop(ctx, &err)
	sink, finish := s.Progress(quiet, "staging")
	defer finish()
	return inplace.StageCluster(ctx, client, r.Inventory, stage.Options{Release: target, Source: source, Connector: r.Connector,
		Parallel: nf.Parallel, StageDir: stageDir, CacheDir: cacheDir, Via: path.stageVia(), Codec: path.Codec, NodeCredentials: path.NodeCredentials, Progress: sink, Log: s.Logger(quiet)})
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
