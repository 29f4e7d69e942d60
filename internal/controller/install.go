package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	appsac "k8s.io/client-go/applyconfigurations/apps/v1"
	coreac "k8s.io/client-go/applyconfigurations/core/v1"
	metaac "k8s.io/client-go/applyconfigurations/meta/v1"
	rbacac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/agent/access"
	"github.com/kubelift/kubelift/internal/agent/image"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/coredns"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/upgradeapi"
	"github.com/kubelift/kubelift/internal/upgradelock"
	"github.com/kubelift/kubelift/manifests"
)

// Names of what Install makes, in agent mode's namespace.
const (
	Name       = "kubelift-controller"      // the Deployment, its account, its roles
	SecretName = "kubelift-controller-auth" // the registry's password and CA
	TrustName  = "kubelift-controller-key"  // the team's public key
)

// Where the controller's pod mounts what it is given.
const (
	TrustDir    = "/etc/kubelift/trust"
	RegistryDir = "/etc/kubelift/registry"
	CacheDir    = "/var/cache/kubelift"
)

// Install is the controller as `upgrade controller install` makes it.
type Install struct {
	// Image is the agents' image (REPOSITORY@DIGEST), whose program is
	// also the controller.
	Image    string
	Replicas int32
	// Registry: the private registry the controller reads releases from.
	Domain, Username, Password string
	CA                         []byte
	SkipTLSVerify, PlainHTTP   bool
	// Key is the team's public key (PEM); AllowUnsigned takes unsigned
	// bundles instead.
	Key           []byte
	AllowUnsigned bool
	// AgentQPS is the budget of agent mode's requests (0: the default).
	AgentQPS float32
	// NodeCredentials is what nodes pulling from the registry are handed
	// (stage's --node-credentials; "": token).
	NodeCredentials string
	// Catalog names the API groups whose removed versions the plan
	// counts objects of: the controller may list those.
	Catalog *catalog.Catalog
}

// Made lists what Install makes, for --dry-run and the docs.
func (in Install) Made() []agent.Made {
	ns := agent.Namespace + "/"
	return append(access.Made(in.Image, 0)[:6],
		agent.Made{Kind: "CustomResourceDefinition", Name: "upgrades.kubelift.dev", What: "the Upgrade resource (kept)"},
		agent.Made{Kind: "ServiceAccount", Name: ns + Name, What: "the controller's"},
		agent.Made{Kind: "ClusterRole", Name: Name, What: "what a run reads and changes cluster-wide (docs/controller.md)"},
		agent.Made{Kind: "Role", Name: ns + Name, What: "agent mode's pods and step requests, the leader Lease"},
		agent.Made{Kind: "Role", Name: "kube-system/" + Name, What: "the record, the lock, the cluster's releases, CoreDNS and kube-proxy"},
		agent.Made{Kind: "Role", Name: "default/" + Name, What: "the kubernetes Service's EndpointSlices: the API servers' port"},
		agent.Made{Kind: "Role", Name: corev1.NamespaceNodeLease + "/" + Name, What: "the kubelets' Leases, read: a rolled-back kubelet is alive"},
		agent.Made{Kind: "Secret", Name: ns + SecretName, What: "the registry's password and CA"},
		agent.Made{Kind: "ConfigMap", Name: ns + TrustName, What: "the team's public key"},
		agent.Made{Kind: "Deployment", Name: ns + Name, What: fmt.Sprintf("%d replicas of %s, one leading (Lease %s%s)", in.Replicas, in.Image, ns, LeaseName)},
	)
}

