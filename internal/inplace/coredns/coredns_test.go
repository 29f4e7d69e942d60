package coredns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// kubeadmCorefile is the Corefile kubeadm v1.30 writes.
const kubeadmCorefile = `.:53 {
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

// transferCorefile has the kubernetes plugin's transfer option, which
// CoreDNS 1.8.0 removed (the transfer plugin took it over).
const transferCorefile = `.:53 {
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        transfer to 1.2.3.4 5.6.7.8
    }
}
`

// deployment is CoreDNS as kubeadm deploys it.
func deployment(image string) *appsv1.Deployment {
	two, one := int32(2), intstr.FromInt32(1)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: Name, Namespace: Namespace},
		Spec: appsv1.DeploymentSpec{Replicas: &two,
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &one}},
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}}, Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"k8s-app": "kube-dns"}},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{Name: "coredns", Image: image, Args: []string{"-conf", "/etc/coredns/Corefile"},
						VolumeMounts: []corev1.VolumeMount{{Name: "config-volume", MountPath: "/etc/coredns", ReadOnly: true}}}},
					Volumes: []corev1.Volume{{Name: "config-volume", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: Name}, Items: []corev1.KeyToPath{{Key: "Corefile", Path: "Corefile"}}}}}},
				},
			}},
	}
}

// cluster is a fake cluster whose Deployment controller rolls every new
// template at once, through a ReplicaSet of the revision, but for pods of
// the images notReady, which never become ready; the Service kube-dns
// selects the pods. rolled lists what happened, in order: each pod
// template written ("IMAGE KEY", with the strategy and minReadySeconds it
// rolled with), each selector the Service was given ("kube-dns
// SELECTOR").
func cluster(t *testing.T, image, corefile string, notReady ...string) (*fake.Clientset, *[]string) {
	t.Helper()
	d := deployment(image)
	d.UID, d.Generation = "dep-uid", 1
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: 1, Replicas: 2, UpdatedReplicas: 2, AvailableReplicas: 2}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: Namespace}, Spec: corev1.ServiceSpec{Selector: map[string]string{"k8s-app": "kube-dns"}}}
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: Namespace}, Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "other"}}}
	c := fake.NewClientset(d, svc, other, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: Name, Namespace: Namespace}, Data: map[string]string{"Corefile": corefile}})
	var rolled []string
	revision := 0
	// The controller's ReplicaSet for a template: the one it made for an
	// equal one before (a roll back to it), else a new one.
	replicaSet := func(d *appsv1.Deployment, ready int32) error {
		rss, err := c.Tracker().List(appsv1.SchemeGroupVersion.WithResource("replicasets"), appsv1.SchemeGroupVersion.WithKind("ReplicaSet"), Namespace)
		if err != nil {
			return err
		}
		for _, rs := range rss.(*appsv1.ReplicaSetList).Items {
			if sameTemplate(rs.Spec.Template, d.Spec.Template) {
				rs.Status.ReadyReplicas = ready
				return c.Tracker().Update(appsv1.SchemeGroupVersion.WithResource("replicasets"), &rs, Namespace)
			}
		}
		revision++
		rev := strconv.Itoa(revision)
		two := int32(2)
		tpl := *d.Spec.Template.DeepCopy()
		tpl.Labels = map[string]string{"k8s-app": "kube-dns", appsv1.DefaultDeploymentUniqueLabelKey: "h" + rev}
		return c.Tracker().Add(&appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "coredns-" + rev, Namespace: Namespace,
			Labels:          map[string]string{"k8s-app": "kube-dns", appsv1.DefaultDeploymentUniqueLabelKey: "h" + rev},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(d, appsv1.SchemeGroupVersion.WithKind("Deployment"))}},
			Spec: appsv1.ReplicaSetSpec{Replicas: &two, Template: tpl}, Status: appsv1.ReplicaSetStatus{ReadyReplicas: ready}})
	}
	if err := replicaSet(d, 2); err != nil {
		t.Fatal(err)
	}
	c.PrependReactor("update", "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		d := a.(k8stesting.UpdateAction).GetObject().(*appsv1.Deployment)
		was, err := c.Tracker().Get(appsv1.SchemeGroupVersion.WithResource("deployments"), Namespace, d.Name)
		if err != nil {
			return true, nil, err
		}
		d.Generation++
		if apiequality.Semantic.DeepEqual(was.(*appsv1.Deployment).Spec.Template, d.Spec.Template) {
			d.Status.ObservedGeneration = d.Generation // knobs only: no rollout
			return false, nil, nil
		}
		spec := d.Spec.Template.Spec
		ready := int32(2)
		if slices.Contains(notReady, spec.Containers[0].Image) {
			ready = 1
		}
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 2, UpdatedReplicas: 2, AvailableReplicas: ready}
		if err := replicaSet(d, ready); err != nil {
			return true, nil, err
		}
		mu := d.Spec.Strategy.RollingUpdate.MaxUnavailable
		rolled = append(rolled, fmt.Sprintf("%s %s (maxUnavailable %s, minReadySeconds %d)", spec.Containers[0].Image, spec.Volumes[0].ConfigMap.Items[0].Key, mu, d.Spec.MinReadySeconds))
		return false, nil, nil
	})
	c.PrependReactor("update", "services", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.UpdateAction).GetObject().(*corev1.Service)
		rolled = append(rolled, fmt.Sprintf("%s %v", s.Name, s.Spec.Selector))
		return false, nil, nil
	})
	return c, &rolled
}

// lastTemplate is the last pod template rolled.
func lastTemplate(rolled []string) string {
	for i := len(rolled) - 1; i >= 0; i-- {
		if !strings.HasPrefix(rolled[i], "kube-dns ") {
			return rolled[i]
		}
	}
	return ""
}

// knobsAsBefore checks a roll put back what it changed while it ran: the
// Deployment's strategy and minReadySeconds, the Service's selector.
func knobsAsBefore(t *testing.T, c *fake.Clientset) {
	t.Helper()
	d, err := c.AppsV1().Deployments(Namespace).Get(context.Background(), Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Spec.Strategy.RollingUpdate.MaxUnavailable.String() != "1" || d.Spec.MinReadySeconds != 0 {
		t.Errorf("after the roll the Deployment has %+v, minReadySeconds %d", d.Spec.Strategy, d.Spec.MinReadySeconds)
	}
	s, err := c.CoreV1().Services(Namespace).Get(context.Background(), "kube-dns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(s.Spec.Selector) != "map[k8s-app:kube-dns]" {
		t.Errorf("after the roll the Service selects %v", s.Spec.Selector)
	}
}

// planned is c's CoreDNS found and its move to image planned.
func planned(t *testing.T, c *fake.Clientset, image string) (*Found, *Move) {
	t.Helper()
	f, err := Find(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Plan(f, image)
	if err != nil {
		t.Fatal(err)
	}
	return f, m
}

func roller(c *fake.Clientset) Roller {
	return Roller{Client: c, Timeout: time.Minute, Log: slog.New(slog.DiscardHandler)}
}

func corefile(t *testing.T, c *fake.Clientset) map[string]string {
	t.Helper()
	cm, err := c.CoreV1().ConfigMaps(Namespace).Get(context.Background(), Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm.Data
}

func TestPlan(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, from, to, corefile string
		want                     string // the move's To, "" for none
		changes                  bool
		err                      string
	}{
		{name: "patch, nothing to migrate", from: "reg/coredns/coredns:v1.11.1", to: "reg.local/lib/coredns/coredns:v1.11.3@sha256:ab", corefile: kubeadmCorefile, want: "1.11.3"},
		{name: "at the release's", from: "reg/coredns:v1.11.3", to: "reg.local/coredns:1.11.3", corefile: kubeadmCorefile},
		{name: "a removed option migrated", from: "reg/coredns:1.7.1", to: "reg/coredns:1.8.0", corefile: transferCorefile, want: "1.8.0", changes: true},
		{name: "older", from: "reg/coredns:v1.11.3", to: "reg/coredns:v1.11.1", corefile: kubeadmCorefile, err: "older"},
		{name: "unknown to the library", from: "reg/coredns:v1.11.1", to: "reg/coredns:v9.0.0", corefile: kubeadmCorefile, err: "knows no such version"},
		{name: "unsupported plugin", from: "reg/coredns:1.3.1", to: "reg/coredns:1.5.0", corefile: ".:53 {\n    route53 example.org.:Z1Z2\n}\n", err: `"route53"`},
		{name: "no version tag", from: "reg/coredns:latest", to: "reg/coredns:v1.11.3", corefile: kubeadmCorefile, err: `tag "latest"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := cluster(t, tc.from, tc.corefile)
			f, err := Find(ctx, c)
			var m *Move
			if err == nil {
				m, err = Plan(f, tc.to)
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (m == nil) != (tc.want == "") || m != nil && (m.To != tc.want || m.CorefileChanges(f) != tc.changes) {
				t.Fatalf("move = %+v, want to %q, Corefile changed %v", m, tc.want, tc.changes)
			}
			if tc.changes && (!strings.Contains(m.Corefile, "transfer cluster.local") || len(m.Notices) == 0) {
				t.Errorf("migrated Corefile:\n%s\nnotices %q", m.Corefile, m.Notices)
			}
		})
	}
}

