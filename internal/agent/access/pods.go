package access

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kubelift/kubelift/internal/agent"
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

// RemoveAgents deletes every agent pod (the run is over).
func (c *Connector) RemoveAgents(ctx context.Context) error {
	pods := c.Client.CoreV1().Pods(agent.Namespace)
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{LabelApp: appName}).String()})
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
