package access

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/agent/hoststep/hoststeptest"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodescript"
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
	cs := newClient()
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

// setPod sets the status of node's agent pod once it exists (its
// failures show in the test's own checks: it runs in a goroutine that may
// outlive the test, so it reports nothing through t).
func setPod(_ *testing.T, cs *fake.Clientset, status corev1.PodStatus) {
	pods := cs.CoreV1().Pods(agent.Namespace)
	name := AgentPod("", "worker-1", "").Name
	for i := 0; i < 500; i++ {
		if p, err := pods.Get(context.Background(), name, metav1.GetOptions{}); err == nil {
			p.Status = status
			_, _ = pods.UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Dial makes the node's agent pod and waits for it to run; a pod whose
// image the node cannot pull fails at once with the kubelet's reason; a
// pod that is gone is made again.
func TestDialStartsTheAgent(t *testing.T) {
	const img = "registry.local:5000/library/kubelift-agent@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ctx := context.Background()
	cs := newClient()
	c := &Connector{Client: cs, Run: "r1", Image: img, Poll: 10 * time.Millisecond, Ready: 20 * time.Second}
	go setPod(t, cs, corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: "agent",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "Back-off pulling image"}}}}})
	_, err := c.Dial(ctx, nodeaccess.Address{Name: "worker-1"})
	if err == nil || !strings.Contains(err.Error(), "cannot start (image "+img+"): ImagePullBackOff") || !strings.Contains(err.Error(), "node worker-1") {
		t.Fatalf("an image the node cannot pull: %v", err)
	}
	go setPod(t, cs, corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "agent",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}})
	// the waiting status may still be read once before the update
	for i := 0; ; i++ {
		if _, err = c.Dial(ctx, nodeaccess.Address{Name: "worker-1"}); err == nil || i == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("a running agent: %v", err)
	}
	pods := cs.CoreV1().Pods(agent.Namespace)
	if err := pods.Delete(ctx, AgentPod("", "worker-1", "").Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, c, AgentPod("", "worker-1", "").Name)
	go setPod(t, cs, corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "agent",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}})
	if _, err := c.Dial(ctx, nodeaccess.Address{Name: "worker-1"}); err != nil {
		t.Fatalf("a deleted agent: %v", err)
	}
	p, err := pods.Get(ctx, AgentPod("", "worker-1", "").Name, metav1.GetOptions{})
	if err != nil || p.Spec.Containers[0].Image != img || p.Spec.NodeName != "worker-1" {
		t.Fatalf("the agent made again: %v", err)
	}
}

