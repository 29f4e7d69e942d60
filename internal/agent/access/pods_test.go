package access

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/agent"
)

// An agent's pod is pinned to its node whatever its taints, never pulls
// its image again, and mounts the host's root for its steps' units.
func TestAgentPod(t *testing.T) {
	img := "registry.corp:5000/kubelift/agent@sha256:" + strings.Repeat("a", 64)
	p := AgentPod("r1", "worker-1", img)
	c := p.Spec.Containers[0]
	switch {
	case p.Namespace != agent.Namespace || p.Spec.NodeName != "worker-1" || p.Labels[agent.LabelNode] != "worker-1":
		t.Errorf("placed %s/%s on %q", p.Namespace, p.Name, p.Spec.NodeName)
	case len(p.Spec.Tolerations) != 1 || p.Spec.Tolerations[0].Operator != corev1.TolerationOpExists || p.Spec.Tolerations[0].Key != "":
		t.Errorf("tolerations %+v: want every taint tolerated (a cordoned or not-ready node keeps its agent)", p.Spec.Tolerations)
	case c.Image != img || c.ImagePullPolicy != corev1.PullIfNotPresent:
		t.Errorf("image %s pulled %s", c.Image, c.ImagePullPolicy)
	case p.Spec.Volumes[0].HostPath == nil || p.Spec.Volumes[0].HostPath.Path != "/" || c.VolumeMounts[0].MountPath != "/host" || strings.Join(c.Args, " ") != "agent --root /host":
		t.Errorf("host root %+v at %+v, args %v", p.Spec.Volumes, c.VolumeMounts, c.Args)
	case c.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" || p.Spec.ServiceAccountName != ServiceAccount:
		t.Errorf("env %+v, account %s", c.Env, p.Spec.ServiceAccountName)
	}
}

// The run creates each node's agent once, and removes them all.
func TestEnsureAndRemoveAgents(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	c := &Connector{Client: cs, Run: "r1"}
	for i := 0; i < 2; i++ {
		if err := c.EnsureAgents(ctx, "agent@sha256:"+strings.Repeat("b", 64), []string{"worker-1", "worker-2"}); err != nil {
			t.Fatal(err)
		}
	}
	list, _ := cs.CoreV1().Pods(agent.Namespace).List(ctx, metav1.ListOptions{})
	if len(list.Items) != 2 {
		t.Fatalf("%d pods", len(list.Items))
	}
	if err := c.RemoveAgents(ctx); err != nil {
		t.Fatal(err)
	}
	if list, _ := cs.CoreV1().Pods(agent.Namespace).List(ctx, metav1.ListOptions{}); len(list.Items) != 0 {
		t.Errorf("%d pods left", len(list.Items))
	}
}
