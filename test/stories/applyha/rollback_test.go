package applyha

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/test/env/harness"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

// components lists what runs on each node of the sandbox.
func components(m sandbox.Machine) []string {
	if m.Role == "control-plane" {
		return []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"}
	}
	return []string{"kubelet", "kube-proxy"}
}

// expectEverywhere checks every component of every node runs version, the
// Nodes report it Ready, and no container that ran before has gone.
func expectEverywhere(t *testing.T, version string, before map[string]map[string]string) {
	t.Helper()
	for _, m := range h.SB.Nodes() {
		// A unit restarted by the upgrade (or by its own Restart=, as a
		// controller manager that lost its API server is) settles: each
		// check waits for it, with a deadline.
		for _, c := range components(m) {
			harness.Eventually(t, 2*time.Minute, func() (bool, string) {
				got, err := h.RunningVersion(m.Name, c)
				return err == nil && got == version, fmt.Sprintf("%s: %s runs %q (%v), want %s", m.Name, c, got, err, version)
			})
		}
		harness.Eventually(t, 2*time.Minute, func() (bool, string) {
			n := h.Node(t, m.Name)
			return n.Status.NodeInfo.KubeletVersion == version && sandbox.NodeReady(n),
				fmt.Sprintf("%s: Node reports kubelet %s, ready %v", m.Name, n.Status.NodeInfo.KubeletVersion, sandbox.NodeReady(n))
		})
		now := h.Running(t, m.Name)
		for id, what := range before[m.Name] {
			if _, ok := now[id]; !ok && !rolled(what) {
				t.Errorf("%s: container %s (%s) no longer runs", m.Name, what, id)
			}
		}
	}
}

// TestRolledBackThenAppliedAgain goes on from where
// TestNoKubeletRestartsBeforeEveryAPIServerRunsTheTarget ends (its
// cluster rolled back from v1.31.14 to v1.31.4, every binary restored
// from the nodes' backups): the rollback is recorded, a second one finds
// nothing to restore, and apply runs again from a fresh record with an
// etcd snapshot of its own, no container restarted either way.
func TestRolledBackThenAppliedAgain(t *testing.T) {
	from := h.SB.OldVersion
	first := h.Status(t)
	if first.State != record.StateRolledBack {
		t.Fatalf("the test before left the upgrade %s; this one goes on from its rollback", first.State)
	}
	before := map[string]map[string]string{}
	for _, m := range h.SB.Nodes() {
		before[m.Name] = h.Running(t, m.Name)
		if m.Role != "control-plane" && len(before[m.Name]) == 0 {
			t.Fatalf("%s runs no containers: nothing to check", m.Name)
		}
	}
	if first.From != from || first.To != h.SB.NewVersion || first.Backup == "" {
		t.Errorf("status after rollback: %s -> %s, etcd snapshot %q", first.From, first.To, first.Backup)
	}
	if len(first.Nodes) != len(h.SB.Nodes()) {
		t.Errorf("status after rollback lists %d nodes, want %d", len(first.Nodes), len(h.SB.Nodes()))
	}
	for _, n := range first.Nodes {
		if n.Status != record.NodeRolledBack {
			t.Errorf("status after rollback: %s is %s", n.Name, n.Status)
		}
	}
	for _, m := range h.SB.Nodes() {
		if a := h.Node(t, m.Name).Annotations[inplace.AnnotationUpgradedTo]; a != "" {
			t.Errorf("%s still annotated upgraded to %s", m.Name, a)
		}
	}
	// A second rollback finds nothing left to restore and changes nothing.
	if r := h.Upgrade(t, "", append([]string{"rollback"}, h.SSHFlags()...)...); r.Code != 0 || strings.Contains(r.Stderr, "rolling back") {
		t.Fatalf("second rollback: exit %d (or it restored something)\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	expectEverywhere(t, from, before)

	// Forward again: the same bundle, the same containers.
	reg, pw := h.RegistryFlags()
	apply := append(append([]string{"apply", "--to", h.SB.NewVersion, "--key", h.Key(), "--settle", "5s", "--restore-labels", "--max-unavailable", "2"}, reg...), h.SSHFlags()...)
	if r := h.Upgrade(t, pw, apply...); r.Code != 0 {
		t.Fatalf("apply after rollback: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	h.SteadyControlPlane(t, h.SB.NewVersion)
	expectEverywhere(t, h.SB.NewVersion, before)
	coreDNSRuns(t, newCoreDNS)
	second := h.Status(t)
	if second.State != record.StateComplete {
		t.Errorf("status after the second apply: %s", second.State)
	}
	// A fresh record, with an etcd snapshot of its own.
	if !second.Started.After(first.Started) || second.Backup == "" || second.Backup == first.Backup {
		t.Errorf("the apply after the rollback continued the old record: started %s (first %s), snapshot %q (first %q)",
			second.Started, first.Started, second.Backup, first.Backup)
	}
}
