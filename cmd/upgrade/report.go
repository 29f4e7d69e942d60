package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/atomicfile"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/report"
)

type reportOptions struct {
	IO         *cli.IO
	Kube       kubeFlags
	Trust      cli.TrustOptions
	KubeClient func() (kubernetes.Interface, error)
	Output     string
	File       string
	// Availability is a prober's result to include.
	Availability string
	Now          func() time.Time
}

func newCmdReport(s *cli.IO, runF func(context.Context, *reportOptions) error) *cobra.Command {
	opts := &reportOptions{IO: s, Now: time.Now}
	opts.KubeClient = opts.Kube.client
	cmd := &cobra.Command{
		Use:   "report [-o html|markdown|json] [--file FILE]",
		Short: "Write the upgrade's report: plan, timeline per node, versions, restarts, bundle",
		Long: `Report writes, for the change ticket, what the cluster's record says of its
last upgrade: the plan's findings and how each was dealt with, every node's
steps as a timeline (per-node bars, the control plane's move to each release
marked), the versions before and after per node (kubelet, runtime, the parts
the run moved), the containers kept and restarted per node as verify counted
them, and the bundle it came from (digest, signer, every image and file by
digest, verified with --key). --availability adds a prober's result (the JSON
of kubelift's test prober, as make demo writes it).

The HTML page (the default) is one file that opens in a browser with no
network: its CSS and its chart (SVG) are inline. -o markdown suits a ticket
that takes text; -o json is the data.`,
		Example: `  upgrade report --file upgrade-v1.31.4.html
  upgrade report -o markdown > upgrade.md
  upgrade report -o json | jq '.nodes[] | {name, took, containers}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch opts.Output {
			case "", "html", "markdown", "md", "json":
			default:
				return cli.Usagef("--output %q: want html, markdown or json", opts.Output)
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return reportRun(cmd.Context(), opts)
		},
	}
	opts.Kube.addFlags(cmd)
	opts.Trust.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVarP(&opts.Output, "output", "o", "html", "html (one self-contained page), markdown or json")
	f.StringVarP(&opts.File, "file", "f", "", "write it to FILE (atomically) instead of standard output")
	f.StringVar(&opts.Availability, "availability", "", "a prober's result (JSON) to include as the availability table")
	return cmd
}

func reportRun(ctx context.Context, opts *reportOptions) error {
	var avail *report.Availability
	if opts.Availability != "" {
		f, err := os.Open(opts.Availability)
		if err != nil {
			return fmt.Errorf("--availability: %w", err)
		}
		avail, err = report.ReadAvailability(opts.Availability, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	trust, err := opts.Trust.Trust()
	if err != nil {
		return err
	}
	client, err := opts.KubeClient()
	if err != nil {
		return err
	}
	u, err := record.Read(ctx, client)
	if err != nil {
		return err
	}
	if u == nil {
		return fmt.Errorf("no upgrade has run in this cluster (configmap kube-system/%s): nothing to report", record.Name)
	}
	if u.TimelineError != "" {
		return errors.New(u.TimelineError)
	}
	rel, err := release.Load(ctx, client, u.To, trust)
	if err != nil {
		return fmt.Errorf("the release of the upgrade, %s: %w", u.To, err)
	}
	if rel.Record.BundleDigest != u.Bundle && u.Bundle != "" {
		fmt.Fprintf(opts.IO.ErrOut, "warning: the upgrade ran from bundle %s; the cluster's newest import of %s that verifies is %s, which the report shows\n", u.Bundle, u.To, rel.Record.BundleDigest)
	}
	nodes, err := cluster.ListNodes(ctx, client)
	if err != nil {
		return err
	}
	r := report.Build(u, nodes, rel, avail, opts.Now())
	var b bytes.Buffer
	switch opts.Output {
	case "json":
		err = cli.PrintJSON(&b, r)
	case "markdown", "md":
		err = r.Markdown(&b)
	default:
		err = r.HTML(&b)
	}
	if err != nil {
		return err
	}
	if opts.File == "" {
		_, err = opts.IO.Out.Write(b.Bytes())
		return err
	}
	if err := atomicfile.WriteFile(opts.File, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("--file %s: %w", opts.File, err)
	}
	fmt.Fprintf(opts.IO.ErrOut, "wrote %s: the upgrade %s -> %s (%s), %d nodes\n", opts.File, u.From, u.To, u.State, len(r.Nodes))
	return nil
}
