package access

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/waiter"
)

// The agents' pods and their account (docs/agent-mode.md).
const (
	ServiceAccount = "kubelift-agent"
	// LabelApp marks the agents' pods.
	LabelApp = "app.kubernetes.io/name"
	appName  = "kubelift-agent"
	// hostMount is where an agent's pod mounts the host's root.
	hostMount = "/host"
)

// AgentPod is the pod that runs node's agent for run: on that node
// whatever its taints, the image by digest and never pulled again,
// privileged with the host's root at /host (its steps run in the host's
// service manager, not in the pod), on the host's network (it needs no
// pod network the upgrade could be moving).
func AgentPod(run, node, image string) *corev1.Pod {
	privileged, root, grace := true, int64(0), int64(5)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "kubelift-agent-" + agent.NodeHash(node), Namespace: agent.Namespace,
			Labels:      map[string]string{LabelApp: appName, agent.LabelNode: agent.NodeLabel(node), agent.LabelRun: run, "app.kubernetes.io/managed-by": "kubelift"},
			Annotations: map[string]string{agent.AnnotationNode: node},
		},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			ServiceAccountName:            ServiceAccount,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			PriorityClassName:             "system-node-critical",
			HostNetwork:                   true,
			DNSPolicy:                     corev1.DNSClusterFirstWithHostNet,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "agent", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Args: []string{"agent", "--root", hostMount},
				Env: []corev1.EnvVar{{Name: "KUBELIFT_NODE_NAME", ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
				SecurityContext: &corev1.SecurityContext{Privileged: &privileged, RunAsUser: &root},
				VolumeMounts:    []corev1.VolumeMount{{Name: "host", MountPath: hostMount}},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
				},
			}},
			Volumes: []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}},
		},
	}
}

// EnsureAgents creates the agent pod of each node that has none (one
// of an earlier run is kept: it serves every run's requests).
func (c *Connector) EnsureAgents(ctx context.Context, image string, nodes []string) error {
	pods := c.Client.CoreV1().Pods(agent.Namespace)
	var errs []error
	for _, n := range nodes {
		p := AgentPod(c.Run, n, image)
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			errs = append(errs, fmt.Errorf("node %s: creating its agent's pod %s/%s: %w", n, agent.Namespace, p.Name, err))
		}
	}
	return errors.Join(errs...)
}

// RemoveAgents deletes the agent pods of this run (those it made, and
// those it took over: Adopt); another run's (a plan beside an apply)
// stay.
func (c *Connector) RemoveAgents(ctx context.Context) error {
	pods := c.Client.CoreV1().Pods(agent.Namespace)
	sel := labels.SelectorFromSet(labels.Set{LabelApp: appName, agent.LabelRun: c.Run}).String()
	// One request for them all; one by one where the API server refuses
	// that.
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel}); err == nil {
		return nil
	}
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("listing the agents' pods in %s: %w", agent.Namespace, err)
	}
	var errs []error
	for _, p := range list.Items {
		if err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting agent pod %s/%s: %w", agent.Namespace, p.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Adopt takes over what run, one that stopped, left: for a run that
// took over the upgrade's lock from it (RunOfHolder of the lock's
// TakenOver; nothing when ""). Its agents' pods become this run's
// (deleted at its end), or are deleted where they run another image, and
// its step requests are deleted (an answer may hold what a step printed;
// a request never answered is not to run later). Other runs' (a plan
// beside this run) are left alone.
func (c *Connector) Adopt(ctx context.Context, run string) error {
	if run == "" || run == c.Run {
		return nil
	}
	sel := labels.SelectorFromSet(labels.Set{agent.LabelRun: run}).String()
	pods := c.Client.CoreV1().Pods(agent.Namespace)
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("listing the agents' pods of run %s in %s: %w", run, agent.Namespace, err)
	}
	var errs []error
	for _, p := range list.Items {
		if p.Labels[LabelApp] != appName {
			continue
		}
		if c.Image != "" && (len(p.Spec.Containers) != 1 || p.Spec.Containers[0].Image != c.Image) {
			if err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("deleting agent pod %s/%s of another image: %w", agent.Namespace, p.Name, err))
			}
			continue
		}
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, agent.LabelRun, c.Run)
		if _, err := pods.Patch(ctx, p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("taking over agent pod %s/%s: %w", agent.Namespace, p.Name, err))
		}
	}
	errs = append(errs, c.deleteRequests(ctx, run))
	return errors.Join(errs...)
}

