// Package rollback tests upgrade rollback end to end on a sandbox of its
// own whose nodes start at v1.31.4: a patch upgrade to v1.31.14 applied,
// then rolled back from the nodes' backups (the catalog lists v1.31.4
// among v1.31.14's downgrades), with no container restarted either way,
// and applied again after.
package rollback

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

// from is a patch below the sandbox's new version, v1.31.4.
const from = "v1.31.4"

// to is the sandbox's new version: the catalog's newest v1.31, also the
// hop of test/stories/multihop, so no release is built for this story alone.
const to = "v1.31.14"

var h *harness.Harness

func TestMain(m *testing.M) {
	harness.Main(m, "klr", "10.87.0", 1, 2, func(x *harness.Harness) {
		h = x
	}, harness.From(from), harness.Target(to))
}

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
			if _, ok := now[id]; !ok {
				t.Errorf("%s: container %s (%s) no longer runs", m.Name, what, id)
			}
		}
	}
}

func TestPatchUpgradeRolledBackAndAppliedAgain(t *testing.T) {
	if r := h.Upgrade(t, "", append([]string{"rollback"}, h.SSHFlags()...)...); r.Code != 1 || !strings.Contains(r.Stderr, "no upgrade is recorded") {
		t.Fatalf("rollback before any upgrade: exit %d\n%s", r.Code, r.Stderr)
	}
	h.Import(t, h.HashSkipBundle)
	before := map[string]map[string]string{}
	for _, m := range h.SB.Nodes() {
		before[m.Name] = h.Running(t, m.Name)
		if m.Role != "control-plane" && len(before[m.Name]) == 0 {
			t.Fatalf("%s runs no containers: nothing to check", m.Name)
		}
	}
	reg, pw := h.RegistryFlags()
	apply := append(append([]string{"apply", "--to", h.SB.NewVersion, "--key", h.Key(), "--settle", "5s", "--restore-labels"}, reg...), h.SSHFlags()...)
	if r := h.Upgrade(t, pw, apply...); r.Code != 0 {
		t.Fatalf("apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	expectEverywhere(t, h.SB.NewVersion, before)
	first := h.Status(t)
	if first.Backup == "" {
		t.Errorf("the first apply recorded no etcd snapshot: %+v", first)
	}

	// The API server moved, but v1.31.4 is a patch downgrade of v1.31.14:
	// rollback restores every binary from the backups.
	r := h.Upgrade(t, "", append([]string{"rollback"}, h.SSHFlags()...)...)
	if r.Code != 0 {
		t.Fatalf("rollback: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	h.SteadyControlPlane(t, from)
	expectEverywhere(t, from, before)
	st := h.Status(t)
	if st.State != record.StateRolledBack || st.From != from || st.To != h.SB.NewVersion {
		t.Errorf("status after rollback: state %s, %s -> %s", st.State, st.From, st.To)
	}
	if len(st.Nodes) != len(h.SB.Nodes()) {
		t.Errorf("status after rollback lists %d nodes, want %d", len(st.Nodes), len(h.SB.Nodes()))
	}
	for _, n := range st.Nodes {
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
	if r := h.Upgrade(t, pw, apply...); r.Code != 0 {
		t.Fatalf("apply after rollback: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	expectEverywhere(t, h.SB.NewVersion, before)
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
