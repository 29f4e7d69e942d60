package inplace

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
	"github.com/kubelift/kubelift/internal/waiter"
)

// A mirror pod's image tag is the component's version; a tag that does not
// parse (a forged manifest) is refused, naming pod and image; pods that
// are not kubeadm's control plane are left out.
func TestStaticComponent(t *testing.T) {
	pod := func(comp, image string, mirror bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: comp + "-cp-1", Labels: map[string]string{"component": comp}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: comp, Image: image}}}}
		if mirror {
			p.Annotations = map[string]string{kubeletcompat.MirrorAnnotation: "abc"}
		}
		return p
	}
	for _, tc := range []struct {
		name            string
		pod             *corev1.Pod
		comp, ver, fail string
	}{
		{"kubeadm's", pod("kube-apiserver", "10.78.0.1:5000/library/kube-apiserver:v1.30.14", true), "kube-apiserver", "v1.30.14", ""},
		{"a registry with a port, no tag", pod("kube-scheduler", "10.78.0.1:5000/library/kube-scheduler", true), "", "", "no tag"},
		{"a forged tag", pod("kube-controller-manager", "r/kube-controller-manager:v1.31.4$(reboot)", true), "", "", `image "r/kube-controller-manager:v1.31.4$(reboot)"`},
		{"not a mirror pod", pod("kube-apiserver", "r/kube-apiserver:v1.30.14", false), "", "", ""},
		{"etcd", pod("etcd", "r/etcd:3.5.15-0", true), "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comp, v, err := staticComponent(tc.pod)
			if tc.fail != "" {
				if err == nil || !strings.Contains(err.Error(), tc.fail) || !strings.Contains(err.Error(), "kube-system/"+tc.pod.Name) {
					t.Fatalf("err = %v, want one naming the pod and %q", err, tc.fail)
				}
				return
			}
			if err != nil || comp != tc.comp || v != tc.ver {
				t.Fatalf("got %q %q %v, want %q %q", comp, v, err, tc.comp, tc.ver)
			}
		})
	}
}

