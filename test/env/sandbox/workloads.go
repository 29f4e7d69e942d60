package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kubelift/kubelift/internal/atomicfile"
)

// WorkloadNamespace holds the sandbox's workloads.
const WorkloadNamespace = "shop"

// APIService is the Service in front of the api Deployment (port 80,
// the app's 8080 behind it).
const APIService = "api"

// PinnedLabel is the node label the "pinned" pod's nodeSelector needs;
// the sandbox removes it from the node after the pod runs, so the pod
// runs on a node it no longer matches (the kubelet fails it with reason
// NodeAffinity when it restarts and re-admits it).
const PinnedLabel = "kubelift.io/disk"

// NotReadyTolerations are what DefaultTolerationSeconds would add.
func NotReadyTolerations() []corev1.Toleration {
	secs := int64(300)
	return []corev1.Toleration{
		{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &secs},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &secs},
	}
}

// PodSpec is a small pod: two containers (an app and a sidecar) whose
// images come from the private registry.
func (s *State) PodSpec(tolerations []corev1.Toleration) corev1.PodSpec {
	reg := s.Registry.Address + "/library/"
	req := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")}
	return corev1.PodSpec{
		Tolerations: tolerations,
		Containers: []corev1.Container{
			{Name: "app", Image: reg + "shop-app:1.4.2", Args: []string{"serve", "--port=8080"},
				Ports: []corev1.ContainerPort{{ContainerPort: 8080}}, Resources: corev1.ResourceRequirements{Requests: req}},
			{Name: "proxy", Image: reg + "envoy:v1.31", Env: []corev1.EnvVar{{Name: "UPSTREAM", Value: "127.0.0.1:8080"}}},
		},
	}
}

