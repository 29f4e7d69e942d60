package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/agent/access"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/test/env/kube"
)

// TestAgentRightsOnARealAPIServer sets agent mode up on a real
// kube-apiserver and acts as an agent (its service account, its bound
// token's node name, by impersonation): it may answer its own node's
// requests and nothing more; RBAC and the admission policy say no to
// the rest.
func TestAgentRightsOnARealAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := startAPIServer(ctx, t)
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // made again, it is the same
		if err := access.Setup(ctx, admin); err != nil {
			t.Fatal(err)
		}
	}
	ns, err := admin.CoreV1().Namespaces().Get(ctx, agent.Namespace, metav1.GetOptions{})
	if err != nil || ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Fatalf("namespace %v: %v", ns.Labels, err)
	}
	requests := map[string]*corev1.Secret{}
	for i, node := range []string{"worker-1", "worker-2"} {
		r, err := agent.NewRequest("r1", node, i+1, nodescript.Exists.Command("/etc"), nil, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := r.Secret()
		if requests[node], err = admin.CoreV1().Secrets(agent.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	as := func(node string) kubernetes.Interface {
		cfg := rest.CopyConfig(cfg)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + agent.Namespace + ":" + access.ServiceAccount,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + agent.Namespace, "system:authenticated"}}
		if node != "" {
			cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
		}
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	agent1 := as("worker-1")
	answer := func(s *corev1.Secret) *corev1.Secret {
		done, err := agent.WithResult(s, agent.Result{Stdout: []byte("yes\n")})
		if err != nil {
			t.Fatal(err)
		}
		return done
	}
	dry := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	// The policy takes effect a moment after it is made: until another
	// node's answer is refused by it (a dry run changes nothing).
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := agent1.CoreV1().Secrets(agent.Namespace).Update(ctx, answer(requests["worker-2"]), dry)
		if err != nil && strings.Contains(err.Error(), "only its own node's step requests") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker-1's agent answering worker-2's request: %v, want refused by %s", err, access.Policy)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if _, err := agent1.CoreV1().Secrets(agent.Namespace).Update(ctx, answer(requests["worker-1"]), metav1.UpdateOptions{}); err != nil {
		t.Errorf("worker-1's agent answering its own request: %v", err)
	}
	got, _ := admin.CoreV1().Secrets(agent.Namespace).Get(ctx, requests["worker-1"].Name, metav1.GetOptions{})
	if res, err := agent.ParseResult(got); err != nil || res == nil || string(res.Stdout) != "yes\n" {
		t.Errorf("the answer read back: %+v %v", res, err)
	}

	noNode := as("")
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "not-a-request", Namespace: agent.Namespace,
		Annotations: map[string]string{agent.AnnotationNode: "worker-1"}}, Data: map[string][]byte{"k": []byte("v")}}
	if other, err = admin.CoreV1().Secrets(agent.Namespace).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		do   func() error
		want string
	}{
		{"change what its own request asks", func() error {
			s := got.DeepCopy()
			s.Data["args"] = []byte(`["/root"]`)
			_, err := agent1.CoreV1().Secrets(agent.Namespace).Update(ctx, s, dry)
			return err
		}, "may not change what a step request asks"},
		{"relabel another node's request as its own", func() error {
			s := requests["worker-2"].DeepCopy()
			s.Labels[agent.LabelNode], s.Annotations[agent.AnnotationNode] = "worker-1", "worker-1"
			_, err := agent1.CoreV1().Secrets(agent.Namespace).Update(ctx, s, dry)
			return err
		}, "only its own node's step requests"},
		{"answer another node's request by a patch", func() error {
			_, err := agent1.CoreV1().Secrets(agent.Namespace).Patch(ctx, requests["worker-2"].Name, types.MergePatchType,
				[]byte(`{"data":{"result":"e30="}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}, "only its own node's step requests"},
		{"change its own answer once given", func() error {
			s := got.DeepCopy()
			s.Data["stdout"] = []byte("no\n")
			_, err := agent1.CoreV1().Secrets(agent.Namespace).Update(ctx, s, dry)
			return err
		}, "may not change an answer once given"},
		{"drop its own request's annotation", func() error {
			s := requests["worker-1"].DeepCopy()
			delete(s.Annotations, agent.AnnotationNode)
			s.ResourceVersion = got.ResourceVersion
			_, err := agent1.CoreV1().Secrets(agent.Namespace).Update(ctx, s, dry)
			return err
		}, "may not change a step request's type, labels or annotations"},
		{"change a Secret that is no request", func() error {
			s := other.DeepCopy()
			s.Data["k"] = []byte("w")
			_, err := agent1.CoreV1().Secrets(agent.Namespace).Update(ctx, s, dry)
			return err
		}, "may not change a step request's type"},
		{"answer with a token that names no node", func() error {
			_, err := noNode.CoreV1().Secrets(agent.Namespace).Update(ctx, answer(requests["worker-2"]), dry)
			return err
		}, "only its own node's step requests"},
		{"create a request", func() error {
			s := requests["worker-1"].DeepCopy()
			s.ResourceVersion, s.Name = "", s.Name+"0"
			_, err := agent1.CoreV1().Secrets(agent.Namespace).Create(ctx, s, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}, "forbidden"},
		{"delete a request", func() error {
			return agent1.CoreV1().Secrets(agent.Namespace).Delete(ctx, requests["worker-2"].Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}, "forbidden"},
		{"read a Secret elsewhere", func() error {
			_, err := agent1.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
			return err
		}, "forbidden"},
		{"read a Node", func() error {
			_, err := agent1.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
			return err
		}, "forbidden"},
		{"patch another Node", func() error {
			_, err := agent1.CoreV1().Nodes().Patch(ctx, "worker-2", types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`),
				metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}, "forbidden"},
		{"evict a pod", func() error {
			return agent1.CoreV1().Pods("kube-system").EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "coredns-1", Namespace: "kube-system"},
				DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}})
		}, "forbidden"},
	} {
		err := tc.do()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("an agent may not %s: %v, want %q", tc.what, err, tc.want)
		}
		if tc.want == "forbidden" && !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v is not Forbidden", tc.what, err)
		}
	}
}

// startAPIServer starts a real kube-apiserver (v1.31.4, etcd from
// Debian) for the test and returns its admin's config.
func startAPIServer(ctx context.Context, t *testing.T) *rest.Config {
	t.Helper()
	bin, err := kube.Binaries(ctx, "v1.31.4", "kube-apiserver")
	if err != nil {
		t.Fatal(err)
	}
	api, err := kube.StartAPIServer(ctx, filepath.Join(t.TempDir(), "apiserver"), bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Stop)
	cfg, err := cluster.Config(api.Kubeconfig, "")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
