package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kubelift/kubelift/test/env/images"
	"github.com/kubelift/kubelift/test/env/kube"
	"github.com/kubelift/kubelift/test/env/prober"
)

// A binary sandbox with Config.CoreDNS runs CoreDNS as binary installers
// deploy it (kubeasz, the "hard way"): kubeadm's manifests applied once,
// at the version the cluster was installed with, never moved since: a
// Deployment kube-system/coredns of two replicas from the private
// registry, its Corefile kubeadm's default, the Service kube-dns at
// ClusterDNS, which every kubelet names to its pods.
const (
	// ClusterDNS is the kube-dns Service's address.
	ClusterDNS = "10.96.0.10"
	// coreDNSImagePath is where, below the private registry, the
	// installer pushed CoreDNS (kubeadm's flat path).
	coreDNSImagePath = "library/coredns"
)

// defaultCorefile is kubeadm's Corefile (v1.30's, the same since v1.24).
const defaultCorefile = `.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30
    loop
    reload
    loadbalance
}
`

// clusterDNSConfig is the kubelet configuration's DNS part: the kube-dns
// Service where the sandbox runs CoreDNS, none otherwise.
func (s *State) clusterDNSConfig() string {
	if s.CoreDNS == "" {
		return "clusterDNS: []\n"
	}
	return "clusterDNS: [" + ClusterDNS + "]\nclusterDomain: cluster.local\n"
}

// pushCoreDNS pushes the CoreDNS the sandbox runs (built at s.CoreDNS) to
// the private registry.
func (s *State) pushCoreDNS(ctx context.Context) (string, error) {
	dir, err := kube.Addon(ctx, "coredns", s.CoreDNS)
	if err != nil {
		return "", err
	}
	img, err := images.CoreDNS(dir)
	if err != nil {
		return "", err
	}
	opts, err := s.RegistryOptions(ctx)
	if err != nil {
		return "", err
	}
	r := s.Registry.Address + "/" + coreDNSImagePath + ":" + s.CoreDNS
	ref, err := parseRef(r)
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, opts...); err != nil {
		return "", fmt.Errorf("push %s: %w", r, err)
	}
	return r, nil
}

// deployCoreDNS pushes CoreDNS, applies kubeadm's objects for it and
// waits until both replicas are available.
func (s *State) deployCoreDNS(ctx context.Context) error {
	image, err := s.pushCoreDNS(ctx)
	if err != nil {
		return err
	}
	client, err := s.Client()
	if err != nil {
		return err
	}
	for _, create := range []func() error{
		func() error {
			_, err := client.CoreV1().ServiceAccounts("kube-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system"}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"}, Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
				{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
				{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
			}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
				RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:coredns"},
				Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "coredns", Namespace: "kube-system"}}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.CoreV1().ConfigMaps("kube-system").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system"},
				Data: map[string]string{"Corefile": defaultCorefile}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.AppsV1().Deployments("kube-system").Create(ctx, coreDNSDeployment(image), metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.CoreV1().Services("kube-system").Create(ctx, coreDNSService(), metav1.CreateOptions{})
			return err
		},
	} {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("coredns: %w", err)
		}
	}
	return WaitCoreDNS(ctx, client, 3*time.Minute)
}

// WaitCoreDNS waits until every CoreDNS replica runs the Deployment's
// current template and is available.
func WaitCoreDNS(ctx context.Context, client kubernetes.Interface, limit time.Duration) error {
	var last string
	err := poll(ctx, limit, func() (bool, error) {
		d, err := client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		st := d.Status
		last = fmt.Sprintf("%d of %d replicas updated, %d available, %d in all", st.UpdatedReplicas, *d.Spec.Replicas, st.AvailableReplicas, st.Replicas)
		return st.ObservedGeneration >= d.Generation && st.UpdatedReplicas == *d.Spec.Replicas && st.Replicas == st.UpdatedReplicas && st.AvailableReplicas == st.Replicas, nil
	})
	if err != nil {
		return fmt.Errorf("coredns (last: %s): %w", last, err)
	}
	return nil
}

