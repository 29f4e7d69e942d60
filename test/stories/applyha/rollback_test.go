package applyha

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	if r := h.Upgrade(t, pw, append(apply, "--etcd-snapshot-dir", keptSnapshots())...); r.Code != 0 {
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

// keptSnapshots is where the apply after the rollback keeps its etcd
// snapshot off the node, for TestRestoreFromTheSnapshot.
func keptSnapshots() string { return filepath.Join(h.Work, "etcd-snapshots") }

// The snapshot the apply after the rollback kept off its node brings the
// cluster back, following docs/etcd.md ("Restore from the snapshot") over
// SSH as an operator would: every API server, then every member stopped;
// each member's data restored from the copy by the etcd's own etcdutl
// (3.6: etcdctl has no restore), revisions bumped and compacted; the
// members, then the API servers started, the controller managers,
// schedulers and kubelets restarted. The cluster then answers with what
// the snapshot held: that apply's record as it was when the snapshot was
// taken (its tolerations step done, nothing moved yet), not as it ended.
// Every node is Ready again, and no container but CoreDNS's (which that
// apply rolled, and the snapshot's pods are from before) restarted.
func TestRestoreFromTheSnapshot(t *testing.T) {
	copies, err := filepath.Glob(filepath.Join(keptSnapshots(), "cp-1-etcd-snapshot-*.db"))
	if err != nil || len(copies) != 1 {
		t.Fatalf("the snapshot the apply after the rollback kept: %v %v", copies, err)
	}
	snapshot, err := os.ReadFile(copies[0])
	if err != nil {
		t.Fatal(err)
	}
	// The snapshot was taken by the apply after the rollback, once its
	// record was written and before etcd or the control plane moved.
	done := h.Status(t)
	before := map[string]map[string]string{}
	var cps []sandbox.Machine
	for _, m := range h.SB.Nodes() {
		before[m.Name] = h.Running(t, m.Name)
		if m.Role == "control-plane" {
			cps = append(cps, m)
		}
	}
	var initial []string
	for _, m := range cps {
		initial = append(initial, m.Name+"=http://"+m.Address+":2380")
	}
	for _, unit := range []string{"kube-apiserver", "etcd"} {
		for _, m := range cps {
			h.SSH(t, m.Name, "systemctl stop "+unit)
		}
	}
	for _, m := range cps {
		h.SSHInput(t, m.Name, "cat >/var/lib/kubelift/restore.db", bytes.NewReader(snapshot))
		// The data directory may be a mount (it is here, as on a node
		// with a disk for etcd): its member directory is moved aside
		// within it, and the restored one renamed in.
		h.SSH(t, m.Name, "mv /var/lib/etcd/member /var/lib/etcd/member.before-restore && /usr/local/bin/etcdutl snapshot restore /var/lib/kubelift/restore.db --data-dir /var/lib/etcd/restore"+
			" --name "+m.Name+" --initial-advertise-peer-urls http://"+m.Address+":2380 --initial-cluster "+strings.Join(initial, ",")+
			" --initial-cluster-token kubelift-sandbox --bump-revision 1000000000 --mark-compacted"+
			" && mv /var/lib/etcd/restore/member /var/lib/etcd/member && rmdir /var/lib/etcd/restore")
	}
	for _, unit := range []string{"etcd", "kube-apiserver"} {
		for _, m := range cps {
			h.SSH(t, m.Name, "systemctl start "+unit)
		}
	}
	for _, m := range h.SB.Nodes() {
		units := "kubelet"
		if m.Role == "control-plane" {
			units = "kube-controller-manager kube-scheduler kubelet"
		}
		h.SSH(t, m.Name, "systemctl restart "+units)
	}
	harness.Eventually(t, 3*time.Minute, func() (bool, string) {
		st, err := record.Read(context.Background(), h.Client)
		if err != nil || st == nil {
			return false, fmt.Sprintf("the record: %v", err)
		}
		if !st.Started.Equal(done.Started) || st.State != record.StatePatchingWorkloads {
			return false, fmt.Sprintf("the record says %s (started %s), not what the snapshot held: the apply of %s %s", st.State, st.Started, done.Started, record.StatePatchingWorkloads)
		}
		for _, m := range h.SB.Nodes() {
			n, err := h.Client.CoreV1().Nodes().Get(context.Background(), m.Name, metav1.GetOptions{})
			if err != nil || !sandbox.NodeReady(n) {
				return false, fmt.Sprintf("node %s not Ready (%v)", m.Name, err)
			}
		}
		return true, ""
	})
	for _, s := range etcdStatus(t) {
		if s.Version.String() != newEtcd {
			t.Errorf("after the restore member %s runs etcd %s", s.Endpoint, s.Version)
		}
	}
	for _, m := range h.SB.Nodes() {
		now := h.Running(t, m.Name)
		for id, what := range before[m.Name] {
			if _, ok := now[id]; !ok && !rolled(what) {
				t.Errorf("after the restore %s: container %s restarted", m.Name, what)
			}
		}
	}
}
