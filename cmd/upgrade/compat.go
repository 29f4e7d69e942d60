package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
)

func newCmdCompat(s *cli.IO) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "compat",
		Short: "Kubelet compatibility tools: container hashes across kubelet versions",
	}
	cmd.AddCommand(newCmdCompatHash(s, nil), newCmdCompatCleanup(s, nil))
	return cmd
}

type compatHashOptions struct {
	IO             *cli.IO
	KubeletVersion string
	File           string
	CatalogFile    string
	Output         string
}

func newCmdCompatHash(s *cli.IO, runF func(context.Context, *compatHashOptions) error) *cobra.Command {
	opts := &compatHashOptions{IO: s}
	cmd := &cobra.Command{
		Use:   "hash --kubelet-version V [-f FILE|-]",
		Short: "Print the container hash a kubelet version records for a container",
		Long: `Hash prints the value a kubelet of version V writes in the
io.kubernetes.container.hash annotation for each container (and
io.kubernetes.container.hashWithoutResources for 1.27 to 1.30 kubelets,
written with the InPlacePodVerticalScaling gate on). A running container
whose recorded value differs from what its kubelet computes is restarted
("Container X definition changed"): compare with
  crictl inspect CONTAINER | grep io.kubernetes.container.hash

Input (JSON or YAML, a file or - for stdin): a container, a list of
containers, or a Pod (e.g. kubectl get pod P -o yaml), whose init and
regular containers are hashed.`,
		Example: `  kubectl get pod web-0 -o yaml | upgrade compat hash --kubelet-version v1.31.4 -f -
  upgrade compat hash --kubelet-version v1.30.14 -f container.json -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.KubeletVersion == "" {
				return cli.Usagef("--kubelet-version is required")
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return compatHashRun(opts)
		},
	}
	cmd.Flags().StringVar(&opts.KubeletVersion, "kubelet-version", "", "kubelet version, e.g. v1.31.4")
	cmd.Flags().StringVarP(&opts.File, "filename", "f", "-", "container, container list or Pod (JSON or YAML); - for stdin")
	cmd.Flags().StringVar(&opts.CatalogFile, "catalog", "", "version catalog (its kubelet hash era table; default: built in)")
	cmd.Flags().StringVarP(&opts.Output, "output", "o", "", "output format: text or json")
	return cmd
}

type hashRow struct {
	Container            string `json:"container"`
	Init                 bool   `json:"init,omitempty"`
	Hash                 string `json:"hash"`
	HashWithoutResources string `json:"hashWithoutResources,omitempty"`
}

func compatHashRun(opts *compatHashOptions) error {
	asJSON, err := cli.OutputFlag(opts.Output)
	if err != nil {
		return err
	}
	cat, err := catalog.Load(opts.CatalogFile)
	if err != nil {
		return err
	}
	h, err := kubeletcompat.NewHasher(cat, opts.KubeletVersion)
	if err != nil {
		return err
	}
	var data []byte
	if opts.File == "-" {
		data, err = io.ReadAll(opts.IO.In)
	} else {
		data, err = os.ReadFile(opts.File)
	}
	if err != nil {
		return err
	}
	containers, err := kubeletcompat.ParseContainers(data)
	if err != nil {
		return fmt.Errorf("%s: %w", opts.File, err)
	}
	var rows []hashRow
	for _, nc := range containers {
		c := nc.Container
		hash, err := h.Hash(&c)
		if err != nil {
			return err
		}
		row := hashRow{Container: c.Name, Init: nc.Init, Hash: kubeletcompat.Label(hash)}
		if wr, ok, err := h.HashWithoutResources(&c); err != nil {
			return err
		} else if ok {
			row.HashWithoutResources = kubeletcompat.Label(wr)
		}
		rows = append(rows, row)
	}
	if asJSON {
		return cli.PrintJSON(opts.IO.Out, struct {
			KubeletVersion string    `json:"kubeletVersion"`
			Era            string    `json:"era"`
			Containers     []hashRow `json:"containers"`
		}{h.Version.String(), h.Era, rows})
	}
	tw := tabwriter.NewWriter(opts.IO.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "CONTAINER\tHASH (kubelet %s, era %s)\tWITHOUT RESOURCES\n", h.Version, h.Era)
	for _, r := range rows {
		name := r.Container
		if r.Init {
			name += " (init)"
		}
		wr := r.HashWithoutResources
		if wr == "" {
			wr = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", name, r.Hash, wr)
	}
	return tw.Flush()
}