func TestFindRefusesWhatDoesNotParse(t *testing.T) {
	ctx := context.Background()
	if f, err := Find(ctx, fake.NewClientset()); f != nil || err != nil {
		t.Fatalf("no CoreDNS: %v, %v", f, err)
	}
	d := deployment("reg/coredns:v1.11.1")
	d.Spec.Template.Spec.Containers[0].VolumeMounts[0].MountPath = "/etc/other"
	_, err := Find(ctx, fake.NewClientset(d))
	if err == nil || !strings.Contains(err.Error(), "deployment kube-system/coredns: container coredns: no volume mounted at /etc/coredns/") {
		t.Fatalf("err = %v", err)
	}
}

// A move whose Corefile stays changes only the image, and keeps what it
// replaced; undo puts it back, once.
func TestApplyAndUndo(t *testing.T) {
	ctx := context.Background()
	c, rolled := cluster(t, "reg/coredns:v1.11.1", kubeadmCorefile)
	f, m := planned(t, c, "priv/coredns:v1.11.3")
	r := roller(c)
	if err := r.Apply(ctx, f, m); err != nil {
		t.Fatal(err)
	}
	// The new pods all up before an old one stops, the old ones out of
	// the Service while they still answer, then everything as it was.
	if got, want := strings.Join(*rolled, ", "), "priv/coredns:v1.11.3 Corefile (maxUnavailable 0, minReadySeconds 400), "+
		"kube-dns map[k8s-app:kube-dns pod-template-hash:h2], kube-dns map[k8s-app:kube-dns]"; got != want {
		t.Fatalf("rolled %s\nwant   %s", got, want)
	}
	knobsAsBefore(t, c)
	if got := corefile(t, c); len(got) != 1 || got["Corefile"] != kubeadmCorefile {
		t.Fatalf("configmap after a move that migrates nothing: %v", got)
	}
	b, err := r.Backup(ctx)
	if err != nil || b == nil || b.Image != "reg/coredns:v1.11.1" || b.To != "priv/coredns:v1.11.3" || b.Corefile != kubeadmCorefile {
		t.Fatalf("backup %+v, %v", b, err)
	}
	f2, err := Find(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if m2, err := Plan(f2, "priv/coredns:v1.11.3"); m2 != nil || err != nil {
		t.Fatalf("second plan: %+v, %v", m2, err)
	}
	if ok, err := r.Rolled(ctx, f2); !ok || err != nil {
		t.Fatalf("Rolled after the move = %v, %v", ok, err)
	}
	if undone, err := r.Undo(ctx); !undone || err != nil {
		t.Fatalf("undo = %v, %v", undone, err)
	}
	if got := lastTemplate(*rolled); got != "reg/coredns:v1.11.1 Corefile (maxUnavailable 0, minReadySeconds 400)" {
		t.Fatalf("after undo the template runs %s", got)
	}
	knobsAsBefore(t, c)
	if undone, err := r.Undo(ctx); undone || err != nil {
		t.Fatalf("second undo = %v, %v: it had nothing to put back", undone, err)
	}
}

// A move that migrates the Corefile moves the old pods onto a copy of the
// old one first, so that no running CoreDNS reads the new one, then rolls
// the new version onto the migrated Corefile; undo puts the old Corefile
// back and takes the copy away. A run stopped after the first roll goes
// on from the backup it kept.
func TestApplyMigratesTheCorefileInKubeadmsOrder(t *testing.T) {
	ctx := context.Background()
	c, rolled := cluster(t, "reg/coredns:1.7.1", transferCorefile)
	f, m := planned(t, c, "priv/coredns:1.8.0")
	r := roller(c)
	// Stopped after the old pods moved onto the copy: found half-way.
	stop := errStop{}
	c.PrependReactor("update", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		cm := a.(k8stesting.UpdateAction).GetObject().(*corev1.ConfigMap)
		if cm.Name == Name && cm.Data["Corefile"] != transferCorefile && len(*rolled) == 3 && !stop.done {
			stop.done = true
			return true, nil, stop
		}
		return false, nil, nil
	})
	if err := r.Apply(ctx, f, m); !errors.Is(err, stop) {
		t.Fatalf("first apply: %v", err)
	}
	f, m = planned(t, c, "priv/coredns:1.8.0")
	if f.Key != backupKey || f.Corefile != transferCorefile {
		t.Fatalf("half-way, CoreDNS reads key %s:\n%s", f.Key, f.Corefile)
	}
	if err := r.Apply(ctx, f, m); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(*rolled, ", "), "reg/coredns:1.7.1 Corefile-backup (maxUnavailable 0, minReadySeconds 400), "+
		"kube-dns map[k8s-app:kube-dns pod-template-hash:h2], kube-dns map[k8s-app:kube-dns], "+
		"priv/coredns:1.8.0 Corefile (maxUnavailable 0, minReadySeconds 400), "+
		"kube-dns map[k8s-app:kube-dns pod-template-hash:h3], kube-dns map[k8s-app:kube-dns]"; got != want {
		t.Fatalf("rolled %s\nwant   %s", got, want)
	}
	knobsAsBefore(t, c)
	data := corefile(t, c)
	if !strings.Contains(data["Corefile"], "transfer cluster.local") || data[backupKey] != transferCorefile {
		t.Fatalf("configmap after the move: %v", data)
	}
	if b, err := r.Backup(ctx); err != nil || b.Key != "Corefile" || b.Corefile != transferCorefile {
		t.Fatalf("backup after a resumed move: %+v, %v", b, err)
	}
	// Undo, in the mirror order: the new version's pods onto the copy of
	// the old Corefile first (the old version's pods would read the
	// migrated one else), then the old Corefile back, then the old pods.
	*rolled = nil
	if undone, err := r.Undo(ctx); !undone || err != nil {
		t.Fatalf("undo = %v, %v", undone, err)
	}
	data = corefile(t, c)
	if _, extra := data[backupKey]; extra || data["Corefile"] != transferCorefile {
		t.Fatalf("configmap after undo: %v", data)
	}
	if got, want := strings.Join(*rolled, ", "), "reg/coredns:1.7.1 Corefile-backup (maxUnavailable 0, minReadySeconds 400), "+
		"kube-dns map[k8s-app:kube-dns pod-template-hash:h2], kube-dns map[k8s-app:kube-dns], "+
		"reg/coredns:1.7.1 Corefile (maxUnavailable 0, minReadySeconds 400), "+
		"kube-dns map[k8s-app:kube-dns pod-template-hash:h1], kube-dns map[k8s-app:kube-dns]"; got != want {
		t.Fatalf("undo rolled %s\nwant        %s", got, want)
	}
	knobsAsBefore(t, c)
}