// Apply makes (or updates) the controller, its CRD and its rights.
func (in Install) Apply(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface) error {
	if err := ApplyCRD(ctx, dyn); err != nil {
		return err
	}
	if err := access.Setup(ctx, kube); err != nil {
		return err
	}
	apply := metav1.ApplyOptions{FieldManager: "kubelift", Force: true}
	ns := agent.Namespace
	labels := map[string]string{"app.kubernetes.io/name": Name, "app.kubernetes.io/managed-by": "kubelift"}
	if _, err := kube.CoreV1().ServiceAccounts(ns).Apply(ctx, coreac.ServiceAccount(Name, ns).WithLabels(labels), apply); err != nil {
		return fmt.Errorf("service account %s/%s: %w", ns, Name, err)
	}
	cr := rbacac.ClusterRole(Name).WithLabels(labels).WithRules(in.clusterRules()...)
	if _, err := kube.RbacV1().ClusterRoles().Apply(ctx, cr, apply); err != nil {
		return fmt.Errorf("cluster role %s: %w", Name, err)
	}
	subject := rbacac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(Name).WithNamespace(ns)
	crb := rbacac.ClusterRoleBinding(Name).WithLabels(labels).WithSubjects(subject).
		WithRoleRef(rbacac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(Name))
	if _, err := kube.RbacV1().ClusterRoleBindings().Apply(ctx, crb, apply); err != nil {
		return fmt.Errorf("cluster role binding %s: %w", Name, err)
	}
	for roleNS, rules := range map[string][]*rbacac.PolicyRuleApplyConfiguration{ns: agentNamespaceRules(), metav1.NamespaceSystem: kubeSystemRules(),
		// In a pod, the API servers' own port (for each one's /readyz)
		// is the kubernetes Service's EndpointSlice's.
		metav1.NamespaceDefault: {rule([]string{"discovery.k8s.io"}, []string{"endpointslices"}, "list")},
		// A node's rollback waits for its kubelet's Lease renewed.
		corev1.NamespaceNodeLease: {rule([]string{"coordination.k8s.io"}, []string{"leases"}, "get")}} {
		role := rbacac.Role(Name, roleNS).WithLabels(labels).WithRules(rules...)
		if _, err := kube.RbacV1().Roles(roleNS).Apply(ctx, role, apply); err != nil {
			return fmt.Errorf("role %s/%s: %w", roleNS, Name, err)
		}
		rb := rbacac.RoleBinding(Name, roleNS).WithLabels(labels).WithSubjects(subject).
			WithRoleRef(rbacac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(Name))
		if _, err := kube.RbacV1().RoleBindings(roleNS).Apply(ctx, rb, apply); err != nil {
			return fmt.Errorf("role binding %s/%s: %w", roleNS, Name, err)
		}
	}
	secret := coreac.Secret(SecretName, ns).WithLabels(labels).WithType(corev1.SecretTypeOpaque).
		WithData(map[string][]byte{"password": []byte(in.Password), "ca.crt": in.CA})
	if _, err := kube.CoreV1().Secrets(ns).Apply(ctx, secret, apply); err != nil {
		return fmt.Errorf("secret %s/%s: %w", ns, SecretName, err)
	}
	cm := coreac.ConfigMap(TrustName, ns).WithLabels(labels).WithData(map[string]string{"key.pub": string(in.Key)})
	if _, err := kube.CoreV1().ConfigMaps(ns).Apply(ctx, cm, apply); err != nil {
		return fmt.Errorf("configmap %s/%s: %w", ns, TrustName, err)
	}
	if _, err := kube.AppsV1().Deployments(ns).Apply(ctx, in.deployment(labels), apply); err != nil {
		return fmt.Errorf("deployment %s/%s: %w", ns, Name, err)
	}
	return nil
}

// Args are the controller's command line in its pod.
func (in Install) Args() []string {
	args := []string{"controller", "--cache-dir", CacheDir}
	if in.AllowUnsigned && len(in.Key) == 0 {
		args = append(args, "--allow-unsigned")
	} else {
		args = append(args, "--key", TrustDir+"/key.pub")
	}
	if in.Domain != "" {
		args = append(args, "--domain", in.Domain)
	}
	if in.Username != "" {
		args = append(args, "--username", in.Username)
	}
	if len(in.CA) > 0 {
		args = append(args, "--ca-file", RegistryDir+"/ca.crt")
	}
	if in.SkipTLSVerify {
		args = append(args, "--insecure-skip-tls-verify")
	}
	if in.PlainHTTP {
		args = append(args, "--plain-http")
	}
	if in.NodeCredentials != "" {
		args = append(args, "--node-credentials", in.NodeCredentials)
	}
	if in.AgentQPS > 0 {
		args = append(args, "--agent-qps", fmt.Sprint(in.AgentQPS))
	}
	return args
}

// PasswordEnv and PodNameEnv are what the controller's pod sets.
const (
	PasswordEnv = "KUBELIFT_REGISTRY_PASSWORD"
	PodNameEnv  = "KUBELIFT_POD_NAME"
)