// podFailures are the waiting reasons of an agent container that does not
// start by itself: its node cannot pull the image, or cannot run it.
var podFailures = map[string]bool{
	"ErrImagePull": true, "ImagePullBackOff": true, "ErrImageNeverPull": true, "InvalidImageName": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true, "CrashLoopBackOff": true,
}

// agentUp waits until node's agent runs: its pod created where it is
// missing (or made again where it ended), and its container running. A
// pod that cannot start (its image not pulled, its container not run)
// fails at once, with the kubelet's reason.
func (c *Connector) agentUp(ctx context.Context, node string) error {
	if c.Image == "" {
		return nil // agents started by someone else (tests)
	}
	bound := c.Ready
	if bound <= 0 {
		bound = 3 * time.Minute
	}
	poll := c.Poll
	if poll <= 0 {
		poll = 200 * time.Millisecond
	}
	name := AgentPod(c.Run, node, c.Image).Name
	return c.Wait.Poll(ctx, poll, bound, func(ctx context.Context) error {
		p, err := c.revive(ctx, node)
		if err != nil {
			return err
		}
		if p == nil {
			return fmt.Errorf("its agent's pod %s/%s is being made again", agent.Namespace, name)
		}
		if err := cannotStart(p, c.Image); err != nil {
			return waiter.Stop(err)
		}
		if containerRuns(p) {
			return nil
		}
		return fmt.Errorf("its agent's pod %s/%s is %s, not running yet", agent.Namespace, name, p.Status.Phase)
	})
}

// containerRuns says whether p's agent container runs.
func containerRuns(p *corev1.Pod) bool {
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Running != nil {
			return true
		}
	}
	return false
}

// replacedOnce says whether node's ended agent pod was replaced already
// by this connector, and counts this replacement.
func (c *Connector) replacedOnce(node string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.replaced == nil {
		c.replaced = map[string]bool{}
	}
	was := c.replaced[node]
	c.replaced[node] = true
	return was
}

// cannotStart says why the agent's pod p cannot run by itself: its node
// rejected it, or cannot pull its image or run its container.
func cannotStart(p *corev1.Pod, image string) error {
	if p.Status.Phase == corev1.PodFailed {
		return fmt.Errorf("its agent's pod %s/%s failed: %s: %s", p.Namespace, p.Name, p.Status.Reason, p.Status.Message)
	}
	for _, s := range p.Status.ContainerStatuses {
		if w := s.State.Waiting; w != nil && podFailures[w.Reason] {
			return fmt.Errorf("its agent's pod %s/%s cannot start (image %s): %s: %s", p.Namespace, p.Name, image, w.Reason, w.Message)
		}
	}
	return nil
}

// revive makes node's agent pod where it is missing, and deletes one
// that ended or is going (the next call makes it again); it returns the
// pod that stays, nil where there is none yet. A pod the run's watch
// saw running is taken from the watch's cache; every other state is read
// from the API (the cache lags every change, and while the watch is
// broken it keeps what it last saw: a pod deleted then is found gone
// when a step goes unanswered for Grace after the watch is back). A step in flight goes on
// in its unit on the host; the new agent answers it from its directory.
func (c *Connector) revive(ctx context.Context, node string) (*corev1.Pod, error) {
	want := AgentPod(c.Run, node, c.Image)
	if p := c.watch().runningAgent(want.Name, c.Image); p != nil {
		return p, nil // runs, as the run's watch saw it: nothing to read
	}
	pods := c.Client.CoreV1().Pods(agent.Namespace)
	p, err := pods.Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		p, err = pods.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("creating its agent's pod %s/%s: %w", agent.Namespace, want.Name, err)
		}
		return p, nil
	case err != nil:
		return nil, fmt.Errorf("reading its agent's pod %s/%s: %w", agent.Namespace, want.Name, err)
	case p.DeletionTimestamp != nil:
		return nil, nil
	case len(p.Spec.Containers) != 1 || p.Spec.Containers[0].Image != c.Image:
		// Another run's agent, of another release: never this run's
		// steps (its scripts are its own); that run deletes it at its
		// end, or the next holder of the lock replaces it.
		return nil, waiter.Stop(fmt.Errorf("its agent's pod %s/%s runs another image than this run's %s (run %s's): wait for that run to end",
			agent.Namespace, p.Name, c.Image, p.Labels[agent.LabelRun]))
	case p.Status.Phase == corev1.PodFailed && c.replacedOnce(node):
		return p, nil // failed again once replaced: the caller says why
	case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
		if err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return nil, fmt.Errorf("deleting its agent's pod %s/%s, which ended (%s): %w", agent.Namespace, p.Name, p.Status.Phase, err)
		}
		return nil, nil
	}
	return p, nil
}
