package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/fleet"
)

// allContextsFlag registers --all-contexts.
func allContextsFlag(cmd *cobra.Command, v *bool) {
	cmd.Flags().BoolVar(v, "all-contexts", false, "every cluster of the kubelift config in one table: the version its API server and kubelets run, its upgrade's target, state and last run ('upgrade config')")
}

// fleetRun is --all-contexts: every context's cluster, read at once.
func fleetRun(ctx context.Context, cmd *cobra.Command, s *cli.IO, output string, kube *kubeFlags) error {
	asJSON, err := cli.OutputFlag(output)
	if err != nil {
		return err
	}
	cf := &configFlags{getenv: os.Getenv}
	if f := cmd.Flag("config"); f != nil {
		cf.File = f.Value.String()
	}
	path, c, err := cf.load()
	if err != nil {
		return err
	}
	if len(c.Contexts) == 0 {
		return fmt.Errorf("kubelift config %s: no contexts ('upgrade config set-context NAME --kubeconfig ...')", path)
	}
	var names []string
	for _, x := range c.Contexts {
		names = append(names, x.Name)
	}
	rows := fleet.Survey(ctx, names, func(name string) (kubernetes.Interface, error) {
		x, err := c.Context(name)
		if err != nil {
			return nil, err
		}
		if x.Kubeconfig == "" && x.KubeContext == "" {
			// KUBECONFIG's cluster would be shown under its name.
			return nil, fmt.Errorf("context %s names no cluster: upgrade config set-context %s --kubeconfig FILE", name, name)
		}
		kf := kubeFlags{KubeContext: x.KubeContext, QPS: kube.QPS, Burst: kube.Burst}
		for _, st := range x.Settings(filepath.Dir(path)) {
			if st.Flag == "kubeconfig" {
				kf.Kubeconfig = st.Value
			}
		}
		cfg, err := kf.config()
		if err != nil {
			return nil, err
		}
		cfg.Timeout = fleet.Timeout // discovery's request too
		return kubernetes.NewForConfig(cfg)
	})
	failed := 0
	for _, r := range rows {
		if r.Error != "" {
			failed++
		}
	}
	if asJSON {
		if err := cli.PrintJSON(s.Out, rows); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(s.Out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CONTEXT\tAPISERVER\tKUBELETS\tNODES\tTARGET\tSTATE\tLAST RUN\tERROR")
		for _, r := range rows {
			last := "-"
			if !r.LastRun.IsZero() {
				last = r.LastRun.UTC().Format(time.RFC3339)
			}
			state := r.State
			if state == "" && r.Error == "" {
				state = "no upgrade"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.Context, orDash(r.APIServer), orDash(r.Kubelets), r.Nodes, orDash(r.Target), orDash(state), last, r.Error)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d clusters could not be read (the ERROR column)", failed, len(rows))
	}
	return nil
}
