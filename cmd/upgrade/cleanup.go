package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/compat"
	"github.com/kubelift/kubelift/internal/inplace/release"
)

type cleanupOptions struct {
	IO          *cli.IO
	Kube        kubeFlags
	Nodes       cli.NodeFlags
	Agent       agentFlags
	CatalogFile string
	DryRun      bool
	Output      string
	StageDir    string
}

func newCmdCompatCleanup(s *cli.IO, runF func(context.Context, *cleanupOptions) error) *cobra.Command {
	opts := &cleanupOptions{IO: s}
	cmd := &cobra.Command{
		Use:   "cleanup [ssh flags] [--dry-run] [-o json]",
		Short: "Remove the hash-skip file from every node that no longer needs it",
		Long: `Cleanup reads, on every node over SSH, the running containers and the hashes
their kubelets recorded, and removes the hash-skip file where every one
equals what the node's kubelet computes for the container's spec: then no
container depends on the skip any more, and the kubelet behaves exactly as
upstream (a spec change is acted on again). Where containers started by the
old kubelet still run, the file stays and the count says how many.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := cli.OutputFlag(opts.Output); err != nil {
				return err
			}
			if err := opts.Agent.check(); err != nil {
				return err
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return cleanupRun(cmd.Context(), opts)
		},
	}
	opts.Kube.addFlags(cmd)
	opts.Nodes.AddFlags(cmd)
	opts.Agent.addFlags(cmd)
	cmd.Flags().StringVar(&opts.CatalogFile, "catalog", "", "version catalog file (default: the built-in one)")
	cmd.Flags().BoolVar(&opts.DryRun, "dry-run", false, "say where the file would go; remove nothing")
	cmd.Flags().StringVar(&opts.StageDir, "stage-dir", release.DefaultStageDir, "where binaries are staged on the nodes (as given to stage and apply)")
	cmd.Flags().StringVarP(&opts.Output, "output", "o", "", "output format: text or json")
	return cmd
}

func cleanupRun(ctx context.Context, opts *cleanupOptions) (err error) {
	asJSON, err := cli.OutputFlag(opts.Output)
	if err != nil {
		return err
	}
	cat, err := catalog.Load(opts.CatalogFile)
	if err != nil {
		return err
	}
	client, err := opts.Kube.client()
	if err != nil {
		return err
	}
	steps, err := opts.Kube.stepClient(opts.Agent.QPS)
	if err != nil {
		return err
	}
	r, err := opts.Agent.reach(ctx, client, steps, &opts.Nodes, "")
	if err != nil {
		return err
	}
	defer r.stop(ctx, &err)
	res, err := inplace.Cleanup(ctx, compat.CleanupOptions{Client: client, Catalog: cat, Connector: r.Connector, Inventory: r.Inventory,
		Parallel: opts.Nodes.Parallel, StageDir: opts.StageDir, DryRun: opts.DryRun})
	if asJSON {
		if perr := cli.PrintJSON(opts.IO.Out, res); perr != nil {
			return perr
		}
		return err
	}
	tw := tabwriter.NewWriter(opts.IO.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tHASH-SKIP FILE\tCONTAINERS\tWITH THE OLD KUBELET'S HASH\tREMOVED\tERROR")
	for _, n := range res {
		fmt.Fprintf(tw, "%s\t%v\t%d\t%d\t%v\t%s\n", n.Node, n.File, n.Containers, n.Old, n.Removed, n.Error)
	}
	tw.Flush()
	for _, n := range res {
		if n.DryRun != "" {
			fmt.Fprintf(opts.IO.Out, "dry run: would run on %s: %s\n", n.Node, n.DryRun)
		}
	}
	return err
}