func (in Install) deployment(labels map[string]string) *appsac.DeploymentApplyConfiguration {
	optional := true
	container := coreac.Container().WithName("controller").WithImage(in.Image).WithImagePullPolicy(corev1.PullIfNotPresent).
		WithCommand(image.Program).WithArgs(in.Args()...).
		WithEnv(
			coreac.EnvVar().WithName(PodNameEnv).WithValueFrom(coreac.EnvVarSource().WithFieldRef(coreac.ObjectFieldSelector().WithFieldPath("metadata.name"))),
			coreac.EnvVar().WithName(PasswordEnv).WithValueFrom(coreac.EnvVarSource().WithSecretKeyRef(
				coreac.SecretKeySelector().WithName(SecretName).WithKey("password").WithOptional(optional)))).
		WithVolumeMounts(
			coreac.VolumeMount().WithName("trust").WithMountPath(TrustDir).WithReadOnly(true),
			coreac.VolumeMount().WithName("registry").WithMountPath(RegistryDir).WithReadOnly(true),
			coreac.VolumeMount().WithName("cache").WithMountPath(CacheDir)).
		WithSecurityContext(coreac.SecurityContext().WithRunAsNonRoot(true).WithRunAsUser(65532).WithAllowPrivilegeEscalation(false).
			WithReadOnlyRootFilesystem(true).WithCapabilities(coreac.Capabilities().WithDrop("ALL")))
	pod := coreac.PodSpec().WithServiceAccountName(Name).
		// The API server's address as the node sees it: the service
		// network may be what is being upgraded.
		WithHostNetwork(true).WithDNSPolicy(corev1.DNSClusterFirstWithHostNet).
		// It runs the upgrade of the node it is on, and of nodes that go
		// NotReady for a moment: it tolerates everything.
		WithTolerations(coreac.Toleration().WithOperator(corev1.TolerationOpExists)).
		// The nodes in flight finish within StopTimeout of SIGTERM.
		WithTerminationGracePeriodSeconds(int64((StopTimeout+15*time.Second)/time.Second)).
		WithContainers(container).
		WithVolumes(
			coreac.Volume().WithName("trust").WithConfigMap(coreac.ConfigMapVolumeSource().WithName(TrustName)),
			coreac.Volume().WithName("registry").WithSecret(coreac.SecretVolumeSource().WithSecretName(SecretName).
				WithItems(coreac.KeyToPath().WithKey("ca.crt").WithPath("ca.crt"))),
			coreac.Volume().WithName("cache").WithEmptyDir(coreac.EmptyDirVolumeSource()))
	return appsac.Deployment(Name, agent.Namespace).WithLabels(labels).WithSpec(appsac.DeploymentSpec().
		WithReplicas(in.Replicas).
		WithSelector(metaac.LabelSelector().WithMatchLabels(map[string]string{"app.kubernetes.io/name": Name})).
		// A new leader only after the old one has stopped.
		WithStrategy(appsac.DeploymentStrategy().WithType(appsv1.RecreateDeploymentStrategyType)).
		WithTemplate(coreac.PodTemplateSpec().WithLabels(labels).WithSpec(pod)))
}

func rule(groups []string, resources []string, verbs ...string) *rbacac.PolicyRuleApplyConfiguration {
	return rbacac.PolicyRule().WithAPIGroups(groups...).WithResources(resources...).WithVerbs(verbs...)
}

var core = []string{""}

