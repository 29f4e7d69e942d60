// Package agent tests agent mode (--via agent, docs/agent-mode.md) on a
// sandbox of its own (1 control plane, 3 workers, containerd): every
// node's sshd is stopped before the bundle is imported, and the cluster
// is planned and upgraded through the agents the run starts on its
// nodes, one of them deleted, and one node's containerd restarted, in
// the middle of the kubelet step. What the test reads of the nodes it
// reads from the API while sshd is down.
package agent

import (
	"context"
	"fmt"
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

// containers is every container of every pod the API lists, as the
// kubelet reports it (namespace/pod/container -> ID and restarts).
func containers(t *testing.T) map[string]string {
	t.Helper()
	pods, err := h.Client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.Namespace == agent.Namespace {
			continue // the run's own
		}
		for _, c := range p.Status.ContainerStatuses {
			out[p.Namespace+"/"+p.Name+"/"+c.Name] = fmt.Sprintf("%s restarts=%d", c.ContainerID, c.RestartCount)
		}
	}
	return out
}

// stopSSH stops sshd on every node, from each node's console (the
// sandbox's service manager), and starts it again when the test ends.
func stopSSH(t *testing.T) {
	t.Helper()
	for _, m := range h.SB.Nodes() {
		if out, err := h.SB.Command(m, "systemctl", "stop", "ssh").CombinedOutput(); err != nil {
			t.Fatalf("%s: systemctl stop ssh: %v: %s", m.Name, err, out)
		}
		t.Cleanup(func() {
			if out, err := h.SB.Command(m, "systemctl", "start", "ssh").CombinedOutput(); err != nil {
				t.Errorf("%s: systemctl start ssh: %v: %s", m.Name, err, out)
			}
		})
		if _, err := h.TrySSH(m.Name, "true"); err == nil {
			t.Fatalf("%s still answers SSH", m.Name)
		}
	}
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

// The whole upgrade with no sshd on any node: plan and apply through the
// agents; an agent's pod deleted, and another node's containerd
// restarted, in their kubelet steps; every node at the target, no
// container restarted, and the prober saw no request fail.
func TestUpgradeWithoutSSH(t *testing.T) {
	ctx := context.Background()
	stopSSH(t)
	h.Import(t, h.HashSkipBundle)
	before := containers(t)
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

	cmd, lines, err := h.StartLines(pw, append([]string{"apply", "--settle", "5s", "--lock-duration", "15s", "--restore-labels"}, flags...)...)
	if err != nil {
		t.Fatal(err)
	}
	var said strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		for l := range lines {
			said.WriteString(l + "\n")
		}
	}()
	waited := false
	t.Cleanup(func() {
		if !waited { // a failed check below: the run is stopped, by pid
			_ = cmd.Process.Kill()
			<-done
			_ = cmd.Wait()
		}
	})
	// worker-1's agent pod deleted, and worker-2's containerd
	// restarted, once their kubelet step has begun; the run makes the
	// pod again (another UID) while it waits for worker-1's answer.
	deleted, revived, restarted := "", "", false
	pods := h.Client.CoreV1().Pods(agent.Namespace)
	podName := access.AgentPod("", "worker-1", "").Name
	for ended := false; !ended; {
		select {
		case <-done:
			ended = true
			continue
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
			if n.Status != record.NodeUpgrading || n.Step != "kubelet" {
				continue
			}
			switch {
			case n.Name == "worker-1" && deleted == "":
				p, err := pods.Get(ctx, podName, metav1.GetOptions{})
				if err != nil {
					t.Fatalf("worker-1 in its kubelet step has no agent pod: %v", err)
				}
				if err := pods.Delete(ctx, podName, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				deleted = string(p.UID)
				t.Logf("worker-1's agent pod %s deleted in its kubelet step", deleted)
			case n.Name == "worker-2" && !restarted:
				m, err := h.SB.Machine("worker-2")
				if err != nil {
					t.Fatal(err)
				}
				if out, err := h.SB.Command(*m, "systemctl", "restart", "containerd").CombinedOutput(); err != nil {
					t.Fatalf("worker-2: systemctl restart containerd: %v: %s", err, out)
				}
				restarted = true
				t.Log("worker-2's containerd restarted in its kubelet step")
			}
		}
	}
	waited = true
	if err := cmd.Wait(); err != nil {
		t.Fatalf("apply --via agent: %v\n%s", err, said.String())
	}
	if deleted == "" || revived == "" || !restarted {
		t.Fatalf("the test saw no kubelet step to disturb (agent pod deleted %q, made again %q, containerd restarted %v)\n%s", deleted, revived, restarted, said.String())
	}
	res := probe.Stop()
	stopped = true

	st, err := record.Read(ctx, h.Client)
	if err != nil || st == nil || st.State != record.StateComplete {
		t.Fatalf("record after apply: %+v, %v", st, err)
	}
	nodesAt(t, h.SB.NewVersion, "apply")
	sameContainers(t, before, "apply")
	h.NoDisruption(t, res)
	nothingLeft(t, "apply")
}

// nodesAt checks every node's kubelet is at version and none is left
// cordoned.
func nodesAt(t *testing.T, version, after string) {
	t.Helper()
	nodes, err := h.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if v := n.Status.NodeInfo.KubeletVersion; v != version {
			t.Errorf("%s: kubelet %s after %s, want %s", n.Name, v, after, version)
		}
		if n.Spec.Unschedulable {
			t.Errorf("%s is left cordoned after %s", n.Name, after)
		}
	}
}

