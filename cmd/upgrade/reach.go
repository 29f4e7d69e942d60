package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/agent/access"
	"github.com/kubelift/kubelift/internal/agent/image"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/registry"
)

// How a command reaches the nodes (docs/agent-mode.md): over SSH from
// this machine, or through an agent the run starts on each node.
const (
	viaSSH   = "ssh"
	viaAgent = "agent"
)

// reached is how a command reaches the nodes, for one run.
type reached struct {
	Connector nodeaccess.Connector
	Inventory *nodeaccess.Inventory
	// Agent is the agents' image ("" over SSH).
	Agent  string
	agents *access.Connector
	nodes  int
}

// made is what agent mode makes in the cluster for the run (nil over
// SSH).
func (r *reached) made() []agent.Made {
	if r == nil || r.Agent == "" {
		return nil
	}
	return access.Made(r.Agent, r.nodes)
}

// stop ends agent mode's run (its requests and pods deleted), joining
// what fails to err.
func (r *reached) stop(ctx context.Context, err *error) {
	if r == nil || r.agents == nil {
		return
	}
	*err = errors.Join(*err, r.agents.Stop(ctx))
}

// reachSSH reaches the nodes over SSH, as the SSH flags say.
func reachSSH(nf *cli.NodeFlags) (*reached, error) {
	inv, d, err := nf.Access()
	if err != nil {
		return nil, err
	}
	return &reached{Connector: d, Inventory: inv}, nil
}

// reachAgents starts an agent from img on every node of the cluster (the
// inventory, when given, only names nodes' roles: no SSH is used); the
// step requests go through steps (kubeFlags.stepClient).
func reachAgents(ctx context.Context, client, steps kubernetes.Interface, nf *cli.NodeFlags, run, img string) (*reached, error) {
	inv := &nodeaccess.Inventory{}
	if nf.Inventory != "" {
		var err error
		if inv, err = nodeaccess.LoadInventory(nf.Inventory); err != nil {
			return nil, err
		}
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the nodes to start their agents: %w", err)
	}
	var names []string
	for _, n := range nodes.Items {
		if os := n.Labels[corev1.LabelOSStable]; os != "" && os != "linux" {
			continue // kubelift upgrades Linux nodes only; the plan says so
		}
		names = append(names, n.Name)
	}
	if run == "" {
		run = access.NewRunID()
	}
	c, err := access.Start(ctx, steps, run, img, names)
	if err != nil {
		return nil, err
	}
	return &reached{Connector: c, Inventory: inv, Agent: img, agents: c, nodes: len(names)}, nil
}

// reachForRelease reaches the nodes for a run to target (run: its id,
// "" for a new one): over SSH, or
// with via "agent" through agents from the target's agent image, which
// must be in the registry first (nothing is made in the cluster when it
// is not: the plan is blocked).
func reachForRelease(ctx context.Context, via string, nf *cli.NodeFlags, client, steps kubernetes.Interface, target *release.Release,
	acc registry.Access, domain, run string) (*reached, error) {
	if via != viaAgent {
		return reachSSH(nf)
	}
	img, err := agentImage(ctx, target, acc, domain)
	if err != nil {
		return nil, &cli.CodeError{Code: cli.ExitBlocked, Err: fmt.Errorf("agent mode: %w", err)}
	}
	return reachAgents(ctx, client, steps, nf, run, img)
}

// agentImage is target's agent image, checked in the registry by digest.
func agentImage(ctx context.Context, target *release.Release, acc registry.Access, domain string) (string, error) {
	if domain == "" {
		return "", errors.New("no registry: agents' image comes from the private registry (--domain)")
	}
	img, err := target.AgentImage(image.Repository, domain)
	if err != nil {
		return "", err
	}
	ref, err := name.NewDigest(img, name.StrictValidation)
	if err != nil {
		return "", fmt.Errorf("agent image %q: %w", img, err)
	}
	want, err := v1.NewHash(ref.DigestStr())
	if err != nil {
		return "", fmt.Errorf("agent image %q: %w", img, err)
	}
	got, err := (&registry.Pusher{Access: acc, Jobs: 1}).ManifestDigest(ctx, ref)
	switch {
	case err != nil:
		return "", fmt.Errorf("agent image %s: cannot check the registry: %w", img, err)
	case got != want:
		return "", fmt.Errorf("agent image %s is not in the registry (import the bundle again)", img)
	}
	return img, nil
}

// agentFlags are --via, --agent-image and --key of the commands that
// follow an upgrade already begun (rollback, compat cleanup).
type agentFlags struct {
	Via, Image string
	QPS        float32
	Trust      cli.TrustOptions
}

func (f *agentFlags) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.Via, "via", viaSSH, "how nodes are reached: ssh (from this machine) or agent (an agent the run starts on each node, docs/agent-mode.md; it makes its agents even for --dry-run)")
	agentQPSFlag(cmd, &f.QPS)
	cmd.Flags().StringVar(&f.Image, "agent-image", "", "with --via agent: the agents' image, REPOSITORY@sha256:DIGEST (default: the one the signed bundle of the upgrade's version names, verified with --key)")
	f.Trust.AddFlags(cmd)
}

func (f *agentFlags) check() error {
	switch f.Via {
	case viaSSH, viaAgent:
	default:
		return cli.Usagef("--via %q: want ssh or agent", f.Via)
	}
	if err := checkAgentQPS(f.QPS); err != nil {
		return err
	}
	if f.Image != "" {
		if f.Via != viaAgent {
			return cli.Usagef("--agent-image without --via agent")
		}
		if _, err := name.NewDigest(f.Image, name.StrictValidation); err != nil {
			return cli.Usagef("--agent-image %q: want REPOSITORY@sha256:DIGEST: %v", f.Image, err)
		}
	}
	return nil
}

// reach reaches the nodes over SSH, or through agents from --agent-image
// or the agent image of the upgrade's version: the one its signed
// bundle names (verified with --key), where import pushed it (the
// record is not signed: nothing it says alone picks the image).
func (f *agentFlags) reach(ctx context.Context, client, steps kubernetes.Interface, nf *cli.NodeFlags, run string) (*reached, error) {
	if f.Via != viaAgent {
		return reachSSH(nf)
	}
	img := f.Image
	if img == "" {
		st, err := record.Read(ctx, client)
		if err != nil {
			return nil, err
		}
		if st == nil {
			return nil, errors.New("--via agent: no upgrade is recorded in this cluster: nothing to follow")
		}
		trust, err := f.Trust.Trust()
		if err != nil {
			return nil, err
		}
		target, err := release.Load(ctx, client, st.To, trust)
		if err != nil {
			return nil, fmt.Errorf("--via agent: the agents' image of %s: %w", st.To, err)
		}
		if img, err = target.AgentImage(image.Repository, target.Record.Registry); err != nil {
			return nil, fmt.Errorf("--via agent: %w (or pass --agent-image)", err)
		}
	}
	return reachAgents(ctx, client, steps, nf, run, img)
}

// adopt, for a run that took over the upgrade's lock from takenOver,
// takes over what that run's agents left (nothing over SSH).
func (r *reached) adopt(ctx context.Context, takenOver string) error {
	if r == nil || r.agents == nil {
		return nil
	}
	return r.agents.Adopt(ctx, access.RunOfHolder(takenOver))
}

// agent is the agents' image, "" over SSH.
func (r *reached) agent() string {
	if r == nil {
		return ""
	}
	return r.Agent
}