// waitGone waits until the run's watch saw pod name go.
func waitGone(t *testing.T, c *Connector, name string) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if a := c.watch(); a.podsOK() {
			if _, err := a.pods.Get(name); err != nil {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the run's watch still has pod %s", name)
}

// A node whose agent the run's watch saw running is dialled without a
// read of its pod: at 1000 nodes those reads were two of every node's 17
// requests, against the run's --kube-qps.
func TestDialReadsNoRunningPod(t *testing.T) {
	const img = "registry.local:5000/library/kubelift-agent@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ctx := context.Background()
	p := AgentPod("r1", "worker-1", img)
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "agent",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}
	cs := newClient(p)
	c := &Connector{Client: cs, Run: "r1", Image: img, Poll: 10 * time.Millisecond, Ready: 20 * time.Second}
	defer c.stopWatch()
	if _, err := c.Dial(ctx, nodeaccess.Address{Name: "worker-1"}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 500 && !c.watch().podsOK(); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	cs.ClearActions()
	for i := 0; i < 3; i++ {
		if _, err := c.Dial(ctx, nodeaccess.Address{Name: "worker-1"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range cs.Actions() {
		if a.GetResource().Resource == "pods" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			t.Errorf("a dial asked the API: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

// A step unanswered for the grace has its node's agent pod made again
// where it is gone (deleted mid-step), and the new agent answers it.
func TestUnansweredStepRevivesTheAgent(t *testing.T) {
	const img = "registry.local:5000/library/kubelift-agent@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs := newClient()
	c := &Connector{Client: cs, Run: "r1", Image: img, Poll: 10 * time.Millisecond, Grace: 50 * time.Millisecond}
	go setPod(t, cs, corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "agent",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}})
	n, err := c.Dial(ctx, nodeaccess.Address{Name: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	pods := cs.CoreV1().Pods(agent.Namespace)
	name := AgentPod("", "worker-1", "").Name
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	go func() {
		// The agent comes back once its pod is made again.
		for ctx.Err() == nil {
			if _, err := pods.Get(ctx, name, metav1.GetOptions{}); err == nil {
				serveNode(t, cs, &hoststeptest.Direct{})
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if out, err := n.Run(ctx, nodescript.Exists.Command("/"), nil); err != nil || string(out) != "yes\n" {
		t.Fatalf("a step whose agent was deleted: %q, %v", out, err)
	}
}

// A pod the node ended (evicted) is replaced once; one that fails again
// fails the dial with the node's reason, not a loop of new pods.
func TestEndedAgentReplacedOnce(t *testing.T) {
	const img = "registry.local:5000/library/kubelift-agent@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ctx := context.Background()
	cs := newClient()
	c := &Connector{Client: cs, Run: "r1", Image: img, Poll: 10 * time.Millisecond, Ready: 20 * time.Second}
	failed := corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: memory."}
	pods := cs.CoreV1().Pods(agent.Namespace)
	name := AgentPod("", "worker-1", "").Name
	p := AgentPod("r0", "worker-1", img)
	p.Status = failed
	if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	creates := 0
	cs.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		creates++
		return false, nil, nil
	})
	go func() {
		// The new pod fails too.
		for i := 0; i < 500; i++ {
			if q, err := pods.Get(ctx, name, metav1.GetOptions{}); err == nil && q.Labels[agent.LabelRun] == "r1" {
				q.Status = failed
				_, _ = pods.UpdateStatus(ctx, q, metav1.UpdateOptions{})
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	_, err := c.Dial(ctx, nodeaccess.Address{Name: "worker-1"})
	if err == nil || !strings.Contains(err.Error(), "failed: Evicted: The node was low on resource") {
		t.Fatalf("an agent pod failing twice: %v", err)
	}
	if creates != 1 {
		t.Errorf("%d pods made, want 1 (the ended one replaced once)", creates)
	}
}

// A run that took the lock over from a stopped run takes over that
// run's agents (and deletes them at its end), replaces those of another
// image, and deletes its requests; a plan's beside it stay, and a run's
// end leaves another run's agents.
func TestAdopt(t *testing.T) {
	const img = "registry.local:5000/library/kubelift-agent@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ctx := context.Background()
	cs := newClient()
	pods := cs.CoreV1().Pods(agent.Namespace)
	for _, p := range []*corev1.Pod{AgentPod("dead", "worker-1", img), AgentPod("dead", "worker-2", "registry.local:5000/library/kubelift-agent@sha256:"+strings.Repeat("9", 64)),
		AgentPod("plan", "worker-3", img)} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, run := range []string{"dead", "plan"} {
		r, _ := agent.NewRequest(run, "worker-1", 1, nodescript.Exists.Command("/"), nil, time.Minute)
		s, _ := r.Secret()
		if _, err := cs.CoreV1().Secrets(agent.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c := &Connector{Client: cs, Run: "new", Image: img}
	if err := c.Adopt(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if l, _ := pods.List(ctx, metav1.ListOptions{}); len(l.Items) != 3 {
		t.Fatalf("a lock taken from nobody adopted: %d pods left", len(l.Items))
	}
	if err := c.Adopt(ctx, "dead"); err != nil {
		t.Fatal(err)
	}
	runs := map[string]string{}
	l, _ := pods.List(ctx, metav1.ListOptions{})
	for _, p := range l.Items {
		runs[p.Spec.NodeName] = p.Labels[agent.LabelRun]
	}
	if len(runs) != 2 || runs["worker-1"] != "new" || runs["worker-3"] != "plan" {
		t.Fatalf("after adopting the dead run's agents: %v", runs)
	}
	secrets, _ := cs.CoreV1().Secrets(agent.Namespace).List(ctx, metav1.ListOptions{})
	if len(secrets.Items) != 1 || secrets.Items[0].Labels[agent.LabelRun] != "plan" {
		t.Errorf("requests after adopt: %d, want the plan's alone", len(secrets.Items))
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if l, _ := pods.List(ctx, metav1.ListOptions{}); len(l.Items) != 1 || l.Items[0].Labels[agent.LabelRun] != "plan" {
		t.Errorf("after the adopting run's end: %d agents, want the plan's alone", len(l.Items))
	}
}

// A node's agent of another image (another run's, another release) is
// never used: the dial fails, naming that run.
func TestAnotherImagesAgentRefused(t *testing.T) {
	const img = "registry.local:5000/library/kubelift-agent@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ctx := context.Background()
	cs := newClient()
	p := AgentPod("other", "worker-1", "registry.local:5000/library/kubelift-agent@sha256:"+strings.Repeat("9", 64))
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "agent", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}
	if _, err := cs.CoreV1().Pods(agent.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := &Connector{Client: cs, Run: "r1", Image: img, Poll: 10 * time.Millisecond, Ready: 5 * time.Second}
	if _, err := c.Dial(ctx, nodeaccess.Address{Name: "worker-1"}); err == nil || !strings.Contains(err.Error(), "runs another image than this run's") || !strings.Contains(err.Error(), "run other's") {
		t.Fatalf("another image's agent: %v", err)
	}
}