// A run killed in a drain (the Service selecting the new pods only, the
// Deployment surging) is settled by the next one, whichever upgrade's:
// what it changed put back before anything else, and never kept as what
// ran before.
func TestADrainKilledHalfWayIsSettled(t *testing.T) {
	ctx := context.Background()
	for _, next := range []string{"resumed", "another upgrade", "rolled back"} {
		t.Run(next, func(t *testing.T) {
			c, _ := cluster(t, "reg/coredns:v1.11.1", kubeadmCorefile)
			kill := errors.New("killed")
			c.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
				s, _ := c.Tracker().Get(corev1.SchemeGroupVersion.WithResource("services"), Namespace, "kube-dns")
				if _, pinned := s.(*corev1.Service).Spec.Selector[appsv1.DefaultDeploymentUniqueLabelKey]; pinned && kill != nil {
					return true, nil, kill // the run dies once the Service is pinned: nothing more reaches the API
				}
				return false, nil, nil
			})
			r := roller(c)
			r.Upgrade = "v1.30.14 to v1.31.4"
			r.Timeout, r.Drain = 0, time.Millisecond // no wait for what the kill stopped
			f, m := planned(t, c, "priv/coredns:v1.11.3")
			if err := r.Apply(ctx, f, m); !errors.Is(err, kill) {
				t.Fatalf("apply: %v", err)
			}
			kill = nil
			r.Timeout, r.Drain = time.Minute, 0
			if b, _ := r.Backup(ctx); b == nil || !b.Draining {
				t.Fatalf("backup after a kill in the drain: %+v", b)
			}
			switch next {
			case "resumed":
				f, err := Find(ctx, c)
				if err != nil {
					t.Fatal(err)
				}
				if ok, err := r.Rolled(ctx, f); !ok || err != nil {
					t.Fatalf("rolled = %v, %v", ok, err)
				}
			case "another upgrade":
				r.Upgrade = "v1.30.14 to v1.32.13"
				if err := r.Move(ctx, "priv/coredns:v1.11.3", func(context.Context) error { return nil }); err != nil {
					t.Fatal(err)
				}
				b, err := r.Backup(ctx)
				if err != nil || b.Knobs.MinReadySeconds != 0 || b.Knobs.Strategy.RollingUpdate.MaxUnavailable.String() != "1" ||
					fmt.Sprint(b.Knobs.Services) != "map[kube-dns:map[k8s-app:kube-dns]]" {
					t.Fatalf("the other upgrade's backup keeps %+v (%v)", b.Knobs, err)
				}
			case "rolled back":
				if undone, err := r.Undo(ctx); !undone || err != nil {
					t.Fatalf("undo = %v, %v", undone, err)
				}
			}
			knobsAsBefore(t, c)
			if b, _ := r.Backup(ctx); b.Draining {
				t.Error("the backup still says a drain is under way")
			}
		})
	}
}

