package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/upgradeapi"
)

// inClusterFlags are apply's flags for the controller's way.
type inClusterFlags struct {
	InCluster  bool
	Detach     bool
	Name       string
	Paused     bool
	Window     string
	WindowDays []string
	// Dynamic makes the client of Upgrades (from the cluster flags
	// unless a test sets it).
	Dynamic func() (dynamic.Interface, error)
}

func (f *inClusterFlags) addFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.BoolVar(&f.InCluster, "in-cluster", false, "do not run here: write an Upgrade (kubelift.dev) that the cluster's controller runs ('upgrade controller install'), then follow it; this machine may go away")
	fs.BoolVar(&f.Detach, "detach", false, "with --in-cluster: write the Upgrade and return; 'upgrade status' follows it")
	fs.StringVar(&f.Name, "name", "", "with --in-cluster: the Upgrade's name (default: the version, e.g. v1.31.4)")
	fs.BoolVar(&f.Paused, "paused", false, "with --in-cluster: write it paused (spec.paused; set it false to start)")
	fs.StringVar(&f.Window, "window", "", "with --in-cluster: a maintenance window START-END in UTC, e.g. 22:00-04:00; outside it the run holds before its next node")
	fs.StringSliceVar(&f.WindowDays, "window-days", nil, "with --window: the days it opens on (Mon ... Sun; default every day)")
}

// notInCluster are the flags apply --in-cluster does not take: the
// controller runs in its pod, over agents, with the key and registry it
// was installed with.
var notInCluster = []string{"via", "agent-qps", "codec", "node-credentials", "pre-hook", "post-hook", "etcd-snapshot-dir", "etcd-snapshot-repo",
	"kubeadm-config", "dry-run", "soak", "skip-etcd-backup", "lock-duration", "backup-dir", "stage-dir", "cache-dir", "catalog",
	"domain", "username", "password", "password-stdin", "credential-helper", "ca-file", "insecure-skip-tls-verify", "plain-http", "key", "allow-unsigned",
	"inventory", "ssh-user", "ssh-key", "known-hosts", "ssh-port", "ssh-jump", "ssh-timeout", "parallel", "health-window", "no-workload-gate", "quiet"}

// checkInCluster refuses apply's flags that --in-cluster cannot pass on,
// and the in-cluster flags without it.
func checkInCluster(cmd *cobra.Command, f *inClusterFlags) error {
	if !f.InCluster {
		for _, name := range []string{"detach", "name", "paused", "window", "window-days"} {
			if cmd.Flags().Changed(name) {
				return cli.Usagef("--%s needs --in-cluster", name)
			}
		}
		return nil
	}
	for _, name := range notInCluster {
		if fl := cmd.Flags().Lookup(name); fl != nil && fl.Changed {
			return cli.Usagef("--%s with --in-cluster: the controller runs over agents with the key and registry it was installed with ('upgrade controller install')", name)
		}
	}
	if f.Window == "" && len(f.WindowDays) > 0 {
		return cli.Usagef("--window-days needs --window")
	}
	return nil
}

// upgradeSpec is the Upgrade apply's flags declare.
func (opts *applyOptions) upgradeSpec(f *inClusterFlags) (upgradeapi.Spec, error) {
	spec := upgradeapi.Spec{Version: opts.Cluster.To, MaxUnavailable: opts.MaxUnavailable, Canary: opts.Canary, Nodes: opts.Workers,
		Selector: opts.Selector, Settle: opts.Settle.String(), ReadyTimeout: opts.ReadyTimeout.String(), Drain: opts.Drain,
		DrainTimeout: opts.DrainTimeout.String(), RestoreLabels: opts.RestoreLabels, AllowRestarts: opts.AllowRestarts,
		IgnorePreflight: opts.Ignore, Paused: f.Paused}
	if f.Window != "" {
		start, end, ok := strings.Cut(f.Window, "-")
		if !ok {
			return spec, cli.Usagef("--window %q: want START-END, e.g. 22:00-04:00", f.Window)
		}
		spec.Window = &upgradeapi.MaintenanceWindow{Days: f.WindowDays, Start: start, End: end}
	}
	if _, err := spec.Check(); err != nil {
		if spec.Window != nil && strings.Contains(err.Error(), "spec.window") {
			return spec, cli.Usagef("--window %s --window-days %s: %v", f.Window, strings.Join(f.WindowDays, ","), err)
		}
		return spec, cli.Usagef("%v", err)
	}
	return spec, nil
}

