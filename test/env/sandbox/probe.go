package sandbox

import (
	"context"
	"fmt"
	"net"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/test/env/prober"
)

// ProbeTargets are what a user judges the sandbox's availability by: the
// Service shop/api's ClusterIP dialed from every worker (so through each
// worker's kube-proxy), and every running shop pod's own address (the
// app's port 8080) dialed from the admin machine.
func (s *State) ProbeTargets(ctx context.Context) ([]prober.Target, error) {
	client, err := s.Client()
	if err != nil {
		return nil, err
	}
	svc, err := client.CoreV1().Services(WorkloadNamespace).Get(ctx, APIService, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("service %s/%s: %w", WorkloadNamespace, APIService, err)
	}
	var out []prober.Target
	for _, m := range s.Nodes() {
		if m.Role == "worker" {
			out = append(out, prober.Target{Name: fmt.Sprintf("service %s/%s via %s", WorkloadNamespace, APIService, m.Name),
				URL: "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "80"), Dial: m.Net().DialContext})
		}
	}
	pods, err := client.CoreV1().Pods(WorkloadNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	admin := s.Admin().Net().DialContext
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || p.DeletionTimestamp != nil {
			continue
		}
		out = append(out, prober.Target{Name: fmt.Sprintf("pod %s/%s on %s", p.Namespace, p.Name, p.Spec.NodeName),
			URL: "http://" + net.JoinHostPort(p.Status.PodIP, "8080"), Dial: admin})
	}
	return out, nil
}