// A Corefile volume that gives every key of its ConfigMap (no items)
// gives them still when the Corefile file is pointed at its copy.
func TestMountKeyKeepsTheOtherKeys(t *testing.T) {
	s := deployment("reg/coredns:v1.11.1").Spec.Template.Spec
	s.Volumes[0].ConfigMap.Items = nil
	mountKey(&s, 0, "Corefile", backupKey, []string{"Corefile", "NodeHosts", backupKey})
	if got := fmt.Sprint(s.Volumes[0].ConfigMap.Items); got != "[{NodeHosts NodeHosts <nil> <nil>} {Corefile-backup Corefile <nil> <nil>}]" {
		t.Errorf("items %s", got)
	}
}

type errStop struct{ done bool }

func (errStop) Error() string { return "stopped" }

// A rollout that does not finish is an error naming the Deployment and
// how far it got.
func TestApplyWaitsForTheRollout(t *testing.T) {
	ctx := context.Background()
	c, _ := cluster(t, "reg/coredns:v1.11.1", kubeadmCorefile, "priv/coredns:v1.11.3")
	f, m := planned(t, c, "priv/coredns:v1.11.3")
	r := roller(c)
	r.Timeout = 0
	if err := r.Apply(ctx, f, m); err == nil || !strings.Contains(err.Error(), "deployment kube-system/coredns: new replicas: replicaset coredns-2: 1 of 2 new replicas ready") {
		t.Fatalf("err = %v", err)
	}
	knobsAsBefore(t, c)

	// Every replica new and available, but an old pod still stopping:
	// its containers run on until its kubelet has stopped them.
	c, _ = cluster(t, "reg/coredns:v1.11.1", kubeadmCorefile)
	now := metav1.Now()
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "coredns-old-x", Namespace: Namespace, Labels: map[string]string{"k8s-app": "kube-dns"}, DeletionTimestamp: &now, Finalizers: []string{"test"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	if _, err := c.CoreV1().Pods(Namespace).Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f, m = planned(t, c, "priv/coredns:v1.11.3")
	r = roller(c)
	r.Timeout, r.Drain = 0, time.Millisecond
	if err := r.Apply(ctx, f, m); err == nil || !strings.Contains(err.Error(), "pod coredns-old-x still terminating") {
		t.Fatalf("with an old pod terminating: %v", err)
	}
}

// The step: a dry run says what it would do and changes nothing; a
// rollout that fails is put back and named; a lost lock moves nothing.
func TestMove(t *testing.T) {
	ctx := context.Background()
	fence := func(context.Context) error { return nil }
	t.Run("dry run", func(t *testing.T) {
		c, rolled := cluster(t, "reg/coredns:v1.11.1", kubeadmCorefile)
		var said []string
		r := roller(c)
		r.Dry, r.Would = true, func(_, what, _ string) { said = append(said, what) }
		if err := r.Move(ctx, "priv/coredns:v1.11.3", fence); err != nil {
			t.Fatal(err)
		}
		if len(said) != 1 || !strings.Contains(said[0], "roll CoreDNS from 1.11.1 to 1.11.3") || len(*rolled) != 0 {
			t.Fatalf("said %q, rolled %q", said, *rolled)
		}
		if b, err := r.Backup(ctx); b != nil || err != nil {
			t.Fatalf("a dry run kept a backup: %+v, %v", b, err)
		}
	})
	t.Run("failed rollout put back", func(t *testing.T) {
		c, rolled := cluster(t, "reg/coredns:v1.11.1", kubeadmCorefile, "priv/coredns:v1.11.3")
		r := roller(c)
		r.Timeout, r.Upgrade = 0, "v1.30.14 to v1.31.4"
		err := r.Move(ctx, "priv/coredns:v1.11.3", fence)
		if err == nil || !strings.Contains(err.Error(), "CoreDNS put back at 1.11.1") {
			t.Fatalf("err = %v", err)
		}
		// The new pods never ready: the Service never left the old ones.
		if got, want := strings.Join(*rolled, ", "), "priv/coredns:v1.11.3 Corefile (maxUnavailable 0, minReadySeconds 400), "+
			"reg/coredns:v1.11.1 Corefile (maxUnavailable 0, minReadySeconds 400), "+
			"kube-dns map[k8s-app:kube-dns pod-template-hash:h1], kube-dns map[k8s-app:kube-dns]"; got != want {
			t.Fatalf("rolled %s\nwant   %s", got, want)
		}
		knobsAsBefore(t, c)
	})
	t.Run("lock lost", func(t *testing.T) {
		c, rolled := cluster(t, "reg/coredns:v1.11.1", kubeadmCorefile)
		err := roller(c).Move(ctx, "priv/coredns:v1.11.3", func(context.Context) error { return errors.New("lock lost") })
		if err == nil || !strings.Contains(err.Error(), "CoreDNS not moved: lock lost") || len(*rolled) != 0 {
			t.Fatalf("err = %v, rolled %q", err, *rolled)
		}
	})
	t.Run("another upgrade's backup is not put back", func(t *testing.T) {
		c, _ := cluster(t, "reg/coredns:v1.11.1", kubeadmCorefile)
		r := roller(c)
		r.Upgrade = "v1.29.15 to v1.30.14"
		if err := r.Move(ctx, "priv/coredns:v1.11.3", fence); err != nil {
			t.Fatal(err)
		}
		r.Upgrade = "v1.30.14 to v1.31.4"
		if undone, err := r.Undo(ctx); undone || err != nil {
			t.Fatalf("undo of an upgrade that moved no CoreDNS = %v, %v", undone, err)
		}
	})
}
