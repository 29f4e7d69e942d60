package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/inplace/window"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/registry"
	"github.com/kubelift/kubelift/internal/upgradelock"
)

type applyOptions struct {
	planOptions
	CacheDir       string
	BackupDir      string
	RestoreLabels  bool
	Ignore         []string
	ignore         []preflight.Check // Ignore, parsed
	Soak           time.Duration
	Settle         time.Duration
	ReadyTimeout   time.Duration
	SkipEtcdBackup bool
	SnapshotDir    string
	SnapshotRepo   string
	DryRun         bool
	LockDuration   time.Duration
	Workers        []string
	Selector       string
	Drain          bool
	DrainTimeout   time.Duration
	PreHook        string
	PostHook       string
	KubeadmConfig  string
	// hook, when set, is the runbook's hook in place of PreHook and
	// PostHook's (the controller's hold).
	hook      func(ctx context.Context, phase, node, from, to string) error
	InCluster inClusterFlags
}

func newCmdApply(s *cli.IO, runF func(context.Context, *applyOptions) error) *cobra.Command {
	opts := &applyOptions{planOptions: planOptions{IO: s}}
	opts.Engine = opts.engine
	opts.InCluster.Dynamic = opts.Cluster.dynamic
	cmd := &cobra.Command{
		Use:   "apply --to VERSION --key PUB [flags]",
		Short: "Upgrade the cluster in place, node by node, keeping every container running",
		Long: `Apply plans first (as 'upgrade plan' does) and refuses on a blocking finding
it does not resolve itself. Then, holding the Lease kube-system/kubelift-upgrade
(one upgrade at a time; a run that died is taken over once its lease expires):

  1. stages the binaries a node lacks
  2. adds the missing not-ready/unreachable NoExecute tolerations (300 s) to
     running pods, before anything restarts; with --restore-labels, adds
     back the node labels pods' nodeSelectors need
  3. snapshots etcd on a control-plane node (--skip-etcd-backup to skip)
  4. control plane, one node at a time: kube-apiserver, controller manager,
     scheduler, each backed up, swapped by rename, restarted and waited for
     at the target (the API server's /readyz at the node) before the next.
     On a kubeadm-built cluster (kube-system/kubeadm-config), kubeadm does
     it: 'kubeadm upgrade apply' on the first control-plane node, 'kubeadm
     upgrade node' on the others (and on each worker before its kubelet),
     run detached on the node and followed; --kubeadm-config gives kubeadm
     an UpgradeConfiguration
  5. kubelets, once every API server runs the target: control-plane nodes one
     at a time, then ` + cli.Wrap(window.Help+" (--soak waits between nodes). Per node:", 21, 78, "     ") + ` back up the kubelet and its checkpoint
     files, record the running containers, write the hash-skip file when the
     hash era changes and the bundled kubelet honours it, swap, restart, wait
     (watching Nodes) for Ready at the target, wait --settle, verify that every
     container still runs with the same ID and no pod failed or went, then
     annotate the Node kubelift.dev/upgraded-to. Any failure restores the old
     kubelet, waits for it Ready, and stops the run (nodes in flight finish).

The state is kept in the ConfigMap kube-system/kubelift-upgrade ('upgrade
status'); running apply again continues where it stopped, skipping what
already runs the target, and on an upgraded cluster changes nothing.

Manual mode: --nodes or --selector choose the workers whose kubelets move
now; the rest wait (status shows them pending, the state stays
upgrading-kubelets) for a later apply.

In the cluster: --in-cluster runs nothing here. It writes an Upgrade
(kubelift.dev) with this policy, which the controller ('upgrade controller
install') runs over agents, and follows it to its end (--detach: returns at
once; this machine may go away). --paused and --window hold it before its
next node (docs/controller.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkInCluster(cmd, &opts.InCluster); err != nil {
				return err
			}
			if len(opts.Workers) > 0 && opts.Selector != "" {
				return cli.Usagef("--nodes and --selector exclude each other")
			}
			if _, err := labels.Parse(opts.Selector); err != nil {
				return cli.Usagef("--selector %q: %v", opts.Selector, err)
			}
			if _, err := cli.OutputFlag(opts.Output); err != nil {
				return err
			}
			if err := opts.Path.check(); err != nil {
				return err
			}
			if err := checkDurations(map[string]time.Duration{"--ready-timeout": opts.ReadyTimeout, "--drain-timeout": opts.DrainTimeout},
				map[string]time.Duration{"--settle": opts.Settle, "--soak": opts.Soak}); err != nil {
				return err
			}
			if opts.SkipEtcdBackup {
				// Either would keep a copy of a snapshot that is never taken.
				if opts.SnapshotRepo != "" {
					return cli.Usagef("--etcd-snapshot-repo with --skip-etcd-backup: no snapshot is taken to push")
				}
				if opts.SnapshotDir != "" {
					return cli.Usagef("--etcd-snapshot-dir with --skip-etcd-backup: no snapshot is taken to keep")
				}
			}
			if opts.Path.Via == viaAgent && (opts.SnapshotRepo != "" || opts.SnapshotDir != "") {
				// An answer is readable to every agent, and the snapshot
				// holds every Secret: it stays on its node.
				return cli.Usagef("--etcd-snapshot-dir and --etcd-snapshot-repo with --via agent: agent mode keeps the etcd snapshot on its node (docs/agent-mode.md); copy it off over SSH, or take it with --via ssh")
			}
			if opts.SnapshotRepo != "" {
				if _, err := name.NewRepository(opts.SnapshotRepo, name.StrictValidation); err != nil {
					return cli.Usagef("--etcd-snapshot-repo %q: %v", opts.SnapshotRepo, err)
				}
			}
			if opts.LockDuration < upgradelock.MinDuration {
				return cli.Usagef("--lock-duration %s: at least %s (a lock renewed every third of it)", opts.LockDuration, upgradelock.MinDuration)
			}
			opts.ignore = nil
			for _, name := range opts.Ignore {
				c, err := preflight.ParseCheck(name)
				if err != nil {
					return cli.Usagef("--ignore-preflight: %v", err)
				}
				opts.ignore = append(opts.ignore, c)
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			if opts.InCluster.InCluster {
				return applyInCluster(cmd.Context(), opts)
			}
			return applyRun(cmd.Context(), opts)
		},
	}
	opts.Cluster.addFlags(cmd)
	opts.Nodes.AddFlags(cmd)
	opts.Registry.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&opts.CatalogFile, "catalog", "", "version catalog file (default: the built-in one)")
	addStageFlags(cmd, &opts.StageDir, &opts.CacheDir)
	opts.Path.addFlags(cmd)
	f.StringVar(&opts.BackupDir, "backup-dir", release.DefaultBackupDir, "where replaced binaries are kept on the nodes (OLDVERSION/NAME below it)")
	f.StringVar(&opts.MaxUnavailable, "max-unavailable", "1", "workers in flight at once: N or P% of the workers")
	f.BoolVar(&opts.Canary, "canary", false, "grow the window 1, 2, 4 ... up to --max-unavailable while nodes succeed")
	f.DurationVar(&opts.Soak, "soak", 0, "wait after each worker before the next takes its slot")
	f.DurationVar(&opts.Settle, "settle", 15*time.Second, "how long a restarted kubelet runs before its containers are verified")
	f.DurationVar(&opts.ReadyTimeout, "ready-timeout", 5*time.Minute, "how long to wait for a restarted component before rolling it back")
	f.BoolVar(&opts.RestoreLabels, "restore-labels", false, "add back the node labels running pods' nodeSelectors need (else such pods block)")
	f.BoolVar(&opts.AllowRestarts, "allow-restarts", false, "accept predicted container restarts")
	addHealthWindowFlag(f, &opts.HealthWindow)
	addWorkloadGateFlag(f, &opts.NoWorkloadGate)
	f.StringSliceVar(&opts.Ignore, "ignore-preflight", nil, "checks whose blocking findings do not stop apply (e.g. removed-flags): you take the risk")
	f.StringVar(&opts.PreHook, "pre-hook", "", "shell command run on this machine before each node's kubelet moves (KUBELIFT_NODE, KUBELIFT_FROM, KUBELIFT_TO set); failing stops the run before the node")
	f.StringVar(&opts.PostHook, "post-hook", "", "shell command run after each node is verified; failing rolls the node back and stops the run (a health gate)")
	f.BoolVar(&opts.Drain, "drain", false, "cordon and drain each node (PodDisruptionBudgets hold) before its kubelet restarts; uncordon after (only nodes this run cordoned)")
	f.DurationVar(&opts.DrainTimeout, "drain-timeout", 2*time.Minute, "how long a drain may wait on PodDisruptionBudgets before the run stops (the node uncordoned)")
	f.StringSliceVar(&opts.Workers, "nodes", nil, "manual mode: move only these workers' kubelets (the control plane always goes first)")
	f.StringVar(&opts.Selector, "selector", "", "manual mode: move only the kubelets of workers with these labels (e.g. pool=blue)")
	f.StringVar(&opts.KubeadmConfig, "kubeadm-config", "", "kubeadm clusters: an UpgradeConfiguration file (kubeadm.k8s.io/v1beta4, target v1.31 and later) given to every kubeadm upgrade as --config, e.g. its timeouts; kubelift sets the version and the patches directory")
	f.BoolVar(&opts.SkipEtcdBackup, "skip-etcd-backup", false, "do not snapshot etcd first")
	f.StringVar(&opts.SnapshotDir, "etcd-snapshot-dir", "", "where on this machine to keep a copy of the etcd snapshot, off the node it protects (default: etcd-snapshots below --cache-dir; move it somewhere safe)")
	f.StringVar(&opts.SnapshotRepo, "etcd-snapshot-repo", "", "also push that copy to this repository (REGISTRY/PATH, with the registry flags' credentials) as an OCI artifact tagged with the copy's name (NODE-etcd-snapshot-TIME.db); the snapshot holds every Secret of the cluster: give it a repository only its admins can read (default: not pushed)")
	f.DurationVar(&opts.LockDuration, "lock-duration", time.Minute, "the upgrade lock lasts this long unless renewed: a run that died is taken over after it")
	f.BoolVar(&opts.DryRun, "dry-run", false, "walk every step, print each change and node script it would make; change nothing")
	f.BoolVarP(&opts.Quiet, "quiet", "q", false, "no progress on stderr")
	f.StringVarP(&opts.Output, "output", "o", "", "output format: text or json (the plan, the state, timings)")
	opts.InCluster.addFlags(cmd)
	return cmd
}

// checkDurations refuses a positive duration flag that is not, or a
// non-negative one that is negative: naming the flag and its value.
func checkDurations(positive, nonNegative map[string]time.Duration) error {
	for _, name := range slices.Sorted(maps.Keys(positive)) {
		if d := positive[name]; d <= 0 {
			return cli.Usagef("%s %s: must be more than 0", name, d)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(nonNegative)) {
		if d := nonNegative[name]; d < 0 {
			return cli.Usagef("%s %s: must not be negative", name, d)
		}
	}
	return nil
}

func applyRun(ctx context.Context, opts *applyOptions) error {
	asJSON, err := cli.OutputFlag(opts.Output)
	if err != nil {
		return err
	}
	start := time.Now()
	res, err := opts.apply(ctx)
	switch {
	case res != nil && asJSON:
		if perr := cli.PrintJSON(opts.IO.Out, res); perr != nil {
			return perr
		}
	case res != nil:
		printApply(opts.IO.Out, res, opts.DryRun, time.Since(start))
	}
	if errors.Is(err, preflight.ErrBlocked) {
		return &cli.CodeError{Code: cli.ExitBlocked, Err: err}
	}
	return err
}

// apply runs the engine as opts say: the plan, then the runbook; the
// agents it started are stopped before it returns.
func (opts *applyOptions) apply(ctx context.Context) (res *inplace.ApplyResult, err error) {
	var selector labels.Selector
	if opts.Selector != "" {
		sel, err := labels.Parse(opts.Selector)
		if err != nil {
			return nil, cli.Usagef("--selector %q: %v", opts.Selector, err)
		}
		selector = sel
	}
	opts.holder = upgradelock.NewHolder()
	po, err := opts.Engine(ctx)
	defer opts.reached.stop(ctx, &err)
	if err != nil {
		return nil, err
	}
	var kubeadmConfig *kubeadm.UpgradeConfig
	if opts.KubeadmConfig != "" {
		if kubeadmConfig, err = readKubeadmConfig(opts.KubeadmConfig, po.Target.Version.String()); err != nil {
			return nil, err
		}
	}
	hook := opts.hook
	if hook == nil {
		hook = hooks(opts.PreHook, opts.PostHook, opts.IO.ErrOut)
	}
	return inplace.Apply(ctx, inplace.ApplyOptions{
		Plan: *po, Source: stage.RegistrySource{Access: po.Access}, CacheDir: opts.CacheDir, BackupDir: opts.BackupDir, RestoreLabels: opts.RestoreLabels,
		Ignore: opts.ignore, Soak: opts.Soak, Settle: opts.Settle, ReadyTimeout: opts.ReadyTimeout, SkipEtcdBackup: opts.SkipEtcdBackup, Snapshot: snapshots(opts, po.Access), DryRun: opts.DryRun, Holder: opts.holder, Locked: opts.reached.adopt,
		LockDuration: opts.LockDuration, Nodes: opts.Workers, Selector: selector, Drain: opts.Drain, DrainTimeout: opts.DrainTimeout,
		Hook: hook, KubeadmConfig: kubeadmConfig,
	})
}

// readKubeadmConfig reads and checks --kubeadm-config's file.
func readKubeadmConfig(file, to string) (*kubeadm.UpgradeConfig, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, cli.Usagef("--kubeadm-config: %v", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, kubeadm.MaxUpgradeConfigSize+1))
	if err != nil {
		return nil, fmt.Errorf("--kubeadm-config: %w", err)
	}
	c, err := kubeadm.ParseUpgradeConfig(file, data, to)
	if err != nil {
		return nil, cli.Usagef("--kubeadm-config: %v", err)
	}
	return c, nil
}

// hooks runs --pre-hook and --post-hook with sh, the node and versions in
// the environment, their output on stderr.
func hooks(pre, post string, out io.Writer) func(ctx context.Context, phase, node, from, to string) error {
	if pre == "" && post == "" {
		return nil
	}
	return func(ctx context.Context, phase, node, from, to string) error {
		cmdline := map[string]string{"pre": pre, "post": post}[phase]
		if cmdline == "" {
			return nil
		}
		cmd := exec.CommandContext(ctx, "sh", "-c", cmdline)
		cmd.Env = append(os.Environ(), "KUBELIFT_PHASE="+phase, "KUBELIFT_NODE="+node, "KUBELIFT_FROM="+from, "KUBELIFT_TO="+to)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%q: %w", cmdline, err)
		}
		return nil
	}
}

func printApply(w io.Writer, res *inplace.ApplyResult, dry bool, took time.Duration) {
	switch {
	case dry && res.Plan != nil:
		printPlan(w, res.Plan, nil)
		fmt.Fprintln(w)
		printActions(w, res.DryRun)
		return
	case res.NothingToDo:
		fmt.Fprintf(w, "every node already runs %s: nothing to do\n", res.Plan.To)
		return
	}
	if len(res.Patched) > 0 {
		fmt.Fprintf(w, "tolerations added to %d pods: %s\n", len(res.Patched), strings.Join(res.Patched, ", "))
	}
	if len(res.Labels) > 0 {
		fmt.Fprintf(w, "labels restored: %s\n", strings.Join(res.Labels, ", "))
	}
	if res.State != nil {
		printState(w, res.State, nil, "")
	}
	if res.State != nil && res.State.State == record.StateComplete {
		fmt.Fprintf(w, "upgraded to %s in %s\n", res.State.To, took.Round(time.Second))
	}
}

// printActions prints what a dry run walked past, step by step.
func printActions(w io.Writer, actions []inplace.Action) {
	step := ""
	for _, a := range actions {
		if a.Step != step {
			step = a.Step
			fmt.Fprintf(w, "step %s:\n", step)
		}
		line := "  "
		if a.Node != "" {
			line += a.Node + ": "
		}
		switch {
		case a.What != "" && a.Command != "":
			line += a.What + ": " + a.Command
		default:
			line += a.What + a.Command
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "dry run: %d changes walked past, nothing was changed\n", len(actions))
}

// snapshots is where apply keeps the etcd snapshot off its node: a copy
// in the directory asked for, or etcd-snapshots below the cache
// directory; pushed on to --etcd-snapshot-repo through access; on its
// node in agent mode.
func snapshots(opts *applyOptions, access registry.Access) inplace.Snapshots {
	s := inplace.Snapshots{Dir: opts.SnapshotDir, Repository: opts.SnapshotRepo, Registry: access}
	if opts.Path.Via == viaAgent {
		return inplace.Snapshots{} // kept on its node: every agent could read a copy made through agents
	}
	if s.Dir == "" {
		s.Dir = filepath.Join(opts.CacheDir, "etcd-snapshots")
	}
	return s
}
