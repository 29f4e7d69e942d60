package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/inplace"
)

type versionsOptions struct {
	IO          *cli.IO
	Kube        kubeFlags
	CatalogFile string
	Output      string
}

func newCmdVersions(s *cli.IO) *cobra.Command {
	opts := &versionsOptions{IO: s}
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
			list, err := inplace.Versions(cmd.Context(), client, cat)
			if err != nil {
				return err
			}
			if asJSON {
				return cli.PrintJSON(opts.IO.Out, list)
			}
			printVersions(opts.IO.Out, list)
			return nil
		},
	}
	opts.Kube.addFlags(cmd)
	cmd.Flags().StringVar(&opts.CatalogFile, "catalog", "", "version catalog file (default: the built-in one)")
	cmd.Flags().StringVarP(&opts.Output, "output", "o", "", "output format: text or json")
	return cmd
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