// coreDNSDeployment is kubeadm's CoreDNS Deployment (two replicas, at
// most one unavailable, apart where they can be), without its toleration
// of the control planes' taint.
func coreDNSDeployment(image string) *appsv1.Deployment {
	two, one := int32(2), intstr.FromInt32(1)
	labels := map[string]string{"k8s-app": "kube-dns"}
	no := false
	probe := func(path string, port int32) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(port), Scheme: corev1.URISchemeHTTP}},
			PeriodSeconds: 10, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3}
	}
	live := probe("/health", 8080)
	live.InitialDelaySeconds, live.FailureThreshold = 60, 5
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &two,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &one}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					PriorityClassName:  "system-cluster-critical",
					ServiceAccountName: "coredns",
					DNSPolicy:          corev1.DNSDefault,
					NodeSelector:       map[string]string{"kubernetes.io/os": "linux"},
					// As binary installers (kubeasz) have it: off the
					// control planes, which the sandbox taints.
					Tolerations: []corev1.Toleration{{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists}},
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
						Weight: 100, PodAffinityTerm: corev1.PodAffinityTerm{TopologyKey: "kubernetes.io/hostname",
							LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k8s-app", Operator: metav1.LabelSelectorOpIn, Values: []string{"kube-dns"}}}}}}}}},
					Containers: []corev1.Container{{
						Name: "coredns", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
						Args: []string{"-conf", "/etc/coredns/Corefile"},
						Resources: corev1.ResourceRequirements{
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("170Mi")},
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("70Mi")}},
						VolumeMounts: []corev1.VolumeMount{{Name: "config-volume", MountPath: "/etc/coredns", ReadOnly: true}},
						Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}, {Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
							{Name: "metrics", ContainerPort: 9153, Protocol: corev1.ProtocolTCP}},
						LivenessProbe:  live,
						ReadinessProbe: probe("/ready", 8181),
						SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: func() *bool { t := true; return &t }(),
							Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE"}, Drop: []corev1.Capability{"ALL"}}},
					}},
					Volumes: []corev1.Volume{{Name: "config-volume", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: "coredns"}, Items: []corev1.KeyToPath{{Key: "Corefile", Path: "Corefile"}}}}}},
				},
			},
		},
	}
}

// coreDNSService is kubeadm's kube-dns Service, at ClusterDNS.
func coreDNSService() *corev1.Service {
	labels := map[string]string{"k8s-app": "kube-dns"}
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system", Labels: labels},
		Spec: corev1.ServiceSpec{ClusterIP: ClusterDNS, Selector: labels, Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
			{Name: "metrics", Port: 9153, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(9153)},
		}},
	}
}

// DNSName is what the DNS prober resolves: the Service shop/api.
const DNSName = APIService + "." + WorkloadNamespace + ".svc.cluster.local"

// DNSProbeTargets are lookups of DNSName made by a pod on every worker
// (its shopd's /dns/NAME/, through the pod's own resolver: the kube-dns
// Service, through its node's kube-proxy), asked from the admin machine.
func (s *State) DNSProbeTargets(ctx context.Context) ([]prober.Target, error) {
	if s.CoreDNS == "" {
		return nil, errors.New("the sandbox runs no CoreDNS (Config.CoreDNS)")
	}
	client, err := s.Client()
	if err != nil {
		return nil, err
	}
	pods, err := client.CoreV1().Pods(WorkloadNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + APIService})
	if err != nil {
		return nil, err
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	seen := map[string]bool{}
	var out []prober.Target
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || p.DeletionTimestamp != nil || seen[p.Spec.NodeName] {
			continue
		}
		seen[p.Spec.NodeName] = true
		out = append(out, prober.Target{Name: fmt.Sprintf("dns %s from pod %s on %s", DNSName, p.Name, p.Spec.NodeName),
			URL: "http://" + net.JoinHostPort(p.Status.PodIP, "8080") + "/dns/" + DNSName, Dial: s.Admin().Net().DialContext})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no running pod of %s/%s to resolve from", WorkloadNamespace, APIService)
	}
	return out, nil
}

// coreDNSTag is the CoreDNS tag the catalog pairs with Kubernetes
// version (its coredns/coredns image's).
func coreDNSTag(version string) (string, error) {
	rel, err := catalogRelease(version)
	if err != nil {
		return "", err
	}
	for _, im := range rel.Images {
		if repo, tag, ok := strings.Cut(im, ":"); ok && strings.HasSuffix(repo, "/coredns/coredns") {
			return tag, nil
		}
	}
	return "", fmt.Errorf("catalog: %s has no coredns/coredns image", version)
}

// seedCoreDNS pushes the target's real CoreDNS to the stand-in internet,
// where the catalog names it: bundles carry it, and apply moves the
// sandbox's CoreDNS to it.
func (s *State) seedCoreDNS(ctx context.Context, push func(repoTag string, img v1.Image) error) error {
	if s.CoreDNS == "" {
		return nil
	}
	tag, err := coreDNSTag(s.NewVersion)
	if err != nil {
		return err
	}
	dir, err := kube.Addon(ctx, "coredns", tag)
	if err != nil {
		return err
	}
	img, err := images.CoreDNS(dir)
	if err != nil {
		return err
	}
	return push("coredns/coredns:"+tag, img)
}
