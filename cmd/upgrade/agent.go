package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/agent/hoststep"
	"github.com/kubelift/kubelift/internal/agent/serve"
	"github.com/kubelift/kubelift/internal/cli"
)

// nodeNameEnv is where the agent's pod gives it its node's name (the
// downward API's spec.nodeName).
const nodeNameEnv = "KUBELIFT_NODE_NAME"

type agentOptions struct {
	IO   *cli.IO
	Kube kubeFlags
	// KubeClient makes the API client (from Kube unless a test sets it).
	KubeClient func() (kubernetes.Interface, error)
	Node       string
	Root       string
	StepsDir   string
}

func newCmdAgent(s *cli.IO, runF func(context.Context, *agentOptions) error) *cobra.Command {
	opts := &agentOptions{IO: s}
	opts.KubeClient = opts.Kube.client
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run a node's steps for agent mode (in the agent's pod on the node; not run by hand)",
		Long: `agent is the node agent of agent mode (--via agent, docs/agent-mode.md). It
runs in a pod a run starts on each node: it watches the node's step requests
in the ` + agent.Namespace + ` namespace, runs each as a transient unit of the host's
service manager (systemd-run, chrooted to --root, the host's root as the pod
mounts it), keeps each step's output and exit status on the host until they
are written into the request, and never runs a request twice.

It runs only kubelift's own node scripts, named in the requests with their
arguments, from its own copy.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if errs := validation.IsDNS1123Subdomain(opts.Node); opts.Node == "" || len(errs) > 0 {
				return cli.Usagef("--node %q: a node's name is needed (or $%s): %v", opts.Node, nodeNameEnv, errs)
			}
			if fi, err := os.Stat(opts.Root); err != nil || !fi.IsDir() {
				return cli.Usagef("--root %q: the host's root, as a directory: %v", opts.Root, err)
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return agentRun(cmd.Context(), opts)
		},
	}
	opts.Kube.addFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&opts.Node, "node", os.Getenv(nodeNameEnv), "the node this agent serves (default $"+nodeNameEnv+")")
	f.StringVar(&opts.Root, "root", "/host", "the host's root directory, as this process sees it")
	f.StringVar(&opts.StepsDir, "steps-dir", hoststep.DefaultDir, "where on the host each step's command, output and exit status are kept")
	return cmd
}

func agentRun(ctx context.Context, opts *agentOptions) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	client, err := opts.KubeClient()
	if err != nil {
		return err
	}
	a := &serve.Agent{Client: client, Node: opts.Node, Log: opts.IO.Logger(false),
		Host: &hoststep.Host{Root: opts.Root, Dir: opts.StepsDir, Units: hoststep.Systemd{Root: opts.Root}}}
	if err := a.Serve(ctx); err != nil {
		return fmt.Errorf("agent of node %s: %w", opts.Node, err)
	}
	return nil
}
