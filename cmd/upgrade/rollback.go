package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/agent/access"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/upgradelock"
)

type rollbackOptions struct {
	IO           *cli.IO
	Kube         kubeFlags
	Nodes        cli.NodeFlags
	Agent        agentFlags
	CatalogFile  string
	BackupDir    string
	ReadyTimeout time.Duration
	HealthWindow time.Duration
	Quiet        bool
	DryRun       bool
}

func newCmdRollback(s *cli.IO, runF func(context.Context, *rollbackOptions) error) *cobra.Command {
	opts := &rollbackOptions{IO: s}
	cmd := &cobra.Command{
		Use:   "rollback [ssh flags]",
		Short: "Undo the recorded upgrade from the backups on the nodes, in reverse order",
		Long: `Rollback restores the binaries the recorded upgrade (kube-system/kubelift-upgrade)
replaced, from the backups apply left on each node (BACKUP-DIR/OLDVERSION/):
kubelets first (workers, then control-plane nodes, each waited for Ready at
the old version), then the control plane node by node (scheduler,
controller manager, API server). What already runs the old version is
skipped, so a rollback that stopped can be run again.

It is allowed while no API server runs the new version yet, or at any time
when the catalog lists the old version among the new one's patch
downgrades (same minor; StarlingX's downgrade_to). Otherwise it is refused,
saying why: a minor upgrade goes forward once an API server has moved.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkDurations(map[string]time.Duration{"--ready-timeout": opts.ReadyTimeout}, nil); err != nil {
				return err
			}
			if err := opts.Agent.check(); err != nil {
				return err
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return rollbackRun(cmd.Context(), opts)
		},
	}
	opts.Kube.addFlags(cmd)
	opts.Nodes.AddFlags(cmd)
	opts.Agent.addFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&opts.CatalogFile, "catalog", "", "version catalog file (default: the built-in one)")
	f.StringVar(&opts.BackupDir, "backup-dir", release.DefaultBackupDir, "where apply kept the replaced binaries on the nodes")
	f.DurationVar(&opts.ReadyTimeout, "ready-timeout", 5*time.Minute, "how long to wait for each restored component")
	addHealthWindowFlag(f, &opts.HealthWindow)
	f.BoolVarP(&opts.Quiet, "quiet", "q", false, "no progress on stderr")
	f.BoolVar(&opts.DryRun, "dry-run", false, "read what runs and print every restore and node script the rollback would run; change nothing")
	return cmd
}

func rollbackRun(ctx context.Context, opts *rollbackOptions) (err error) {
	cat, err := catalog.Load(opts.CatalogFile)
	if err != nil {
		return err
	}
	cfg, err := opts.Kube.config()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	// The lock's holder names the agents' run: the next holder, taking
	// the lock over from a run that stopped, takes its agents over.
	holder := upgradelock.NewHolder()
	steps, err := opts.Kube.stepClient(opts.Agent.QPS)
	if err != nil {
		return err
	}
	r, err := opts.Agent.reach(ctx, client, steps, &opts.Nodes, access.RunOfHolder(holder))
	if err != nil {
		return err
	}
	defer r.stop(ctx, &err)
	res, err := inplace.Rollback(ctx, inplace.ApplyOptions{
		Plan: preflight.PlanOptions{Client: client, REST: cfg, Catalog: cat, Connector: r.Connector, Inventory: r.Inventory, Parallel: opts.Nodes.Parallel,
			HealthWindow: opts.HealthWindow, Log: opts.IO.Logger(opts.Quiet)},
		BackupDir: opts.BackupDir, ReadyTimeout: opts.ReadyTimeout, DryRun: opts.DryRun, Holder: holder, Locked: r.adopt})
	switch {
	case res != nil && opts.DryRun:
		printActions(opts.IO.Out, res.DryRun)
	case res != nil && res.State != nil && err == nil:
		printState(opts.IO.Out, res.State, nil, "")
	}
	return err
}
