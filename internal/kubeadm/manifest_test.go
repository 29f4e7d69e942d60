package kubeadm

import (
	"context"
	"errors"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"
)

// A rollback puts kubeadm-config's kubernetesVersion and kube-proxy's
// image back through etcd changing leader (the API server's 500
// "etcdserver: leader changed"): an update whose answer was lost had
// applied and is said changed, a read and a patch that failed are made
// again.
func TestSetVersionAndProxyTagThroughALeaderChange(t *testing.T) {
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ConfigNamespace, Name: ConfigMapName},
		Data: map[string]string{ClusterConfigKey: "kind: ClusterConfiguration\nkubernetesVersion: v1.31.14\n"}}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: ConfigNamespace, Name: "kube-proxy"},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "kube-proxy", Image: "registry.local:5000/kube-proxy:v1.31.14"}}}}}}
	c := fake.NewClientset(cm, ds)
	leaderChanged := apierrors.NewInternalError(errors.New("etcdserver: leader changed"))
	fail := map[string]int{"update configmaps": 1, "get daemonsets": 1, "patch daemonsets": 1}
	c.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		key := a.GetVerb() + " " + a.GetResource().Resource
		if fail[key] == 0 {
			return false, nil, nil
		}
		fail[key]--
		if key == "update configmaps" {
			// Applied, and the answer lost on the way back.
			if _, _, err := k8stesting.ObjectReaction(c.Tracker())(a); err != nil {
				t.Fatalf("%s: %v", key, err)
			}
		}
		return true, nil, leaderChanged
	})
	changed, err := SetVersion(ctx, c, "v1.31.14", "v1.31.4")
	if err != nil || !changed {
		t.Fatalf("kubernetesVersion: changed %v, %v", changed, err)
	}
	got, err := c.CoreV1().ConfigMaps(ConfigNamespace).Get(ctx, ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string]any{}
	if err := yaml.Unmarshal([]byte(got.Data[ClusterConfigKey]), &doc); err != nil || doc["kubernetesVersion"] != "v1.31.4" {
		t.Errorf("kubernetesVersion after the rollback: %v (%v)", doc["kubernetesVersion"], err)
	}
	changed, err = SetProxyTag(ctx, c, "v1.31.14", "v1.31.4")
	if err != nil || !changed {
		t.Fatalf("kube-proxy: changed %v, %v", changed, err)
	}
	gotDS, err := c.AppsV1().DaemonSets(ConfigNamespace).Get(ctx, "kube-proxy", metav1.GetOptions{})
	if err != nil || gotDS.Spec.Template.Spec.Containers[0].Image != "registry.local:5000/kube-proxy:v1.31.4" {
		t.Errorf("kube-proxy after the rollback: %v (%v)", gotDS.Spec.Template.Spec.Containers, err)
	}
	for key, n := range fail {
		if n != 0 {
			t.Errorf("%s: %d failures not reached", key, n)
		}
	}
}
