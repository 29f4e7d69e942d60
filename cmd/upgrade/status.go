package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/upgradeapi"
)

type statusOptions struct {
	IO   *cli.IO
	Kube kubeFlags
	// KubeClient makes the API client (from Kube unless a test sets it).
	KubeClient func() (kubernetes.Interface, error)
	// Dynamic makes the client of Upgrades (nil: none are read).
	Dynamic func() (dynamic.Interface, error)
	Output  string
	// AllContexts shows every cluster of the kubelift config.
	AllContexts bool
	// Watch follows the upgrade until it ends; Timeout bounds that.
	Watch   bool
	Timeout time.Duration
	// To is the version the watched upgrade goes to (others are waited
	// past).
	To    string
	Quiet bool
}

func newCmdStatus(s *cli.IO, runF func(context.Context, *statusOptions) error) *cobra.Command {
	opts := &statusOptions{IO: s}
	opts.KubeClient = opts.Kube.client
	opts.Dynamic = opts.Kube.dynamic
	cmd := &cobra.Command{
		Use:   "status [-w] [-o json]",
		Short: "Show the upgrade's state and every node's, with versions read live",
		Long: `Status shows the upgrade recorded in kube-system/kubelift-upgrade (from, to,
state, last error, etcd backup) and, per node, its part of the upgrade with
the kubelet version the Node reports now (StarlingX's kube-upgrade-show and
kube-host-upgrade-list). Where the controller is installed, it first lists the
cluster's Upgrades (kubelift.dev) with their phase and progress.

With --watch (-w) it follows the upgrade from the cluster as it happens, from
any machine: a line per node step (from the record's timeline) and per Event
kubelift posts, a bar of the nodes done on a terminal, and it exits with the
upgrade's outcome: 0 when complete, 1 when it failed (naming the node, step
and error) or was rolled back. A watch begun late shows every step from the
upgrade's start; one begun after the end shows it all and exits at once.
With -o json it prints one JSON object per change, a line each.`,
		Example: `  upgrade status
  upgrade status -w                       # while apply runs elsewhere (or the controller)
  upgrade status -w -o json | jq -c 'select(.kind=="step")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := cli.OutputFlag(opts.Output); err != nil {
				return err
			}
			if opts.AllContexts && opts.Watch {
				return cli.Usagef("--all-contexts and --watch exclude each other: watch one cluster (--context NAME)")
			}
			if opts.AllContexts {
				return fleetRun(cmd.Context(), cmd, opts.IO, opts.Output, &opts.Kube)
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return statusRun(cmd.Context(), opts)
		},
	}
	opts.Kube.addFlags(cmd)
	allContextsFlag(cmd, &opts.AllContexts)
	cmd.Flags().StringVarP(&opts.Output, "output", "o", "", "output format: text or json (with --watch: a JSON object per change, a line each)")
	cmd.Flags().BoolVarP(&opts.Watch, "watch", "w", false, "follow the upgrade until it ends, a line per node step; exit 0 when it completes, 1 when it fails")
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", 0, "with --watch: give up after this long (exit 1; 0: never)")
	cmd.Flags().StringVar(&opts.To, "to", "", "with --watch: follow the upgrade to this version, waiting past a record of another (after apply --in-cluster --detach, before the controller begins)")
	cmd.Flags().BoolVarP(&opts.Quiet, "quiet", "q", false, "with --watch: no progress bar")
	return cmd
}

func statusRun(ctx context.Context, opts *statusOptions) error {
	asJSON, err := cli.OutputFlag(opts.Output)
	if err != nil {
		return err
	}
	if opts.Watch {
		return watchRun(ctx, opts, asJSON)
	}
	client, err := opts.KubeClient()
	if err != nil {
		return err
	}
	st, err := record.ReadStatus(ctx, client)
	if err != nil {
		return err
	}
	ups, err := opts.upgrades(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		out := struct {
			*record.Status
			Upgrades []*upgradeapi.Upgrade `json:"upgrades,omitempty"`
		}{st, ups}
		return cli.PrintJSON(opts.IO.Out, out)
	}
	if len(ups) > 0 {
		printUpgrades(opts.IO.Out, ups)
		fmt.Fprintln(opts.IO.Out)
	}
	if st == nil {
		fmt.Fprintln(opts.IO.Out, "no upgrade has run in this cluster")
		return nil
	}
	apiServer := st.APIServer
	if st.APIServerErr != "" {
		apiServer = "unknown (" + st.APIServerErr + ")"
	}
	printState(opts.IO.Out, st.Upgrade, st.Kubelets, apiServer)
	return nil
}

// upgrades lists the cluster's Upgrades; none where the resource is not
// installed.
func (opts *statusOptions) upgrades(ctx context.Context) ([]*upgradeapi.Upgrade, error) {
	if opts.Dynamic == nil {
		return nil, nil
	}
	dyn, err := opts.Dynamic()
	if err != nil {
		return nil, err
	}
	ups, err := upgradeapi.Client{Dynamic: dyn}.List(ctx)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil // not installed
	case apierrors.IsForbidden(err):
		fmt.Fprintf(opts.IO.ErrOut, "warning: the Upgrades (kubelift.dev) are not shown: %v\n", err)
		return nil, nil
	}
	return ups, err
}

func printUpgrades(w io.Writer, ups []*upgradeapi.Upgrade) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "UPGRADE\tVERSION\tPHASE\tPROGRESS\tNODE\tMESSAGE")
	for _, u := range ups {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", u.Name, u.Spec.Version, orDash(u.Status.Phase), orDash(u.Status.Progress), orDash(u.Status.Current), u.Status.Message)
	}
	tw.Flush()
}

func printState(w io.Writer, st *record.Upgrade, live map[string]string, apiServer string) {
	kind := ""
	if st.ControlPlane != "" {
		kind = " (" + st.ControlPlane + " control plane)"
	}
	fmt.Fprintf(w, "upgrade %s -> %s%s: %s (updated %s)\n", st.From, st.To, kind, st.State, st.Updated.Format(time.RFC3339))
	if len(st.Hops) > 0 {
		fmt.Fprintf(w, "the control plane passes through %s; kubelets go straight to %s\n", strings.Join(st.Hops, ", "), st.To)
	}
	if apiServer != "" {
		fmt.Fprintf(w, "API server: %s\n", apiServer)
	}
	if st.Backup != "" {
		fmt.Fprintf(w, "etcd snapshot: %s\n", st.Backup)
	}
	if st.LastError != "" {
		fmt.Fprintf(w, "last error: %s\n", st.LastError)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tSTATUS\tKUBELET\tSTEP\tERROR")
	for _, n := range st.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Role, n.Status, orDash(live[n.Name]), orDash(n.Step), n.LastError)
	}
	tw.Flush()
}
