package cluster

import (
	"context"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ListOptions pages every list kubelift makes of a cluster (500 a page).
func ListOptions() metav1.ListOptions { return metav1.ListOptions{Limit: 500} }

// ListNodes lists every Node, a page at a time.
func ListNodes(ctx context.Context, c kubernetes.Interface) ([]corev1.Node, error) {
	var out []corev1.Node
	opts := ListOptions()
	for {
		l, err := c.CoreV1().Nodes().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		out = append(out, l.Items...)
		if l.Continue == "" {
			break
		}
		opts.Continue = l.Continue
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ListPods lists every Pod not yet finished (Succeeded or Failed), a page
// at a time.
func ListPods(ctx context.Context, c kubernetes.Interface) ([]corev1.Pod, error) {
	var out []corev1.Pod
	opts := ListOptions()
	opts.FieldSelector = "status.phase!=Succeeded,status.phase!=Failed"
	for {
		l, err := c.CoreV1().Pods("").List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list pods: %w", err)
		}
		out = append(out, l.Items...)
		if l.Continue == "" {
			break
		}
		opts.Continue = l.Continue
	}
	return out, nil
}

// NodeReady says the Node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ReadyAt says a Node is Ready with its kubelet at version (a condition
// for NodeWatch.Until).
func ReadyAt(version string) func(*corev1.Node) bool {
	return func(n *corev1.Node) bool { return NodeReady(n) && n.Status.NodeInfo.KubeletVersion == version }
}

// PodReady says the Pod runs and its Ready condition is True.
func PodReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