// sameContainers checks that no container of before was restarted or
// replaced (the control plane's mirror pods aside: their containers are
// no runtime's the API reports).
func sameContainers(t *testing.T, before map[string]string, after string) {
	t.Helper()
	now := containers(t)
	for k, v := range before {
		if strings.HasPrefix(k, "kube-system/kube-") && !strings.HasPrefix(k, "kube-system/kube-proxy") {
			continue
		}
		if now[k] != v {
			t.Errorf("container %s after %s: %s before, %q now", k, after, v, now[k])
		}
	}
}

// Over agents, with sshd stopped again: rollback (the agents' image from
// the upgrade's record) puts every node back; an apply killed (SIGKILL)
// mid-run leaves its agents, and the next apply takes them over and
// finishes; no container restarted, nothing left.
func TestRollbackAndResumeOverAgents(t *testing.T) {
	ctx := context.Background()
	st, err := record.Read(ctx, h.Client)
	if err != nil || st == nil || st.State != record.StateComplete {
		t.Fatalf("this test follows TestUpgradeWithoutSSH's complete upgrade; the record: %+v, %v", st, err)
	}
	stopSSH(t)
	before := containers(t)
	rb := h.Upgrade(t, "", "rollback", "--via", "agent", "--key", h.Key())
	if rb.Code != 0 {
		t.Fatalf("rollback --via agent: exit %d\n%s%s", rb.Code, rb.Stdout, rb.Stderr)
	}
	nodesAt(t, h.SB.OldVersion, "rollback")
	sameContainers(t, before, "rollback")
	nothingLeft(t, "rollback")

	flags, pw := agentFlags()
	cmd, stderr, err := h.Start(pw, append([]string{"apply", "--settle", "5s", "--lock-duration", "15s"}, flags...)...)
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	for !killed {
		select {
		case err := <-exited:
			killed = true // it is gone: nothing to stop at the cleanup
			t.Fatalf("apply ended (%v) before worker-1 was done:\n%s", err, stderr.String())
		case <-time.After(100 * time.Millisecond):
		}
		st, err := record.Read(ctx, h.Client)
		if err != nil || st == nil || st.To != h.SB.NewVersion || st.State == record.StateRolledBack {
			continue
		}
		for _, n := range st.Nodes {
			if n.Name == "worker-1" && n.Status == record.NodeDone && !killed {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				<-exited
				killed = true
			}
		}
	}
	pods, err := h.Client.CoreV1().Pods(agent.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("the killed run left no agents: %d pods, %v", len(pods.Items), err)
	}
	res := h.Upgrade(t, pw, append([]string{"apply", "--settle", "5s", "--lock-duration", "15s"}, flags...)...)
	if res.Code != 0 {
		t.Fatalf("apply --via agent after the kill: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
	nodesAt(t, h.SB.NewVersion, "the resumed apply")
	sameContainers(t, before, "the resumed apply")
	nothingLeft(t, "the resumed apply")
}
