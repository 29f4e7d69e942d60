package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/controller"
	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/registry"
	"github.com/kubelift/kubelift/internal/upgradeapi"
)

type controllerOptions struct {
	IO              *cli.IO
	Kube            kubeFlags
	Trust           cli.TrustOptions
	Registry        cli.RegistryFlags
	NodeCredentials string
	AgentQPS        float32
	CacheDir        string
	Identity        string
	Poll            time.Duration
	StopTimeout     time.Duration
}

func newCmdController(s *cli.IO, runF func(context.Context, *controllerOptions) error) *cobra.Command {
	opts := &controllerOptions{IO: s}
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the cluster's Upgrades from inside it (in its Deployment; 'controller install' makes it)",
		// SIGTERM stops the run at the next node boundary, not mid-node.
		Annotations: map[string]string{cli.OwnSignals: "stops at a node boundary"},
		Long: `controller runs the cluster's Upgrade objects (kubelift.dev/v1alpha1, docs/controller.md),
so that no admin machine has to stay up while a cluster upgrades. It runs in
the Deployment ` + agent.Namespace + `/` + controller.Name + ` that 'upgrade controller install' makes, from the
bundle's agent image; its replicas elect a leader on the Lease ` + agent.Namespace + `/` + controller.LeaseName + `,
and only the leader runs.

The leader runs one Upgrade at a time, the oldest first (the others say they
wait for it), through agents (--via agent): the same plan and runbook as
'upgrade apply'. It decides from the objects as they are, so a leader that
takes over (its pod deleted, its node upgraded) resumes the run from its record.
Before the run starts and before each node's kubelet moves it reads the Upgrade
again: spec.paused or a closed spec.window holds the run there (the nodes in
flight finish); a changed policy stops it there and it starts again with the
new one. On SIGTERM it stops there too, within --stop-timeout, and releases
the Lease: the next leader goes on from that node.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.Identity == "" {
				return cli.Usagef("--identity: empty (set $%s, or give it)", controller.PodNameEnv)
			}
			if err := (&stagePath{Via: viaAgent, Codec: stage.CodecAuto, NodeCredentials: opts.NodeCredentials, AgentQPS: opts.AgentQPS}).check(); err != nil {
				return err
			}
			if _, err := opts.Trust.Trust(); err != nil {
				return err
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return controllerRun(cmd.Context(), opts)
		},
	}
	opts.Kube.addFlags(cmd)
	opts.Trust.AddFlags(cmd)
	opts.Registry.AddFlags(cmd)
	agentQPSFlag(cmd, &opts.AgentQPS)
	f := cmd.Flags()
	nodeCredentialsFlag(f, &opts.NodeCredentials)
	host, _ := os.Hostname()
	f.StringVar(&opts.Identity, "identity", cmp.Or(os.Getenv(controller.PodNameEnv), host), "this replica's name in the leader Lease and the Upgrades' status (default $"+controller.PodNameEnv+", else the host name)")
	f.StringVar(&opts.CacheDir, "cache-dir", cli.DefaultCacheDir(), "where fetched files are kept")
	f.DurationVar(&opts.Poll, "poll", 2*time.Second, "how often the Upgrades and the run's record are read")
	f.DurationVar(&opts.StopTimeout, "stop-timeout", controller.StopTimeout, "on SIGTERM, how long the nodes in flight may take to finish before the run stops where it is (keep it below the pod's termination grace period)")
	cmd.AddCommand(newCmdControllerInstall(s, nil))
	return cmd
}

func controllerRun(ctx context.Context, opts *controllerOptions) error {
	// SIGTERM (the pod deleted) stops the run before its next node; the
	// nodes in flight finish within --stop-timeout. Past it, or on a
	// second signal, the process ends where it is, cancelling nothing (a
	// cancelled node would be rolled back, another restart, and the pod's
	// grace period may cut that off): the next leader finishes the node
	// from its record.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopping, leading, led, abandon := make(chan struct{}), atomic.Bool{}, make(chan struct{}), make(chan struct{})
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(signals)
	log := opts.IO.Logger(false)
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-signals:
		}
		close(stopping)
		if !leading.Load() {
			cancel() // not leading: nothing runs
			return
		}
		log.Info("controller: stopping after the nodes in flight", "within", opts.StopTimeout)
		select {
		case <-led:
		case <-signals:
			log.Warn("controller: stopping now, a node in flight left to the next leader")
			close(abandon)
		case <-time.After(opts.StopTimeout):
			log.Warn("controller: the nodes in flight did not finish in time: stopping now, left to the next leader", "within", opts.StopTimeout)
			close(abandon)
		}
	}()
	kube, dyn, err := opts.Kube.clients()
	if err != nil {
		return err
	}
	c := &controller.Controller{Upgrades: upgradeapi.Client{Dynamic: dyn}, Kube: kube, Identity: opts.Identity, Log: log, Poll: opts.Poll,
		Run: opts.run, Stopping: stopping}
	log.Info("controller: waiting to lead", "lease", agent.Namespace+"/"+controller.LeaseName, "identity", opts.Identity)
	ended := make(chan error, 1)
	go func() {
		ended <- controller.Lead(ctx, kube, agent.Namespace, opts.Identity, func(ctx context.Context) {
			leading.Store(true)
			defer close(led)
			log.Info("controller: leading")
			_ = c.Reconcile(ctx)
		})
	}()
	select {
	case err = <-ended:
	case <-abandon:
		return nil // the process ends with the run where it is
	}
	select {
	case <-stopping:
		return nil // stopped
	default:
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// run runs one Upgrade: apply, as its spec says, over agents; its
// transcript goes to the controller's log.
func (opts *controllerOptions) run(ctx context.Context, run controller.Run) (controller.Outcome, error) {
	spec := run.Upgrade.Spec
	d, err := spec.Check()
	if err != nil {
		return controller.Outcome{}, err
	}
	a := &applyOptions{
		planOptions: planOptions{IO: opts.IO, Cluster: clusterFlags{kubeFlags: opts.Kube, To: spec.Version, Trust: opts.Trust, Bundle: spec.Bundle},
			Registry: opts.Registry, StageDir: release.DefaultStageDir,
			Path:           stagePath{Via: viaAgent, Codec: stage.CodecAuto, NodeCredentials: opts.NodeCredentials, AgentQPS: opts.AgentQPS},
			MaxUnavailable: cmp.Or(spec.MaxUnavailable, "1"), Canary: spec.Canary, AllowRestarts: spec.AllowRestarts,
			HealthWindow: 30 * time.Second},
		CacheDir: opts.CacheDir, BackupDir: release.DefaultBackupDir, RestoreLabels: spec.RestoreLabels,
		Settle: d.Settle, ReadyTimeout: d.ReadyTimeout, LockDuration: time.Minute,
		Workers: spec.Nodes, Selector: spec.Selector, Drain: spec.Drain, DrainTimeout: d.DrainTimeout,
		hook: func(ctx context.Context, phase, node, from, to string) error {
			if phase != "pre" {
				return nil
			}
			if err := run.Hold(ctx, node); err != nil {
				return fmt.Errorf("%w: %w", inplace.ErrNotStarted, err) // the node stays pending
			}
			return nil
		},
	}
	a.Engine = a.engine
	for _, name := range spec.IgnorePreflight {
		c, err := preflight.ParseCheck(name)
		if err != nil {
			return controller.Outcome{}, fmt.Errorf("spec.ignorePreflight: %w", err)
		}
		a.ignore = append(a.ignore, c)
	}
	start := time.Now()
	res, err := a.apply(ctx)
	out := controller.Outcome{To: spec.Version}
	if res != nil && res.State != nil {
		out.Bundle = res.State.Bundle
	}
	if res != nil && res.Plan != nil {
		out.From = strings.Join(res.Plan.From, ", ")
		for _, f := range res.Plan.Findings {
			out.Findings = append(out.Findings, upgradeapi.Finding{Severity: string(f.Severity), Check: string(f.Check), Object: f.Object, Message: f.Message})
		}
	}
	if res != nil {
		printApply(opts.IO.ErrOut, res, false, time.Since(start))
	}
	return out, err
}

type controllerInstallOptions struct {
	IO              *cli.IO
	Cluster         clusterFlags
	Registry        cli.RegistryFlags
	NodeCredentials string
	Replicas        int32
	AgentQPS        float32
	Image           string
	DryRun          bool
}

func newCmdControllerInstall(s *cli.IO, runF func(context.Context, *controllerInstallOptions) error) *cobra.Command {
	opts := &controllerInstallOptions{IO: s}
	cmd := &cobra.Command{
		Use:   "install --to VERSION --key PUB --domain REGISTRY [flags]",
		Short: "Install the controller and the Upgrade resource in the cluster (again to update them)",
		Long: `install makes what 'upgrade apply --in-cluster' needs: the Upgrade resource's
definition (upgrades.kubelift.dev), agent mode's namespace and rights, the
controller's account with only the rights a run needs (docs/controller.md), the
registry's password (a Secret) and your team's public key (a ConfigMap), and
the Deployment ` + agent.Namespace + `/` + controller.Name + `, whose image is the agent image of the
imported release --to (verified with --key, checked in the registry by digest).`,
		Example: `  upgrade controller install --to v1.31.4 --key team.pub --domain registry.corp:5000 --username admin --password-stdin --ca-file ca.pem`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.Replicas < 1 {
				return cli.Usagef("--replicas %d: at least 1", opts.Replicas)
			}
			if err := (&stagePath{Via: viaAgent, Codec: stage.CodecAuto, NodeCredentials: opts.NodeCredentials, AgentQPS: opts.AgentQPS}).check(); err != nil {
				return err
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return controllerInstallRun(cmd.Context(), opts)
		},
	}
	opts.Cluster.addFlags(cmd)
	opts.Registry.AddFlags(cmd)
	agentQPSFlag(cmd, &opts.AgentQPS)
	f := cmd.Flags()
	nodeCredentialsFlag(f, &opts.NodeCredentials)
	f.Int32Var(&opts.Replicas, "replicas", 2, "the controller's replicas (one leads; another takes over within a minute when it goes)")
	f.BoolVar(&opts.DryRun, "dry-run", false, "say what would be made; make nothing")
	return cmd
}

func controllerInstallRun(ctx context.Context, opts *controllerInstallOptions) error {
	kube, dyn, err := opts.Cluster.clients()
	if err != nil {
		return err
	}
	target, err := opts.Cluster.target(ctx, kube)
	if err != nil {
		return err
	}
	creds, err := opts.Registry.Credentials(opts.IO.In)
	if err != nil {
		return err
	}
	opts.Registry.Password, opts.Registry.PasswordStdin = creds.Password, false // read once: the Secret holds it
	access, err := registryAccess(opts.IO.In, &opts.Registry, target)
	if err != nil {
		return err
	}
	creds.Domain = opts.Registry.Domain // the record's, when not given
	return installController(ctx, opts.IO.Out, kube, dyn, target, access, creds, opts.Cluster.Trust,
		controller.Install{Replicas: opts.Replicas, AgentQPS: opts.AgentQPS, NodeCredentials: opts.NodeCredentials}, opts.DryRun)
}

// installController installs (or updates) the controller as in says,
// from target's agent image, with the registry's credentials and the
// team's key; with dry, it says what it would make.
func installController(ctx context.Context, out io.Writer, kube kubernetes.Interface, dyn dynamic.Interface, target *release.Release,
	access registry.Access, creds registry.Credentials, trust cli.TrustOptions, in controller.Install, dry bool) error {
	img, err := agentImage(ctx, target, access, creds.Domain)
	if err != nil {
		return err
	}
	cat, err := catalog.Load("")
	if err != nil {
		return err
	}
	in.Image, in.Domain, in.Username, in.Password = img, creds.Domain, creds.Username, creds.Password
	in.SkipTLSVerify, in.PlainHTTP, in.AllowUnsigned, in.Catalog = creds.SkipTLSVerify, creds.PlainHTTP, trust.AllowUnsigned, cat
	if creds.CAFile != "" {
		if in.CA, err = os.ReadFile(creds.CAFile); err != nil {
			return cli.Usagef("--ca-file: %v", err)
		}
	}
	if trust.KeyFile != "" {
		if in.Key, err = os.ReadFile(trust.KeyFile); err != nil {
			return cli.Usagef("--key: %v", err)
		}
	}
	if dry {
		printMade(out, in.Made())
		fmt.Fprintln(out, "dry run: nothing was made")
		return nil
	}
	if err := in.Apply(ctx, kube, dyn); err != nil {
		return err
	}
	printMade(out, in.Made())
	fmt.Fprintf(out, "the controller runs from %s; write an Upgrade with 'upgrade apply --in-cluster'\n", img)
	return nil
}

func printMade(w io.Writer, made []agent.Made) {
	for _, m := range made {
		fmt.Fprintf(w, "%s %s: %s\n", m.Kind, m.Name, m.What)
	}
}
