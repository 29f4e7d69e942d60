package preflight_test

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/preflight/preflighttest"
	"github.com/kubelift/kubelift/internal/kubeadm"
)

// corednsObjects are a binary cluster's CoreDNS at image, its Corefile
// corefile, with replicas and at most maxUnavailable of them down.
func corednsObjects(image, corefile string, replicas int32, maxUnavailable intstr.IntOrString) (*appsv1.Deployment, *corev1.ConfigMap) {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system"}, Spec: appsv1.DeploymentSpec{
		Replicas: &replicas,
		Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &maxUnavailable}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "coredns", Image: image, Args: []string{"-conf", "/etc/coredns/Corefile"},
				VolumeMounts: []corev1.VolumeMount{{Name: "config-volume", MountPath: "/etc/coredns"}}}},
			Volumes: []corev1.Volume{{Name: "config-volume", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "coredns"}}}}},
		}}}}
	return d, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system"}, Data: map[string]string{"Corefile": corefile}}
}

// A binary cluster's CoreDNS older than the release's is moved (plan
// says from, to and the image import pushed), whatever its Deployment's
// strategy (apply rolls it its own way); one the release's version does
// not support blocks, naming the Corefile and the plugin; a kubeadm
// cluster's is kubeadm's to move.
func TestCoreDNSMovedOnBinaryClusters(t *testing.T) {
	w := preflighttest.New(t)
	w.Opts.Target.Record.Images = []cluster.ImageRecord{
		{Ref: "registry.k8s.io/pause:3.10", Target: "reg.local/k8s/pause:3.10", Digest: "sha256:p"},
		{Ref: "mirror.local:5000/coredns/coredns:v1.11.3", Target: "reg.local/k8s/coredns/coredns:v1.11.3", Digest: "sha256:c"},
	}
	const corefile = ".:53 {\n    errors\n    kubernetes cluster.local\n    forward . /etc/resolv.conf\n}\n"
	d, cm := corednsObjects("reg.local/library/coredns:v1.11.1", corefile, 1, intstr.FromInt32(1))
	w.Opts.Client = fake.NewClientset(d, cm)
	p := w.Plan(t)
	if c := p.CoreDNS; c == nil || c.From != "1.11.1" || c.To != "1.11.3" || c.Image != "reg.local/k8s/coredns/coredns:v1.11.3@sha256:c" || c.MigratesCorefile {
		t.Fatalf("plan's CoreDNS move: %+v", c)
	}
	if fs := preflighttest.Only(p, preflight.CheckCoreDNS); len(fs) != 0 {
		t.Errorf("findings %+v", fs)
	}
	// Required anti-affinity: the new replicas may not fit beside the old.
	d.Spec.Template.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{TopologyKey: "kubernetes.io/hostname"}}}}
	w.Opts.Client = fake.NewClientset(d, cm)
	preflighttest.Want(t, preflighttest.Only(w.Plan(t), preflight.CheckCoreDNS), preflight.Warning, "deployment/kube-system/coredns", "require anti-affinity")

	d, cm = corednsObjects("reg.local/library/coredns:v1.11.1", ".:53 {\n    route53 example.org.:Z1Z2\n}\n", 2, intstr.FromInt32(1))
	w.Opts.Client = fake.NewClientset(d, cm)
	p = w.Plan(t)
	preflighttest.Want(t, preflighttest.Only(p, preflight.CheckCoreDNS), preflight.Blocking, "deployment/kube-system/coredns", "configmap kube-system/coredns key Corefile", `"route53"`)
	if p.CoreDNS != nil || !p.Blocked {
		t.Errorf("unsupported plugin: move %+v, blocked %v", p.CoreDNS, p.Blocked)
	}

	w.View.Kubeadm = &kubeadm.Config{}
	d, cm = corednsObjects("reg.local/library/coredns:v1.11.1", corefile, 2, intstr.FromInt32(1))
	w.Opts.Client = fake.NewClientset(d, cm)
	if p := w.Plan(t); p.CoreDNS != nil || len(preflighttest.Only(p, preflight.CheckCoreDNS)) != 0 {
		t.Errorf("kubeadm cluster: move %+v, findings %+v", p.CoreDNS, preflighttest.Only(p, preflight.CheckCoreDNS))
	}
}
