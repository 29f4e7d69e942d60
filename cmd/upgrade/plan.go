package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/agent"
	agentaccess "github.com/kubelift/kubelift/internal/agent/access"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/window"
)

type planOptions struct {
	IO             *cli.IO
	Cluster        clusterFlags
	Nodes          cli.NodeFlags
	Registry       cli.RegistryFlags
	CatalogFile    string
	StageDir       string
	Path           stagePath
	MaxUnavailable string
	Canary         bool
	AllowRestarts  bool
	HealthWindow   time.Duration
	NoWorkloadGate bool
	Output         string
	Quiet          bool
	// Engine builds what the engine reads the cluster with (engine,
	// unless a test sets it).
	Engine func(context.Context) (*preflight.PlanOptions, error)
	// reached is how engine reached the nodes (stopped at the end).
	reached *reached
	// holder is apply's name as the lock's holder ("" for plan): its
	// agents' run id.
	holder string
}

func newCmdPlan(s *cli.IO, runF func(context.Context, *planOptions) error) *cobra.Command {
	opts := &planOptions{IO: s}
	opts.Engine = opts.engine
	cmd := &cobra.Command{
		Use:   "plan --to VERSION --key PUB [flags]",
		Short: "Say exactly what an in-place upgrade would do, and what stands in its way; change nothing",
		Long: `Plan reads the cluster (the API, and every node over SSH) and changes
nothing. It prints the current state of every node (role, kubelet version,
and the versions of the control-plane binaries actually running there), the
ordered plan (the pods' tolerations, control-plane nodes one at a time,
then kubelets: control-plane nodes one at a time, then ` + cli.Wrap(window.Help+"; the plan shows the waves in which they start when every node takes as long), and findings.", 54, 75, "") + `

Each finding has a severity (blocking, warning, info), the object it is
about, why, and the fix. Checks:

  path, skew      the catalog's upgrade sources and patch downgrades; no minor
                  skipped; kubelets never newer than the API server
  imported        the version's cluster record, its signed bundle.json verified
  images          every image of the version in the private registry by digest
  ssh             every node reachable, host key checked
  health          every node Ready; each API server's /readyz; controller
                  manager and scheduler leading (or running)
  staged, disk    binaries staged with the right sha256; room for the rest
  removed-flags   flags the target removed, in the kubelet's and the control
                  plane's units, drop-ins, environment files and command lines
  runtime         each node's container runtime a version the target's kubelet
                  supports (the catalog's containerRuntimes: containerd 1.x
                  ends with v1.35)
  removed-apis    objects served under group-versions the target removes
  readmission     pods the restarted kubelet would reject (NodeAffinity): their
                  nodeSelector or required affinity no longer matches the node
  eviction        pods without not-ready/unreachable NoExecute tolerations
  restarts        running containers the bundled kubelet would restart (from
                  each node's runtime, crictl ps), and those the hash-skip
                  file keeps running

Exit codes: 0 nothing blocks, 4 a blocking finding, 1 the plan could not be
made, 2 bad flags.`,
		Example: `  upgrade plan --to v1.31.4 --key team.pub --ssh-key ~/.ssh/id_ed25519 --known-hosts known_hosts
  upgrade plan --to v1.31.4 --key team.pub --inventory nodes.yaml --max-unavailable 10% --canary -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return planRun(cmd.Context(), opts)
		},
	}
	opts.Cluster.addFlags(cmd)
	opts.Nodes.AddFlags(cmd)
	opts.Registry.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&opts.CatalogFile, "catalog", "", "version catalog file (default: the built-in one)")
	f.StringVar(&opts.StageDir, "stage-dir", release.DefaultStageDir, "where binaries are staged on the nodes")
	opts.Path.addFlags(cmd)
	f.StringVar(&opts.MaxUnavailable, "max-unavailable", "1", "workers in flight at once: N or P% of the workers")
	f.BoolVar(&opts.Canary, "canary", false, "grow the window 1, 2, 4 ... up to --max-unavailable while nodes succeed")
	f.BoolVar(&opts.AllowRestarts, "allow-restarts", false, "predicted container restarts are a warning, not blocking")
	addHealthWindowFlag(f, &opts.HealthWindow)
	addWorkloadGateFlag(f, &opts.NoWorkloadGate)
	f.StringVarP(&opts.Output, "output", "o", "", "output format: text or json")
	f.BoolVarP(&opts.Quiet, "quiet", "q", false, "no progress on stderr")
	return cmd
}

// engine builds what the engine reads the cluster with, from the flags:
// the API clients, the verified target, the registry, the nodes.
func (opts *planOptions) engine(ctx context.Context) (*preflight.PlanOptions, error) {
	if _, err := window.ParseMaxUnavailable(opts.MaxUnavailable, 1); err != nil {
		return nil, cli.Usagef("%v", err)
	}
	cat, err := catalog.Load(opts.CatalogFile)
	if err != nil {
		return nil, err
	}
	cfg, err := opts.Cluster.config()
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	target, err := opts.Cluster.target(ctx, client)
	if err != nil {
		return nil, err
	}
	access, err := registryAccess(opts.IO.In, &opts.Registry, target)
	if err != nil {
		return nil, err
	}
	if err := opts.Path.check(); err != nil {
		return nil, err
	}
	steps, err := opts.Cluster.stepClient(opts.Path.AgentQPS)
	if err != nil {
		return nil, err
	}
	r, err := reachForRelease(ctx, opts.Path.Via, &opts.Nodes, client, steps, target, access, opts.Registry.Domain, agentaccess.RunOfHolder(opts.holder))
	if err != nil {
		return nil, err
	}
	opts.reached = r
	return &preflight.PlanOptions{Client: client, Dynamic: dyn, REST: cfg, Target: target, Catalog: cat,
		Access: access, Connector: r.Connector, Inventory: r.Inventory, Parallel: opts.Nodes.Parallel, StageDir: opts.StageDir,
		StageVia: opts.Path.stageVia(), StageCodec: opts.Path.Codec, NodeCredentials: opts.Path.NodeCredentials,
		MaxUnavailable: opts.MaxUnavailable, Canary: opts.Canary, AllowRestarts: opts.AllowRestarts, HealthWindow: opts.HealthWindow,
		NoWorkloadGate: opts.NoWorkloadGate, Log: opts.IO.Logger(opts.Quiet)}, nil
}

func planRun(ctx context.Context, opts *planOptions) (err error) {
	asJSON, err := cli.OutputFlag(opts.Output)
	if err != nil {
		return err
	}
	po, err := opts.Engine(ctx)
	defer opts.reached.stop(ctx, &err)
	if err != nil {
		return err
	}
	plan, err := inplace.BuildPlan(ctx, *po)
	if plan != nil {
		agents := opts.reached.made()
		if asJSON {
			// The plan, and what agent mode makes for the run.
			out := struct {
				*preflight.Plan
				Agents []agent.Made `json:"agents,omitempty"`
			}{plan, agents}
			if perr := cli.PrintJSON(opts.IO.Out, out); perr != nil {
				return perr
			}
		} else {
			printPlan(opts.IO.Out, plan, agents)
		}
	}
	if errors.Is(err, preflight.ErrBlocked) {
		n := 0
		for _, f := range plan.Findings {
			if f.Severity == preflight.Blocking {
				n++
			}
		}
		return &cli.CodeError{Code: cli.ExitBlocked, Err: fmt.Errorf("%w: %d blocking findings", err, n)}
	}
	return err
}

func printPlan(w io.Writer, p *preflight.Plan, agents []agent.Made) {
	fmt.Fprintf(w, "Upgrade to %s (from %s), control plane: %s\n", p.To, strings.Join(p.From, ", "), p.ControlPlane)
	if len(p.Hops) > 0 {
		fmt.Fprintf(w, "The control plane passes through %s; kubelets go straight to %s.\n", strings.Join(p.Hops, ", "), p.To)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tREADY\tKUBELET\tKUBE-PROXY\tAPISERVER\tCONTROLLER-MANAGER\tSCHEDULER\tSTAGED\tCONTAINERS\tWOULD RESTART\tKEPT BY HASH-SKIP\tRECREATED (STATIC PODS)")
	for _, n := range p.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\t%s\t%s\t%s\t%v\t%d\t%d\t%d\t%d\n", n.Name, n.Role, n.Ready, n.Kubelet, orDash(n.Components["kube-proxy"]), orDash(n.Components["kube-apiserver"]),
			orDash(n.Components["kube-controller-manager"]), orDash(n.Components["kube-scheduler"]), n.Staged, n.Containers, n.Restarts, n.Protected, n.Recreated)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nPlan:")
	for i, s := range p.Steps {
		switch s.Phase {
		case preflight.PhaseControlPlane:
			fmt.Fprintf(w, "  %2d. control plane on %s to %s: %s\n", i+1, strings.Join(s.Nodes, ", "), s.Version, strings.Join(s.Components, ", "))
		case preflight.PhaseTolerations:
			fmt.Fprintf(w, "  %2d. add the missing not-ready/unreachable tolerations to running pods\n", i+1)
		default:
			fmt.Fprintf(w, "  %2d. %s on %s\n", i+1, strings.Join(s.Components, " then "), strings.Join(s.Nodes, ", "))
		}
	}
	if e := p.Etcd; e != nil {
		fmt.Fprintf(w, "  etcd: %s to %s on %s before the control plane, after a snapshot kept off its node: one member at a time, the leader last, every member healthy before and after each.\n", e.From, e.To, strings.Join(e.Nodes, ", "))
	}
	if c := p.CoreDNS; c != nil {
		corefile := "its Corefile as it is"
		if c.MigratesCorefile {
			corefile = "its Corefile migrated (" + strings.Join(c.Notices, " ") + ")"
		}
		fmt.Fprintf(w, "  CoreDNS: %s to %s (%s) after the control plane, before the kubelets, every new replica serving before an old one leaves its Services; %s.\n", c.From, c.To, c.Image, corefile)
	}
	if slices.ContainsFunc(p.Nodes, func(n preflight.NodeState) bool { return n.Role != release.RoleControlPlane }) {
		canary := ""
		if p.Window.Canary {
			canary = ", from 1 doubling as nodes succeed"
		}
		fmt.Fprintf(w, "  Workers: at most %d in flight%s, a slot freed as soon as a node is done (the waves above are when every node takes as long).\n", p.Window.Limit, canary)
	}
	if len(p.WorkloadGate) > 0 {
		fmt.Fprintf(w, "\nWorkload gate: %d workloads are fully available now; after each node, those with a pod on it must be again within the health window:\n  %s\n", len(p.WorkloadGate), strings.Join(p.WorkloadGate, "\n  "))
	}
	if len(agents) > 0 {
		fmt.Fprintln(w, "\nAgent mode (--via agent) makes in the cluster; the admin needs no SSH key:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, m := range agents {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", m.Kind, m.Name, m.What)
		}
		tw.Flush()
	}
	fmt.Fprintln(w, "\nFindings:")
	if len(p.Findings) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, f := range p.Findings {
		fmt.Fprintf(w, "  %-8s %-13s %s: %s\n", strings.ToUpper(string(f.Severity)), f.Check, f.Object, f.Message)
		if f.Fix != "" {
			fmt.Fprintf(w, "  %-8s %-13s fix: %s\n", "", "", f.Fix)
		}
	}
	verdict := "nothing blocks the upgrade"
	if p.Blocked {
		verdict = "BLOCKED: fix the blocking findings and plan again"
	}
	fmt.Fprintf(w, "\n%s (bundled kubelet honours the hash-skip file: %v)\n", verdict, p.HashSkipKubelet)
}
