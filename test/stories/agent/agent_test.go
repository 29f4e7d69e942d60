// Package agent tests agent mode (--via agent, docs/agent-mode.md) on a
// sandbox of its own (1 control plane, 3 workers, containerd): every
// node's sshd is stopped before the bundle is imported, and the cluster
// is planned, upgraded, rolled back and resumed through the agents the
// runs start on its nodes; one agent is deleted, and one node's
// containerd restarted, in the middle of their kubelet steps, and the
// admin process is killed. What the test reads of the nodes it reads
// from the API while sshd is down.
package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/agent/access"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/test/env/harness"
	"github.com/kubelift/kubelift/test/env/prober"
)

var h *harness.Harness

func TestMain(m *testing.M) {
	harness.Main(m, "kag", "10.92.0", 1, 3, func(x *harness.Harness) { h = x }, harness.Agent())
}

// agentFlags are an upgrade's flags in agent mode: no SSH flag, the
// registry's (nodes pull their files with its password: it takes no
// token).
func agentFlags() ([]string, string) {
	reg, pw := h.RegistryFlags()
	return append([]string{"--to", h.SB.NewVersion, "--key", h.Key(), "--via", "agent", "--node-credentials", "password"}, reg...), pw
}

// nothingLeft checks that the run left no agent pod and no step request.
func nothingLeft(t *testing.T, after string) {
	t.Helper()
	ctx := context.Background()
	harness.Eventually(t, time.Minute, func() (bool, string) {
		pods, err := h.Client.CoreV1().Pods(agent.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		n := 0
		all, err := h.Client.CoreV1().Secrets(agent.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, s := range all.Items {
			if s.Type == agent.SecretType {
				n++
			}
		}
		return len(pods.Items) == 0 && n == 0, fmt.Sprintf("after %s: %d agent pods, %d step requests left", after, len(pods.Items), n)
	})
}

// startApply starts apply over agents; the test's end stops it (by pid)
// where the test has not waited for it. The channel says its exit.
func startApply(t *testing.T, extra ...string) (*exec.Cmd, *strings.Builder, <-chan error) {
	t.Helper()
	flags, pw := agentFlags()
	cmd, lines, err := h.StartLines(pw, append(append([]string{"apply", "--settle", "5s", "--lock-duration", "15s", "--restore-labels"}, flags...), extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	// said is written until the program closes its standard error, and
	// read once it has exited.
	said := &strings.Builder{}
	exited, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		for l := range lines {
			said.WriteString(l + "\n")
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return cmd, said, exited
}

// kill kills cmd (SIGKILL) and waits for it to end.
func kill(t *testing.T, cmd *exec.Cmd, exited <-chan error) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("the killed apply did not end within a minute")
	}
}

// bound is how long a test waits for a run to reach a point.
const bound = 15 * time.Minute

// An apply killed (SIGKILL) right after it recorded the upgrade, before
// the control plane moves, leaves its agents; a rollback over agents
// (their image from the signed bundle, --key) takes them over and puts
// the upgrade back, with nothing left behind.
func TestKilledApplyRolledBackOverAgents(t *testing.T) {
	ctx := context.Background()
	h.StopSSH(t)
	h.Import(t, h.HashSkipBundle)
	before := h.APIContainers(t)

	flags, pw := agentFlags()
	plan := h.Upgrade(t, pw, append([]string{"plan"}, flags...)...)
	// Blocked by the sandbox's pod whose node lost a label (apply
	// --restore-labels puts it back), and by nothing else: every node
	// was read through its agent.
	var blocking []string
	for _, l := range strings.Split(plan.Stdout, "\n") {
		if strings.Contains(l, "BLOCKING") {
			blocking = append(blocking, l)
		}
	}
	if plan.Code != 4 || len(blocking) != 1 || !strings.Contains(blocking[0], "readmission") {
		t.Fatalf("plan --via agent: exit %d, blocking %q, want 4 and the readmission finding alone\n%s%s", plan.Code, blocking, plan.Stdout, plan.Stderr)
	}
	for _, m := range h.SB.Nodes() {
		if !strings.Contains(plan.Stdout, m.Name) {
			t.Errorf("the plan does not name %s:\n%s", m.Name, plan.Stdout)
		}
	}
	for _, want := range []string{"Agent mode (--via agent) makes", "ValidatingAdmissionPolicy", "kubelift-agent@sha256:", "no create, no delete"} {
		if !strings.Contains(plan.Stdout, want) {
			t.Errorf("the plan does not say %q:\n%s", want, plan.Stdout)
		}
	}
	nothingLeft(t, "plan")

	cmd, said, exited := startApply(t)
	for recorded, until := false, time.Now().Add(bound); !recorded; {
		if time.Now().After(until) {
			t.Fatalf("apply did not record the upgrade within %s:\n(its transcript follows the test's end)", bound)
		}
		select {
		case err := <-exited:
			t.Fatalf("apply ended (%v) before it recorded the upgrade:\n%s", err, said.String())
		case <-time.After(50 * time.Millisecond):
		}
		st, err := record.Read(ctx, h.Client)
		recorded = err == nil && st != nil && st.To == h.SB.NewVersion
	}
	kill(t, cmd, exited)
	pods, err := h.Client.CoreV1().Pods(agent.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("the killed run left no agents: %d pods, %v", len(pods.Items), err)
	}
	rb := h.Upgrade(t, "", "rollback", "--via", "agent", "--key", h.Key())
	if rb.Code != 0 {
		t.Fatalf("rollback --via agent: exit %d\n%s%s\nthe killed apply said:\n%s", rb.Code, rb.Stdout, rb.Stderr, said.String())
	}
	if st, err := record.Read(ctx, h.Client); err != nil || st == nil || st.State != record.StateRolledBack {
		t.Fatalf("record after the rollback: %+v, %v", st, err)
	}
	h.NodesAt(t, h.SB.OldVersion, "rollback")
	h.SameAPIContainers(t, before, "rollback")
	nothingLeft(t, "rollback")
}

// The whole upgrade with no sshd on any node, through agents: worker-1's
// agent pod deleted, and worker-2's containerd restarted, in their
// kubelet steps (the run makes the pod again and goes on); the admin
// process killed once worker-2 is done, and apply run again to finish;
// every node at the target, no container restarted, the prober saw no
// request fail, and nothing is left.
func TestUpgradeWithoutSSH(t *testing.T) {
	ctx := context.Background()
	h.StopSSH(t)
	before := h.APIContainers(t)
	targets, err := h.SB.ProbeTargets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	probe, err := prober.Start(ctx, prober.Config{Targets: targets, Rate: 10, Streams: 1})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			probe.Stop()
		}
	}()

	cmd, said, exited := startApply(t)
	deleted, revived, restarted, killed := "", "", false, false
	pods := h.Client.CoreV1().Pods(agent.Namespace)
	podName := access.AgentPod("", "worker-1", "").Name
	for until := time.Now().Add(bound); !killed; {
		if time.Now().After(until) {
			t.Fatalf("worker-2 was not done within %s (agent pod deleted %q, made again %q, containerd restarted %v)", bound, deleted, revived, restarted)
		}
		select {
		case err := <-exited:
			t.Fatalf("apply ended (%v) before worker-2 was done (agent pod deleted %q, made again %q, containerd restarted %v):\n%s",
				err, deleted, revived, restarted, said.String())
		case <-time.After(100 * time.Millisecond):
		}
		if deleted != "" && revived == "" {
			if p, err := pods.Get(ctx, podName, metav1.GetOptions{}); err == nil && string(p.UID) != deleted {
				revived = string(p.UID)
			}
		}
		st, err := record.Read(ctx, h.Client)
		if err != nil || st == nil {
			continue
		}
		for _, n := range st.Nodes {
			switch {
			case n.Name == "worker-1" && deleted == "" && n.Status == record.NodeUpgrading && n.Step == "kubelet":
				p, err := pods.Get(ctx, podName, metav1.GetOptions{})
				if err != nil {
					t.Fatalf("worker-1 in its kubelet step has no agent pod: %v", err)
				}
				if err := pods.Delete(ctx, podName, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				deleted = string(p.UID)
				t.Logf("worker-1's agent pod %s deleted in its kubelet step", deleted)
			case n.Name == "worker-2" && !restarted && n.Status == record.NodeUpgrading && n.Step == "kubelet":
				m, err := h.SB.Machine("worker-2")
				if err != nil {
					t.Fatal(err)
				}
				if out, err := h.SB.Command(*m, "systemctl", "restart", "containerd").CombinedOutput(); err != nil {
					t.Fatalf("worker-2: systemctl restart containerd: %v: %s", err, out)
				}
				restarted = true
				t.Log("worker-2's containerd restarted in its kubelet step")
			case n.Name == "worker-2" && n.Status == record.NodeDone && !killed:
				kill(t, cmd, exited)
				killed = true
				t.Log("apply killed (SIGKILL) once worker-2 was done")
			}
		}
	}
	if deleted == "" || revived == "" || !restarted {
		t.Fatalf("the test saw no kubelet step to disturb (agent pod deleted %q, made again %q, containerd restarted %v)\n%s", deleted, revived, restarted, said.String())
	}
	if l, err := pods.List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) == 0 {
		t.Fatalf("the killed run left no agents: %v", err)
	}
	flags, pw := agentFlags()
	res := h.Upgrade(t, pw, append([]string{"apply", "--settle", "5s", "--lock-duration", "15s", "--restore-labels"}, flags...)...)
	if res.Code != 0 {
		t.Fatalf("apply --via agent after the kill: exit %d\n%s%s\nthe killed apply said:\n%s", res.Code, res.Stdout, res.Stderr, said.String())
	}
	pr := probe.Stop()
	stopped = true

	st, err := record.Read(ctx, h.Client)
	if err != nil || st == nil || st.State != record.StateComplete {
		t.Fatalf("record after apply: %+v, %v", st, err)
	}
	h.NodesAt(t, h.SB.NewVersion, "apply")
	h.SameAPIContainers(t, before, "apply")
	h.NoDisruption(t, pr)
	nothingLeft(t, "apply")

	// compat cleanup over agents reads every node's hash-skip file and
	// containers (a dry run: it removes nothing).
	cl := h.Upgrade(t, "", "compat", "cleanup", "--via", "agent", "--key", h.Key(), "--dry-run", "-o", "json")
	var nodes []struct {
		Node  string `json:"node"`
		File  bool   `json:"file"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(cl.Stdout), &nodes); cl.Code != 0 || err != nil || len(nodes) != len(h.SB.Nodes()) {
		t.Fatalf("compat cleanup --via agent --dry-run: exit %d, %v\n%s%s", cl.Code, err, cl.Stdout, cl.Stderr)
	}
	for _, n := range nodes {
		if !n.File || n.Error != "" {
			t.Errorf("compat cleanup over agents on %s: %+v, want the hash-skip file apply wrote read through the agent", n.Node, n)
		}
	}
	nothingLeft(t, "compat cleanup")
}
