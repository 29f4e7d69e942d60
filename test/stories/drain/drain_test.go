// Package drain tests upgrade apply --drain on a sandbox of its own (1
// control plane, 2 workers): pods nobody would recreate refuse the drain
// before it starts, a PodDisruptionBudget that keeps refusing stops the
// run with the node uncordoned, a node cordoned by hand stays cordoned,
// and a run killed in the last node's settle is finished by the next.
package drain

import (
	"context"
	"strings"
	"syscall"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/drain"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/test/env/harness"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

var h *harness.Harness

func TestMain(m *testing.M) {
	harness.Main(m, "kld", "10.86.0", 1, 2, func(x *harness.Harness) {
		h = x
	})
}

func apply(t *testing.T, extra ...string) harness.Result {
	t.Helper()
	reg, pw := h.RegistryFlags()
	args := append(append([]string{"apply", "--to", h.SB.NewVersion, "--key", h.Key(), "--settle", "5s", "--drain", "--restore-labels"}, reg...), h.SSHFlags()...)
	return h.Upgrade(t, pw, append(args, extra...)...)
}

func TestDrain(t *testing.T) {
	ctx := context.Background()
	h.Import(t, h.HashSkipBundle)
	ns := sandbox.WorkloadNamespace

	// Bare pods would be lost: the drain is refused before it cordons.
	r := apply(t)
	if r.Code != 1 || !strings.Contains(r.Stderr, "no controller would recreate") {
		t.Fatalf("drain with bare pods: exit %d\n%s", r.Code, r.Stderr)
	}
	// The node refused (the first worker holding bare pods) is untouched;
	// no node is left cordoned.
	refused := ""
	for _, w := range []string{"worker-1", "worker-2"} {
		n := h.Node(t, w)
		if n.Spec.Unschedulable {
			t.Errorf("%s left cordoned", w)
		}
		if refused == "" && strings.Contains(r.Stderr, "node "+w+": drain blocked") {
			refused = w
			if n.Status.NodeInfo.KubeletVersion != h.SB.OldVersion {
				t.Errorf("%s, whose drain was refused, runs %s", w, n.Status.NodeInfo.KubeletVersion)
			}
		}
	}
	if refused == "" {
		t.Fatalf("the refusal names no worker:\n%s", r.Stderr)
	}
	for _, p := range []string{"batch-legacy", "batch-tolerant", "pinned-ssd"} {
		if err := h.Client.CoreV1().Pods(ns).Delete(ctx, p, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// One replica pinned to that worker with a budget of one: every
	// eviction is refused, the run stops, and the node is uncordoned again.
	one := int32(1)
	spec := h.SB.PodSpec(nil)
	spec.NodeSelector = map[string]string{"kubernetes.io/hostname": refused}
	labels := map[string]string{"app": "blocker"}
	if _, err := h.Client.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "blocker"},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1PodTemplate(labels, spec)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	minAvailable := intstr.FromInt32(1)
	if _, err := h.Client.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "blocker"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &minAvailable, Selector: &metav1.LabelSelector{MatchLabels: labels}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, "the blocker running and its budget computed", func() bool {
		pdb, err := h.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "blocker", metav1.GetOptions{})
		return err == nil && pdb.Status.CurrentHealthy == 1 && pdb.Status.ObservedGeneration == pdb.Generation
	})
	r = apply(t, "--drain-timeout", "10s")
	if r.Code != 1 || !strings.Contains(r.Stderr, "PodDisruptionBudget") || !strings.Contains(r.Stderr, refused) {
		t.Fatalf("drain blocked by a budget: exit %d\n%s", r.Code, r.Stderr)
	}
	if n := h.Node(t, refused); n.Spec.Unschedulable || n.Annotations[drain.AnnotationCordoned] != "" || n.Status.NodeInfo.KubeletVersion != h.SB.OldVersion {
		t.Errorf("%s after a blocked drain: unschedulable %v, annotations %v, kubelet %s", refused, n.Spec.Unschedulable, n.Annotations, n.Status.NodeInfo.KubeletVersion)
	}

	// The budget gone and the other worker cordoned by hand: apply
	// completes, uncordons the node it cordoned and leaves the other one
	// cordoned.
	if err := h.Client.PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, "blocker", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	other := map[string]string{"worker-1": "worker-2", "worker-2": "worker-1"}[refused]
	if _, err := h.Client.CoreV1().Nodes().Patch(ctx, other, types.StrategicMergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// That apply is killed (SIGKILL: the admin machine lost) in the last
	// worker's settle, after its kubelet was swapped; the next apply
	// finishes it (verified against what ran before the swap, the cordon
	// of kubelift's undone) and completes.
	reg, pw := h.RegistryFlags()
	args := append(append([]string{"apply", "--to", h.SB.NewVersion, "--key", h.Key(), "--settle", "2m", "--drain", "--restore-labels", "--lock-duration", "10s", "-q"}, reg...), h.SSHFlags()...)
	cmd, stderr, err := h.Start(pw, args...)
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	harness.WaitFor(t, "worker-2's kubelet swapped, its settle begun", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("apply ended (%v) before worker-2's settle:\n%s", err, stderr.String())
		default:
		}
		n := h.Node(t, "worker-2")
		_, inFlight := n.Annotations[record.AnnotationInFlight]
		return inFlight && n.Status.NodeInfo.KubeletVersion == h.SB.NewVersion && sandbox.NodeReady(n)
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	if st := h.Status(t); st.State == record.StateComplete {
		t.Fatalf("state %s after a kill in the last node's settle", st.State)
	}
	r = apply(t)
	if r.Code != 0 || !strings.Contains(r.Stderr, "finishing a node a run left") {
		t.Fatalf("apply after the kill: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if st := h.Status(t); st.State != record.StateComplete {
		t.Errorf("state %s after the resume", st.State)
	}
	for name, cordoned := range map[string]bool{refused: false, other: true} {
		n := h.Node(t, name)
		_, inFlight := n.Annotations[record.AnnotationInFlight]
		if n.Spec.Unschedulable != cordoned || n.Status.NodeInfo.KubeletVersion != h.SB.NewVersion || n.Annotations[drain.AnnotationCordoned] != "" || inFlight ||
			n.Annotations[inplace.AnnotationUpgradedTo] != h.SB.NewVersion {
			t.Errorf("%s: unschedulable %v (want %v), kubelet %s, annotations %v", name, n.Spec.Unschedulable, cordoned, n.Status.NodeInfo.KubeletVersion, n.Annotations)
		}
	}
}

func corev1PodTemplate(labels map[string]string, spec corev1.PodSpec) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}
}