// clusterRules is what a run reads and changes cluster-wide: Nodes
// (cordon, annotations), pods' tolerations and evictions, the workloads
// the gate watches, the Upgrades, and the objects of API versions the
// catalog says go.
func (in Install) clusterRules() []*rbacac.PolicyRuleApplyConfiguration {
	rules := []*rbacac.PolicyRuleApplyConfiguration{
		rule(core, []string{"nodes"}, "get", "list", "watch", "patch"),
		rule(core, []string{"pods"}, "get", "list", "watch", "patch"),
		rule(core, []string{"pods/eviction"}, "create"),
		rule(core, []string{"events"}, "create", "patch"),
		rule(core, []string{"namespaces"}, "get", "list"),
		rule([]string{"apps"}, []string{"deployments", "daemonsets", "statefulsets", "replicasets"}, "get", "list", "watch"),
		rule([]string{"policy"}, []string{"poddisruptionbudgets"}, "get", "list", "watch"),
		rule([]string{upgradeapi.Group}, []string{"upgrades"}, "get", "list", "watch"),
		rule([]string{upgradeapi.Group}, []string{"upgrades/status"}, "get", "update", "patch"),
		// Agent mode's Setup re-applies its own objects, by name.
		rule(core, []string{"namespaces"}, "patch").WithResourceNames(agent.Namespace),
		rule([]string{"admissionregistration.k8s.io"}, []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"}, "get", "patch").
			WithResourceNames(access.Policy),
	}
	groups := map[string][]string{}
	if in.Catalog != nil {
		for _, r := range in.Catalog.Versions {
			for _, s := range r.RemovedAPIs {
				if a, err := catalog.ParseRemovedAPI(s); err == nil && !slices.Contains(groups[a.Group], a.Resource) {
					groups[a.Group] = append(groups[a.Group], a.Resource)
				}
			}
		}
	}
	for _, g := range slices.Sorted(maps.Keys(groups)) {
		resources := []string{"*"} // a whole group-version goes: its resources are found by discovery
		if !slices.Contains(groups[g], "") {
			resources = slices.Sorted(slices.Values(groups[g]))
		}
		rules = append(rules, rule([]string{g}, resources, "list"))
	}
	return rules
}

// agentNamespaceRules is agent mode's part: the agents' pods and the
// step requests (Secrets) in their namespace, re-applying its account
// and role, and the controller's leader Lease.
func agentNamespaceRules() []*rbacac.PolicyRuleApplyConfiguration {
	return []*rbacac.PolicyRuleApplyConfiguration{
		rule(core, []string{"pods"}, "get", "list", "watch", "create", "delete", "deletecollection"),
		rule(core, []string{"secrets"}, "get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"),
		rule(core, []string{"serviceaccounts"}, "get", "patch").WithResourceNames(access.ServiceAccount),
		rule([]string{"rbac.authorization.k8s.io"}, []string{"roles", "rolebindings"}, "get", "patch").WithResourceNames(access.ServiceAccount),
		rule([]string{"coordination.k8s.io"}, []string{"leases"}, "get", "create", "update").WithResourceNames(LeaseName),
		rule([]string{"coordination.k8s.io"}, []string{"leases"}, "create"),
	}
}

// kubeSystemRules is the run's part of kube-system: its record, its
// lock, the cluster's imported releases and kubeadm's configuration
// (ConfigMaps), the components' leader Leases, CoreDNS's Deployment and
// Service, and kube-proxy's DaemonSet, which the node stack moves.
func kubeSystemRules() []*rbacac.PolicyRuleApplyConfiguration {
	return []*rbacac.PolicyRuleApplyConfiguration{
		rule(core, []string{"configmaps"}, "get", "list", "watch", "create", "update", "patch"),
		rule(core, []string{"pods/proxy"}, "get"),
		// CoreDNS's roll points its Service at the new pods, and back.
		rule(core, []string{"services"}, "get", "list", "update"),
		rule([]string{"coordination.k8s.io"}, []string{"leases"}, "get", "list", "watch"),
		rule([]string{"coordination.k8s.io"}, []string{"leases"}, "create"),
		rule([]string{"coordination.k8s.io"}, []string{"leases"}, "update", "patch").WithResourceNames(upgradelock.Name),
		rule([]string{"apps"}, []string{"deployments"}, "update", "patch").WithResourceNames(coredns.Name),
		rule([]string{"apps"}, []string{"daemonsets"}, "update", "patch").WithResourceNames(kubeadm.KubeProxyName),
	}
}

// ApplyCRD applies the Upgrade CRD and waits until it is served.
func ApplyCRD(ctx context.Context, dyn dynamic.Interface) error {
	var obj map[string]any
	if err := yaml.Unmarshal(manifests.UpgradeCRD, &obj); err != nil {
		return fmt.Errorf("manifests/upgrade-crd.yaml: %w", err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	u := &unstructured.Unstructured{Object: obj}
	if _, err := crds.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: "kubelift", Force: true}); err != nil {
		return fmt.Errorf("customresourcedefinition %s: %w", u.GetName(), err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		got, err := crds.Get(ctx, u.GetName(), metav1.GetOptions{})
		if err == nil && established(got) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("customresourcedefinition %s: not established within a minute (%v)", u.GetName(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
