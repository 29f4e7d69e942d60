package simcluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
)

const (
	// Namespace holds AddPods' pods.
	Namespace = "simcluster"
	// PauseImage is their one container's image (KWOK pulls nothing).
	PauseImage = "registry.k8s.io/pause:3.10"
	// TolerationsLabel on each pod says whether it has the default
	// not-ready/unreachable tolerations ("default") or none ("none").
	TolerationsLabel = "simcluster.kubelift.io/tolerations"
)

// DefaultTolerations are the not-ready and unreachable NoExecute
// tolerations, 300 s each, that the DefaultTolerationSeconds admission
// plugin would add (the cluster's API server runs without it).
func DefaultTolerations() []corev1.Toleration {
	s := int64(300)
	return []corev1.Toleration{
		{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &s},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &s},
	}
}

// AddPods creates perNode bare pods bound to every node AddNodes made
// (spec.nodeName set, as the scheduler would), in Namespace, and waits
// until KWOK made them all Running and Ready. Every
// withoutTolerationsEvery-th pod has no tolerations at all (0: none goes
// without); the rest have DefaultTolerations.
func (c *Cluster) AddPods(ctx context.Context, perNode int, withoutTolerationsEvery int) error {
	if perNode <= 0 || len(c.nodes) == 0 {
		return nil
	}
	if err := c.ensureNamespace(ctx, Namespace); err != nil {
		return err
	}
	start := time.Now()
	first := c.pods
	total := perNode * len(c.nodes)
	keys := make([]string, total)
	pods := make([]*corev1.Pod, total)
	for i := range pods {
		node := c.nodes[i/perNode]
		name := fmt.Sprintf("%s-%d", node, first+i%perNode)
		keys[i] = Namespace + "/" + name
		tolerations, label := DefaultTolerations(), "default"
		if withoutTolerationsEvery > 0 && (i+1)%withoutTolerationsEvery == 0 {
			tolerations, label = nil, "none"
		}
		no := false
		pods[i] = &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace,
				Labels: map[string]string{"app": "simcluster", TolerationsLabel: label}},
			Spec: corev1.PodSpec{
				NodeName:                     node,
				Containers:                   []corev1.Container{{Name: "pause", Image: PauseImage}},
				Tolerations:                  tolerations,
				AutomountServiceAccountToken: &no,
			},
		}
	}

	// Watch before creating, so that no pod's transitions are missed.
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithNamespace(Namespace))
	inf := factory.Core().V1().Pods().Informer()
	infCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go inf.Run(infCtx.Done())

	if err := parallel(ctx, total, func(ctx context.Context, i int) error {
		if _, err := c.Client.CoreV1().Pods(Namespace).Create(ctx, pods[i], metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("pod %s: %w", keys[i], err)
		}
		return nil
	}); err != nil {
		return err
	}
	c.pods += perNode
	c.o.Log("simcluster: %d pods created in %s", total, time.Since(start).Round(time.Millisecond))
	if err := c.waitFor(ctx, inf, "pods Running", keys, func(obj any) bool {
		p, ok := obj.(*corev1.Pod)
		return ok && PodRunning(p)
	}); err != nil {
		return err
	}
	c.o.Log("simcluster: %d pods Running in %s", total, time.Since(start).Round(time.Millisecond))
	return nil
}

// PodRunning reports whether the pod is Running with every container
// ready.
func PodRunning(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		return false
	}
	for _, s := range p.Status.ContainerStatuses {
		if !s.Ready {
			return false
		}
	}
	return true
}