// applyInCluster writes the Upgrade apply's flags declare (or finds the
// one of that name: running it again follows it), then follows it
// unless --detach.
func applyInCluster(ctx context.Context, opts *applyOptions) error {
	if opts.Cluster.To == "" {
		return cli.Usagef("--to VERSION is required")
	}
	spec, err := opts.upgradeSpec(&opts.InCluster)
	if err != nil {
		return err
	}
	dyn, err := opts.InCluster.Dynamic()
	if err != nil {
		return err
	}
	c := upgradeapi.Client{Dynamic: dyn}
	name := opts.InCluster.Name
	if name == "" {
		name = spec.Version
	}
	u, err := c.Get(ctx, name)
	switch {
	case err != nil:
		return fmt.Errorf("%w (is the controller installed? 'upgrade controller install')", err)
	case u == nil:
		if u, err = c.Create(ctx, &upgradeapi.Upgrade{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}); err != nil {
			return err
		}
		fmt.Fprintf(opts.IO.ErrOut, "upgrade %s written: the controller runs it\n", name)
	case u.Spec.Version != spec.Version:
		return cli.Usagef("upgrade %s exists and is to %s, not %s: give another --name", name, u.Spec.Version, spec.Version)
	case u.Status.Phase == upgradeapi.Failed:
		// Running apply again after a failure retries, with the policy
		// given now and the next attempt: a new generation.
		message := u.Status.Message
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			now, err := c.Get(ctx, name)
			if err != nil || now == nil {
				return cmp.Or(err, fmt.Errorf("upgrade %s: deleted", name))
			}
			spec.Attempt = now.Spec.Attempt + 1
			now.Spec = spec
			u, err = c.Update(ctx, now)
			return err
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(opts.IO.ErrOut, "upgrade %s failed before (%s): written again (attempt %d), the controller retries it\n", name, message, spec.Attempt)
	default:
		fmt.Fprintf(opts.IO.ErrOut, "upgrade %s exists (%s): following it\n", name, orDash(u.Status.Phase))
	}
	if opts.InCluster.Detach {
		fmt.Fprintf(opts.IO.Out, "upgrade %s: follow it with 'upgrade status --watch' or 'kubectl get upgrades'\n", name)
		return nil
	}
	return follow(ctx, c, name, u.Generation, opts.IO.Out, time.Second)
}

// errUpgradeFailed: the followed Upgrade failed (its status says why).
var errUpgradeFailed = errors.New("the upgrade failed")

// follow prints an Upgrade's changes, a line per node step, until it
// ends (at generation or later): nil when complete, an error naming the
// failed node and step otherwise.
func follow(ctx context.Context, c upgradeapi.Client, name string, generation int64, w io.Writer, every time.Duration) error {
	var last *upgradeapi.Upgrade
	for {
		u, err := c.Get(ctx, name)
		switch {
		case err != nil:
			fmt.Fprintf(w, "%s  %v (looking again)\n", time.Now().UTC().Format(time.TimeOnly), err) // the API may be restarting
		case u == nil:
			return fmt.Errorf("upgrade %s: deleted", name)
		default:
			printChanges(w, last, u)
			last = u
			if u.Status.ObservedGeneration >= generation && u.Status.Phase == upgradeapi.Complete {
				return nil
			}
			if u.Status.ObservedGeneration >= generation && u.Status.Phase == upgradeapi.Failed {
				f := u.Status.LastError
				if f == nil {
					return fmt.Errorf("upgrade %s: %w", name, errUpgradeFailed)
				}
				if f.Node != "" {
					return fmt.Errorf("upgrade %s: %w: node %s, step %s: %s", name, errUpgradeFailed, f.Node, f.Step, f.Reason)
				}
				return fmt.Errorf("upgrade %s: %w: %s", name, errUpgradeFailed, f.Reason)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}

// printChanges prints what changed from before to u: its phase, and
// each node's status and step.
func printChanges(w io.Writer, before, u *upgradeapi.Upgrade) {
	at := time.Now().UTC().Format(time.TimeOnly)
	if before == nil || before.Status.Phase != u.Status.Phase || before.Status.Message != u.Status.Message {
		line := fmt.Sprintf("%s  upgrade %s: %s", at, u.Name, orDash(u.Status.Phase))
		if u.Status.Progress != "" {
			line += " (" + u.Status.Progress + " nodes)"
		}
		if u.Status.Message != "" {
			line += ": " + u.Status.Message
		}
		fmt.Fprintln(w, line)
	}
	was := map[string]upgradeapi.NodeStatus{}
	if before != nil {
		for _, n := range before.Status.Nodes {
			was[n.Name] = n
		}
	}
	for _, n := range u.Status.Nodes {
		p, ok := was[n.Name]
		if ok && p.Status == n.Status && p.Step == n.Step && p.Version == n.Version {
			continue
		}
		line := fmt.Sprintf("%s  %s: %s", at, n.Name, n.Status)
		if n.Step != "" {
			line += ", " + n.Step
		}
		if n.Version != "" {
			line += " (kubelet " + n.Version + ")"
		}
		if n.LastError != "" {
			line += ": " + n.LastError
		}
		fmt.Fprintln(w, line)
	}
}
