package access

import (
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	admissionac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	coreac "k8s.io/client-go/applyconfigurations/core/v1"
	metaac "k8s.io/client-go/applyconfigurations/meta/v1"
	rbacac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/agent"
)

// Policy is the admission policy that keeps each agent to its own node's
// requests, and to their answers.
const Policy = "kubelift-agent-own-node"

// agentUser is the agents' service account as a user.
const agentUser = "system:serviceaccount:" + agent.Namespace + ":" + ServiceAccount

// policyValidations are the policy's rules, in CEL: an agent's update of a
// Secret in the namespace passes only where the request is its own
// node's (the node its bound token names) and only its answer changes.
var policyValidations = []struct{ expression, message string }{
	{`has(request.userInfo.extra) && 'authentication.kubernetes.io/node-name' in request.userInfo.extra && has(oldObject.metadata.annotations) && '` + agent.AnnotationNode + `' in oldObject.metadata.annotations && oldObject.metadata.annotations['` + agent.AnnotationNode + `'] == request.userInfo.extra['authentication.kubernetes.io/node-name'][0]`,
		"a kubelift agent may answer only its own node's step requests (its token names the node)"},
	{`oldObject.type == '` + string(agent.SecretType) + `' && object.type == oldObject.type && has(object.metadata.labels) && has(object.metadata.annotations) && object.metadata.labels == oldObject.metadata.labels && object.metadata.annotations == oldObject.metadata.annotations`,
		"a kubelift agent may not change a step request's type, labels or annotations"},
	{`['script', 'args', 'stdin', 'deadline'].all(k, (k in oldObject.data) == (k in object.data) && (!(k in oldObject.data) || object.data[k] == oldObject.data[k]))`,
		"a kubelift agent may not change what a step request asks"},
	{`!('result' in oldObject.data)`, "a kubelift agent may not change an answer once given"},
}

// Made is what agent mode makes in the cluster for a run from image on
// nodes nodes, as plan lists it (Setup's objects, kept between runs;
// the pods and requests, deleted at the run's end).
func Made(image string, nodes int) []agent.Made {
	ns := agent.Namespace + "/"
	return []agent.Made{
		{Kind: "Namespace", Name: agent.Namespace, What: "Pod Security enforce=privileged: the agents' pods are privileged (kept)"},
		{Kind: "ValidatingAdmissionPolicy", Name: Policy, What: "an agent may update only its own node's step requests (the node its bound token names), only to answer each once (kept)"},
		{Kind: "ValidatingAdmissionPolicyBinding", Name: Policy, What: "the policy, denying (kept)"},
		{Kind: "ServiceAccount", Name: ns + ServiceAccount, What: "the agents' (kept)"},
		{Kind: "Role", Name: ns + ServiceAccount, What: "secrets in " + agent.Namespace + ": get, list, watch, update, patch; no create, no delete, nothing else (kept)"},
		{Kind: "RoleBinding", Name: ns + ServiceAccount, What: "the Role to the agents' service account (kept)"},
		{Kind: "Pod", Name: fmt.Sprintf("%skubelift-agent-NODEHASH (%d, one per node)", ns, nodes), What: "image " + image + " (IfNotPresent), privileged, the host's / at /host, host network; deleted at the run's end"},
		{Kind: "Secret", Name: ns + "kubelift-step-RUN-NODEHASH-SEQ", What: "one per node step, type " + string(agent.SecretType) + "; deleted at the run's end"},
	}
}

// Setup makes, or brings up to date, what agent mode needs in the
// cluster: the namespace (Pod Security privileged: the agents' pods are),
// the agents' service account, a Role that lets it read and answer the
// requests (no create, no delete, nothing else), and the admission
// policy that keeps each agent to its own node's requests (bound tokens
// name the node since Kubernetes v1.30).
func Setup(ctx context.Context, c kubernetes.Interface) error {
	apply := metav1.ApplyOptions{FieldManager: "kubelift", Force: true}
	ns := coreac.Namespace(agent.Namespace).WithLabels(map[string]string{
		"pod-security.kubernetes.io/enforce": "privileged", "app.kubernetes.io/managed-by": "kubelift"})
	if _, err := c.CoreV1().Namespaces().Apply(ctx, ns, apply); err != nil {
		return fmt.Errorf("namespace %s: %w", agent.Namespace, err)
	}
	// The policy before the rights it bounds (it takes effect a moment
	// after it is made; the agents' pods start after Setup).
	spec := admissionac.ValidatingAdmissionPolicySpec().
		WithFailurePolicy(admissionv1.Fail).
		WithMatchConstraints(admissionac.MatchResources().
			WithNamespaceSelector(metaac.LabelSelector().WithMatchLabels(map[string]string{corev1.LabelMetadataName: agent.Namespace})).
			WithResourceRules(admissionac.NamedRuleWithOperations().
				WithOperations(admissionv1.Update).WithAPIGroups("").WithAPIVersions("v1").WithResources("secrets"))).
		WithMatchConditions(admissionac.MatchCondition().WithName("agent").WithExpression(`request.userInfo.username == '` + agentUser + `'`))
	for _, v := range policyValidations {
		spec.WithValidations(admissionac.Validation().WithExpression(v.expression).WithMessage(v.message))
	}
	vap := admissionac.ValidatingAdmissionPolicy(Policy).WithSpec(spec)
	if _, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Apply(ctx, vap, apply); err != nil {
		return fmt.Errorf("validating admission policy %s: %w", Policy, err)
	}
	vapb := admissionac.ValidatingAdmissionPolicyBinding(Policy).WithSpec(admissionac.ValidatingAdmissionPolicyBindingSpec().
		WithPolicyName(Policy).WithValidationActions(admissionv1.Deny))
	if _, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Apply(ctx, vapb, apply); err != nil {
		return fmt.Errorf("validating admission policy binding %s: %w", Policy, err)
	}
	sa := coreac.ServiceAccount(ServiceAccount, agent.Namespace)
	if _, err := c.CoreV1().ServiceAccounts(agent.Namespace).Apply(ctx, sa, apply); err != nil {
		return fmt.Errorf("service account %s/%s: %w", agent.Namespace, ServiceAccount, err)
	}
	role := rbacac.Role(ServiceAccount, agent.Namespace).WithRules(rbacac.PolicyRule().
		WithAPIGroups("").WithResources("secrets").WithVerbs("get", "list", "watch", "update", "patch"))
	if _, err := c.RbacV1().Roles(agent.Namespace).Apply(ctx, role, apply); err != nil {
		return fmt.Errorf("role %s/%s: %w", agent.Namespace, ServiceAccount, err)
	}
	binding := rbacac.RoleBinding(ServiceAccount, agent.Namespace).
		WithRoleRef(rbacac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(ServiceAccount)).
		WithSubjects(rbacac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(ServiceAccount).WithNamespace(agent.Namespace))
	if _, err := c.RbacV1().RoleBindings(agent.Namespace).Apply(ctx, binding, apply); err != nil {
		return fmt.Errorf("role binding %s/%s: %w", agent.Namespace, ServiceAccount, err)
	}
	return nil
}
