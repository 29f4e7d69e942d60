package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/inplace"
)

type versionsOptions struct {
	IO   *cli.IO
	Kube kubeFlags
	// KubeClient makes the API client (from Kube unless a test sets it).
	KubeClient  func() (kubernetes.Interface, error)
	CatalogFile string
	Output      string
	// AllContexts shows every cluster of the kubelift config.
	AllContexts bool
}

func newCmdVersions(s *cli.IO, runF func(context.Context, *versionsOptions) error) *cobra.Command {
	opts := &versionsOptions{IO: s}
	opts.KubeClient = opts.Kube.client
	cmd := &cobra.Command{
		Use:   "versions [-o json]",
		Short: "List Kubernetes versions and their state in this cluster",
		Long: `Versions lists the catalog's versions and those imported into the cluster,
each with its state computed now from what the nodes run:

  active       every node's kubelet and the API server run it
  partial      some nodes run it (an upgrade is under way or stopped)
  available    imported, and the catalog's rules allow upgrading (or a patch
               downgrade) to it from the API server's version
  imported     imported, but not reachable from here
  unavailable  in the catalog only: import its bundle first

TARGET marks the version the cluster is at, or heading for.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := cli.OutputFlag(opts.Output); err != nil {
				return err
			}
			if opts.AllContexts {
				return fleetRun(cmd.Context(), cmd, opts.IO, opts.Output, &opts.Kube)
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return versionsRun(cmd.Context(), opts)
		},
	}
	opts.Kube.addFlags(cmd)
	allContextsFlag(cmd, &opts.AllContexts)
	cmd.Flags().StringVar(&opts.CatalogFile, "catalog", "", "version catalog file (default: the built-in one)")
	cmd.Flags().StringVarP(&opts.Output, "output", "o", "", "output format: text or json")
	return cmd
}

func versionsRun(ctx context.Context, opts *versionsOptions) error {
	asJSON, err := cli.OutputFlag(opts.Output)
	if err != nil {
		return err
	}
	cat, err := catalog.Load(opts.CatalogFile)
	if err != nil {
		return err
	}
	client, err := opts.KubeClient()
	if err != nil {
		return err
	}
	list, err := inplace.Versions(ctx, client, cat)
	if err != nil {
		return err
	}
	if asJSON {
		return cli.PrintJSON(opts.IO.Out, list)
	}
	printVersions(opts.IO.Out, list)
	return nil
}

func printVersions(w io.Writer, list []inplace.VersionState) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tSTATE\tTARGET\tNODES\tIMPORTED")
	for _, v := range list {
		state := v.State
		if v.Withdrawn {
			state += " (withdrawn)"
		}
		target := ""
		if v.Target {
			target = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", v.Version, state, target, v.Nodes, orDash(v.Imported))
	}
	tw.Flush()
}
