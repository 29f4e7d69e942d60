package harness

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/agent"
)

// APIContainers is every container of every pod the API lists outside
// agent mode's namespace, as the kubelet reports it (namespace/pod/name
// -> ID and restarts): what a story reads of the nodes while their sshd
// is stopped.
func (h *Harness) APIContainers(t *testing.T) map[string]string {
	t.Helper()
	pods, err := h.Client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.Namespace == agent.Namespace {
			continue // kubelift's own: the agents and the controller
		}
		for _, c := range p.Status.ContainerStatuses {
			out[p.Namespace+"/"+p.Name+"/"+c.Name] = fmt.Sprintf("%s restarts=%d", c.ContainerID, c.RestartCount)
		}
	}
	return out
}

// SameAPIContainers checks that no container of before (APIContainers)
// was restarted or replaced (the control plane's mirror pods aside:
// their containers are no runtime's the API reports).
func (h *Harness) SameAPIContainers(t *testing.T, before map[string]string, after string) {
	t.Helper()
	now := h.APIContainers(t)
	for k, v := range before {
		if strings.HasPrefix(k, "kube-system/kube-") && !strings.HasPrefix(k, "kube-system/kube-proxy") {
			continue
		}
		if now[k] != v {
			t.Errorf("container %s after %s: %s before, %q now", k, after, v, now[k])
		}
	}
}

// NodesAt checks every node's kubelet is at version and none is left
// cordoned.
func (h *Harness) NodesAt(t *testing.T, version, after string) {
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

// StopSSH stops sshd on every node, from each node's console (the
// sandbox's service manager), and starts it again when the test ends.
func (h *Harness) StopSSH(t *testing.T) {
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