// runKubeadm starts kubeadm detached and follows it: running, then its
// exit status; a failure is the node failed with kubeadm's reason; a run
// that vanished without a status is a failure too; a dry run only says
// the command.
func TestRunKubeadm(t *testing.T) {
	const log = "[upgrade/staticpods] Preparing for \"kube-scheduler\" upgrade\n[upgrade/staticpods] Moving new manifest\n" +
		"error execution phase control-plane: couldn't upgrade control plane. kubeadm has tried to recover everything into the earlier state. Errors faced: timed out waiting for the condition\n" +
		"To see the stack trace of this error execute with --v=5 or higher\n"
	for _, tc := range []struct {
		name     string
		statuses []string
		want     string // "" when it succeeds
	}{
		{"succeeds", []string{"running\n", "running\n", "exit 0\n"}, ""},
		{"fails", []string{"running\n", "exit 1\n" + log}, "kubeadm upgrade apply v1.31.4 --yes exited 1: while it moved kube-scheduler: error execution phase control-plane"},
		{"vanishes", []string{"lost\n"}, "stopped without an exit status"},
		{"garbage", []string{"exit x$(reboot)\n"}, `kubeadm status "exit x$(reboot)"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			clk := clocktesting.NewFakeClock(time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC))
			go func() {
				for ctx.Err() == nil {
					if clk.HasWaiters() {
						clk.Step(2 * time.Second)
					}
					time.Sleep(100 * time.Microsecond)
				}
			}()
			polls := 0
			var started []string
			node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
				nodescript.KubeadmStart.Name: func(args []string) (string, error) { started = args; return "started\n", nil },
				nodescript.KubeadmStatus.Name: func([]string) (string, error) {
					s := tc.statuses[min(polls, len(tc.statuses)-1)]
					polls++
					return s, nil
				},
			}}
			v, _ := catalog.ParseVersion("v1.31.4")
			r := &applyRun{opts: ApplyOptions{Plan: PlanOptions{StageDir: DefaultStageDir}}, target: &Target{Version: v}, res: &ApplyResult{},
				wait: waiter.Waiter{Clock: clk}, log: slog.New(slog.DiscardHandler)}
			o := &nodeOps{n: node, name: "cp-1", facts: &nodefacts.Facts{}}
			err := r.runKubeadm(ctx, o, "upgrade-apply-v1.31.4-1", []string{"upgrade", "apply", "v1.31.4", "--yes"})
			if want := []string{KubeadmRunDir, "upgrade-apply-v1.31.4-1", "/var/lib/kubelift/staged/v1.31.4/kubeadm", "upgrade", "apply", "v1.31.4", "--yes"}; strings.Join(started, " ") != strings.Join(want, " ") {
				t.Errorf("kubeadm-start %q, want %q", started, want)
			}
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "node cp-1") {
				t.Fatalf("err = %v, want one naming cp-1 and %q", err, tc.want)
			}
			// Only an exit status says kubeadm put back what it moved.
			if errors.Is(err, errKubeadmFailed) != (tc.name == "fails") || errors.Is(err, ErrNodeFailed) {
				t.Errorf("err = %v: kubeadm failed %v, node rolled back %v", err, errors.Is(err, errKubeadmFailed), errors.Is(err, ErrNodeFailed))
			}
		})
	}

	node := &fakenode.Node{Scripts: map[string]fakenode.Handler{}}
	v, _ := catalog.ParseVersion("v1.31.4")
	r := &applyRun{opts: ApplyOptions{Plan: PlanOptions{StageDir: DefaultStageDir}}, target: &Target{Version: v}, res: &ApplyResult{}, dry: true, log: slog.New(slog.DiscardHandler)}
	if err := r.runKubeadm(context.Background(), &nodeOps{n: node, name: "worker-1"}, "upgrade-node-v1.31.4-1", []string{"upgrade", "node"}); err != nil {
		t.Fatal(err)
	}
	if len(node.Calls()) != 0 || len(r.res.DryRun) != 1 || r.res.DryRun[0].What != "kubeadm upgrade node" ||
		!strings.HasPrefix(r.res.DryRun[0].Command, "kubelift-kubeadm-start /var/lib/kubelift/kubeadm upgrade-node-v1.31.4-1 /var/lib/kubelift/staged/v1.31.4/kubeadm upgrade node") {
		t.Errorf("dry run: calls %v, said %+v", node.Calls(), r.res.DryRun)
	}
}

// kubeadm's reason is its "error execution phase" line onwards, or its
// last lines.
func TestKubeadmReason(t *testing.T) {
	got := kubeadmReason("a\nb\n[upgrade/apply] FATAL: couldn't upgrade control plane\nc")
	if got != "[upgrade/apply] FATAL: couldn't upgrade control plane | c" {
		t.Errorf("reason %q", got)
	}
	lines := strings.Repeat("x\n", 20) + "last"
	if got := kubeadmReason(lines); !strings.HasSuffix(got, "x | last") || strings.Count(got, "|") != 7 {
		t.Errorf("reason of a long log: %q", got)
	}
}

// Rollback leaves a kubeadm control plane that never moved alone, and
// refuses, saying where kubeadm kept the old manifests, one that runs the
// target.
func TestKubeadmUndo(t *testing.T) {
	mirror := func(comp, version string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: comp + "-cp-1",
			Labels: map[string]string{"component": comp, "tier": "control-plane"}, Annotations: map[string]string{kubeletcompat.MirrorAnnotation: "h"}},
			Spec:   corev1.PodSpec{NodeName: "cp-1", Containers: []corev1.Container{{Name: comp, Image: "reg/library/" + comp + ":" + version}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	}
	v, _ := catalog.ParseVersion("v1.31.4")
	for _, tc := range []struct {
		name, scheduler string
		refused         bool
	}{{"never moved", "v1.30.14", false}, {"moved", "v1.31.4", true}} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(mirror("kube-apiserver", "v1.30.14"), mirror("kube-controller-manager", "v1.30.14"), mirror("kube-scheduler", tc.scheduler))
			r := &applyRun{client: client, target: &Target{Version: v}}
			err := kubeadmDriver{}.Undo(context.Background(), r, "cp-1")
			if !tc.refused {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "kube-scheduler runs v1.31.4") || !strings.Contains(err.Error(), "kubeadm-backup-manifests") {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

// A leader lease counts only when renewed after its holder's static pod
// started: right after a control plane was put back, the lease the
// replaced process renewed still looks live, but nobody leads.
func TestLeadsNow(t *testing.T) {
	started := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-scheduler-cp-1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}}}}}}
	lease := func(holder string, renewed time.Time) *coordinationv1.Lease {
		rt := metav1.NewMicroTime(renewed)
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-scheduler"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &rt}}
	}
	for _, tc := range []struct {
		name  string
		lease *coordinationv1.Lease
		want  string // "" when it leads
	}{
		{"renewed by the running process", lease("cp-1_abc", started.Add(3*time.Second)), ""},
		{"renewed by the replaced process", lease("cp-1_old", started.Add(-5*time.Second)), "before its process on cp-1 started"},
		{"a holder of another form", lease("scheduler-elsewhere", started.Add(-time.Hour)), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &applyRun{client: fake.NewClientset(pod, tc.lease)}
			got := r.leadsNow(context.Background(), "kube-scheduler")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("leadsNow = %q, want %q", got, tc.want)
			}
		})
	}
}
