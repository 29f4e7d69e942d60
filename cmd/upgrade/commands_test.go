package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/registry"
)

// parse runs a command's flag handling with run in place of its runX, as
// the GitHub CLI's tests do.
func parse(t *testing.T, mk func(*cli.IO) *cobra.Command, args ...string) error {
	t.Helper()
	s := &cli.IO{In: strings.NewReader(""), Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}
	cmd := mk(s)
	cmd.SetArgs(args)
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	return cmd.ExecuteContext(context.Background())
}

func TestApplyFlags(t *testing.T) {
	var got *applyOptions
	mk := func(s *cli.IO) *cobra.Command {
		return newCmdApply(s, func(_ context.Context, o *applyOptions) error { got = o; return nil })
	}
	if err := parse(t, mk, "--to", "v1.31.4", "--max-unavailable", "25%", "--canary", "--drain", "--drain-timeout", "90s", "--settle", "5s",
		"--nodes", "worker-1,worker-2", "--ignore-preflight", "removed-flags,restarts", "--dry-run", "--health-window", "10s", "-o", "json",
		"--etcd-snapshot-repo", "registry.corp:5000/backups/etcd", "--cache-dir", "/srv/cache"); err != nil {
		t.Fatal(err)
	}
	if s := snapshots(got, registry.Access{}); s.Dir != "/srv/cache/etcd-snapshots" || s.Repository != "registry.corp:5000/backups/etcd" || s.Registry == nil {
		t.Errorf("snapshots %+v", s)
	}
	if got.Cluster.To != "v1.31.4" || got.MaxUnavailable != "25%" || !got.Canary || !got.Drain || got.DrainTimeout != 90*time.Second ||
		got.Settle != 5*time.Second || strings.Join(got.Workers, ",") != "worker-1,worker-2" || strings.Join(got.Ignore, ",") != "removed-flags,restarts" ||
		!got.DryRun || got.HealthWindow != 10*time.Second || got.Output != "json" {
		t.Errorf("parsed %+v", got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--to", "v1.31.4", "--nodes", "worker-1", "--selector", "pool=blue"}, "--nodes and --selector exclude each other"},
		{[]string{"--to", "v1.31.4", "--selector", "pool in (("}, "--selector"},
		{[]string{"--to", "v1.31.4", "--etcd-snapshot-repo", "registry.corp:5000/Backups:latest"}, `--etcd-snapshot-repo "registry.corp:5000/Backups:latest"`},
		{[]string{"--to", "v1.31.4", "--skip-etcd-backup", "--etcd-snapshot-repo", "registry.corp:5000/backups/etcd"}, "--etcd-snapshot-repo with --skip-etcd-backup"},
		{[]string{"--to", "v1.31.4", "--etcd-snapshot-dir", "/srv/keep", "--skip-etcd-backup"}, "--etcd-snapshot-dir with --skip-etcd-backup"},
		{[]string{"--to", "v1.31.4", "--via", "agent", "--etcd-snapshot-dir", "/srv/keep"}, "--etcd-snapshot-dir and --etcd-snapshot-repo with --via agent"},
		{[]string{"--to", "v1.31.4", "--via", "agent", "--etcd-snapshot-repo", "registry.corp:5000/backups/etcd"}, "agent mode keeps the etcd snapshot on its node"},
		{[]string{"--to", "v1.31.4", "--via", "tunnel"}, `staging path "tunnel"`},
		{[]string{"--to", "v1.31.4", "-o", "yaml"}, "yaml"},
		// A lock renewed every third of 2ns panics; one under a second
		// is a Lease of 0 seconds, taken over at once.
		{[]string{"--to", "v1.31.4", "--lock-duration", "2ns"}, "--lock-duration 2ns: at least 3s"},
		{[]string{"--to", "v1.31.4", "--lock-duration", "900ms"}, "--lock-duration 900ms"},
		// Rolls back every component right after its restart.
		{[]string{"--to", "v1.31.4", "--ready-timeout", "-1m"}, "--ready-timeout -1m0s: must be more than 0"},
		{[]string{"--to", "v1.31.4", "--drain-timeout", "0s"}, "--drain-timeout 0s"},
		{[]string{"--to", "v1.31.4", "--settle", "-5s"}, "--settle -5s: must not be negative"},
		{[]string{"--to", "v1.31.4", "--soak", "-1s"}, "--soak -1s"},
		// A check's name mistyped would ignore nothing, silently.
		{[]string{"--to", "v1.31.4", "--ignore-preflight", "removed-flags,removed-flag"}, `--ignore-preflight: no check "removed-flag": the plan runs values, path`},
	} {
		got = nil
		err := parse(t, mk, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || got != nil {
			t.Errorf("%v: %v (ran: %v); want an error saying %q before anything runs", tc.args, err, got != nil, tc.want)
		}
	}
	var ue *cli.UsageError
	if err := parse(t, mk, "--nodes", "a", "--selector", "b=c"); !errors.As(err, &ue) {
		t.Errorf("--nodes with --selector: %v, want a usage error (exit 2)", err)
	}
}

func TestRollbackCleanupVersionsFlags(t *testing.T) {
	var rb *rollbackOptions
	if err := parse(t, func(s *cli.IO) *cobra.Command {
		return newCmdRollback(s, func(_ context.Context, o *rollbackOptions) error { rb = o; return nil })
	}, "--dry-run", "--backup-dir", "/srv/backup", "--ready-timeout", "2m"); err != nil {
		t.Fatal(err)
	}
	if !rb.DryRun || rb.BackupDir != "/srv/backup" || rb.ReadyTimeout != 2*time.Minute {
		t.Errorf("rollback parsed %+v", rb)
	}
	rb = nil
	if err := parse(t, func(s *cli.IO) *cobra.Command {
		return newCmdRollback(s, func(_ context.Context, o *rollbackOptions) error { rb = o; return nil })
	}, "--ready-timeout", "0s"); err == nil || !strings.Contains(err.Error(), "--ready-timeout 0s") || rb != nil {
		t.Errorf("rollback --ready-timeout 0s: %v (ran: %v), want refused before running", err, rb != nil)
	}

	var cl *cleanupOptions
	if err := parse(t, func(s *cli.IO) *cobra.Command {
		return newCmdCompatCleanup(s, func(_ context.Context, o *cleanupOptions) error { cl = o; return nil })
	}, "--dry-run", "--stage-dir", "/srv/stage", "-o", "json"); err != nil {
		t.Fatal(err)
	}
	if !cl.DryRun || cl.StageDir != "/srv/stage" || cl.Output != "json" {
		t.Errorf("cleanup parsed %+v", cl)
	}

	ran := false
	err := parse(t, func(s *cli.IO) *cobra.Command {
		return newCmdVersions(s, func(context.Context, *versionsOptions) error { ran = true; return nil })
	}, "-o", "yaml")
	if err == nil || ran {
		t.Errorf("versions -o yaml: %v (ran: %v), want refused before running", err, ran)
	}
}

// The agent takes its node from the environment its pod gives it, and
// refuses to start without a node's name or the host's root.
func TestAgentFlags(t *testing.T) {
	var got *agentOptions
	mk := func(s *cli.IO) *cobra.Command {
		return newCmdAgent(s, func(_ context.Context, o *agentOptions) error { got = o; return nil })
	}
	root := t.TempDir()
	t.Setenv(nodeNameEnv, "worker-1")
	if err := parse(t, mk, "--root", root); err != nil || got.Node != "worker-1" || got.Root != root || got.StepsDir != "/var/lib/kubelift/agent" {
		t.Fatalf("%v %+v", err, got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--root", root, "--node", ""}, `--node "": a node's name is needed`},
		{[]string{"--root", root, "--node", "Worker_1"}, `--node "Worker_1"`},
		{[]string{"--root", root + "/absent"}, "--root"},
	} {
		got = nil
		if err := parse(t, mk, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) || got != nil {
			t.Errorf("%v: %v (ran: %v), want %q", tc.args, err, got != nil, tc.want)
		}
	}
}