func (s *State) createWorkloads(ctx context.Context) error {
	client, err := s.Client()
	if err != nil {
		return err
	}
	if err := EnsureNamespace(ctx, client, WorkloadNamespace); err != nil {
		return err
	}
	workers := []Machine{}
	for _, m := range s.Nodes() {
		if m.Role == "worker" {
			workers = append(workers, m)
		}
	}
	deploy := func(name string, replicas int32, tol []corev1.Toleration) *appsv1.Deployment {
		labels := map[string]string{"app": name}
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: WorkloadNamespace},
			Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: s.PodSpec(tol)}},
		}
	}
	// api: three replicas, at most one more on a worker than on another,
	// behind the Service shop/api (port 80).
	api := deploy("api", 3, nil)
	// Nodes whose taints the pods do not tolerate (the control plane's)
	// are no domain: counted, their zero would forbid a second replica on
	// a worker of two.
	honor := corev1.NodeInclusionPolicyHonor
	api.Spec.Template.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname,
		WhenUnsatisfiable: corev1.DoNotSchedule, NodeTaintsPolicy: &honor, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}}}}
	for _, d := range []*appsv1.Deployment{deploy("web", 3, NotReadyTolerations()), api} {
		if err := write(ctx, "deployment "+d.Name, func() error {
			_, err := client.AppsV1().Deployments(WorkloadNamespace).Create(ctx, d, metav1.CreateOptions{})
			return created(err)
		}); err != nil {
			return err
		}
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: APIService, Namespace: WorkloadNamespace},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "api"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
	if err := write(ctx, "service "+svc.Name, func() error {
		_, err := client.CoreV1().Services(WorkloadNamespace).Create(ctx, svc, metav1.CreateOptions{})
		return created(err)
	}); err != nil {
		return err
	}
	agent := map[string]string{"app": "node-agent"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "node-agent", Namespace: WorkloadNamespace},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: agent},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: agent}, Spec: s.PodSpec(nil)}},
	}
	if err := write(ctx, "daemonset "+ds.Name, func() error {
		_, err := client.AppsV1().DaemonSets(WorkloadNamespace).Create(ctx, ds, metav1.CreateOptions{})
		return created(err)
	}); err != nil {
		return err
	}
	bare := []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "batch-legacy", Namespace: WorkloadNamespace}, Spec: s.PodSpec(nil)},
		{ObjectMeta: metav1.ObjectMeta{Name: "batch-tolerant", Namespace: WorkloadNamespace}, Spec: s.PodSpec(NotReadyTolerations())},
	}
	var pinnedNode string
	if len(workers) > 0 {
		pinnedNode = workers[len(workers)-1].Name
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"ssd"}}}`, PinnedLabel)
		if err := write(ctx, "label node "+pinnedNode, func() error {
			_, err := client.CoreV1().Nodes().Patch(ctx, pinnedNode, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
			return err
		}); err != nil {
			return err
		}
	}
	for _, p := range bare {
		if err := write(ctx, "pod "+p.Name, func() error {
			_, err := client.CoreV1().Pods(WorkloadNamespace).Create(ctx, p, metav1.CreateOptions{})
			return created(err)
		}); err != nil {
			return err
		}
	}
	if pinnedNode != "" {
		pinned := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pinned-ssd", Namespace: WorkloadNamespace}, Spec: s.PodSpec(nil)}
		pinned.Spec.NodeSelector = map[string]string{PinnedLabel: "ssd"}
		if err := CreateSelectingPod(ctx, client, pinned, 3*time.Minute); err != nil {
			return err
		}
	}
	if err := WaitPodsRunning(ctx, client, WorkloadNamespace, 3*time.Minute); err != nil {
		return err
	}
	if pinnedNode != "" {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, PinnedLabel)
		if err := write(ctx, "unlabel node "+pinnedNode, func() error {
			_, err := client.CoreV1().Nodes().Patch(ctx, pinnedNode, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// selectingPodTries bounds how often CreateSelectingPod creates a pod
// its kubelet refused.
const selectingPodTries = 5

// CreateSelectingPod creates pod, whose nodeSelector needs a label just
// put on a node, and waits (up to limit) until its containers run.
//
// A kubelet before v1.35 admits a pod against its informer's copy of its
// Node, which may not hold the new label yet although the scheduler saw
// it: the kubelet then fails the pod with reason NodeAffinity
// (kubernetes/kubernetes#133997, fixed in v1.35 by #134445, which
// fetches the Node again). A CI run met it on a busy machine. That race
// is the set-up's, not what a test asks about, so such a pod is deleted
// and created again, up to selectingPodTries times; a pod that fails
// for another reason is an error at once.
func CreateSelectingPod(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, limit time.Duration) error {
	pods := client.CoreV1().Pods(pod.Namespace)
	create := func() error {
		return write(ctx, "pod "+pod.Name, func() error {
			_, err := pods.Create(ctx, pod, metav1.CreateOptions{})
			return created(err)
		})
	}
	if err := create(); err != nil {
		return err
	}
	tries, last := 1, ""
	err := poll(ctx, limit, func() (bool, error) {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			// Deleted after a refusal: create it again.
			last = "deleted after a NodeAffinity refusal"
			return false, create()
		case err != nil:
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("%s on %q", p.Status.Phase, p.Spec.NodeName)
		switch {
		case p.DeletionTimestamp != nil:
			// Going after a refusal.
			return false, nil
		case p.Status.Phase == corev1.PodFailed && p.Status.Reason == "NodeAffinity":
			if tries == selectingPodTries {
				return false, fmt.Errorf("refused by the kubelet on %s %d times: %s", p.Spec.NodeName, tries, p.Status.Message)
			}
			tries++
			zero := int64(0)
			return false, write(ctx, "delete refused pod "+pod.Name, func() error {
				err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
				if apierrors.IsNotFound(err) {
					return nil
				}
				return err
			})
		case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
			return false, fmt.Errorf("%s on %q: %s %s", p.Status.Phase, p.Spec.NodeName, p.Status.Reason, p.Status.Message)
		}
		return containersRunning(p), nil
	})
	if err != nil {
		return fmt.Errorf("pod %s/%s not running (last: %s): %w", pod.Namespace, pod.Name, last, err)
	}
	return nil
}

// EnsureNamespace creates namespace unless it exists, and waits (up to a
// minute) for its default ServiceAccount, which the controller manager
// creates and pods need.
func EnsureNamespace(ctx context.Context, client kubernetes.Interface, namespace string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := write(ctx, "namespace "+namespace, func() error {
		_, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
		return created(err)
	}); err != nil {
		return err
	}
	if err := poll(ctx, time.Minute, func() (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("no default ServiceAccount in %s: %w", namespace, err)
	}
	return nil
}

// WaitPodsRunning waits until every pod in namespace has all containers
// running (and there is at least one pod).
func WaitPodsRunning(ctx context.Context, client kubernetes.Interface, namespace string, limit time.Duration) error {
	var waiting []string
	err := poll(ctx, limit, func() (bool, error) {
		pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		waiting = waiting[:0]
		for _, p := range pods.Items {
			if !containersRunning(&p) {
				waiting = append(waiting, fmt.Sprintf("%s (%s on %q)", p.Name, p.Status.Phase, p.Spec.NodeName))
			}
		}
		return len(pods.Items) > 0 && len(waiting) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("pods in %s not running: %v: %w", namespace, waiting, err)
	}
	return nil
}

// StaticPodName is the static pod's name in its manifest; its mirror pod
// is StaticPodName-NODE in kube-system.
const StaticPodName = "edge"

// createStaticPod writes a static pod's manifest into the last worker's
// /etc/kubernetes/manifests, as an installer does before the cluster is
// handed over, and waits for its mirror pod Running.
func (s *State) createStaticPod(ctx context.Context) error {
	var node *Machine
	for i := range s.Machines {
		if s.Machines[i].Role == "worker" {
			node = &s.Machines[i]
		}
	}
	if node == nil {
		return errors.New("static pod: no worker")
	}
	pod := corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: StaticPodName, Namespace: metav1.NamespaceSystem, Labels: map[string]string{"app": StaticPodName}},
		Spec:       s.PodSpec(nil)}
	data, err := yaml.Marshal(pod)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(node.fsPath("etc/kubernetes/manifests/"+StaticPodName+".yaml"), data, 0o644); err != nil {
		return err
	}
	client, err := s.Client()
	if err != nil {
		return err
	}
	name := StaticPodName + "-" + node.Name
	deadline := time.Now().Add(3 * time.Minute)
	for {
		p, err := client.CoreV1().Pods(metav1.NamespaceSystem).Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			s.StaticPod = metav1.NamespaceSystem + "/" + name
			return nil
		}
		last := fmt.Sprint(err)
		if err == nil {
			last = "phase " + string(p.Status.Phase)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("static pod %s on %s not Running within 3m (last: %s)", name, node.Name, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// containersRunning says every container of p runs.
func containersRunning(p *corev1.Pod) bool {
	running := 0
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running != nil {
			running++
		}
	}
	return running == len(p.Spec.Containers)
}
