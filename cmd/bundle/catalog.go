package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cli"
)

func newCmdCatalog(s *cli.IO) *cobra.Command {
	var file, output string
	cmd := &cobra.Command{
		Use:   "catalog [--catalog FILE]",
		Short: "List the Kubernetes versions the catalog knows, and check a catalog file",
		Long: `Catalog loads and validates the version catalog (the built-in one, or FILE)
and lists its versions with their upgrade sources, kubelet hash era and
the node stack 'bundle create --node-stack' carries. A catalog with a
problem is reported with the file, version and field.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := cli.OutputFlag(output)
			if err != nil {
				return err
			}
			c, err := catalog.Load(file)
			if err != nil {
				return err
			}
			if asJSON {
				return cli.PrintJSON(s.Out, c)
			}
			tw := tabwriter.NewWriter(s.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tUPGRADE FROM\tDOWNGRADE TO\tHASH ERA\tIMAGES\tFILES\tNODE STACK")
			for _, r := range c.Versions {
				v := r.Version
				if r.Withdrawn {
					v += " (withdrawn)"
				}
				stack := []string{}
				for _, p := range r.NodeStack {
					stack = append(stack, p.Name+" "+p.Version)
				}
				if len(stack) == 0 {
					stack = append(stack, "-")
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", v, strings.Join(r.UpgradeFrom, ","), strings.Join(r.DowngradeTo, ","), r.KubeletHashEra, len(r.Images), len(r.Files), strings.Join(stack, ", "))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&file, "catalog", "", "catalog file (default: built in)")
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: text or json")
	return cmd
}
