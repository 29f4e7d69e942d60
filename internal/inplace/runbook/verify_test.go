package runbook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/verify"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
)

// crictlPS is `crictl ps -o json` of running containers (ID -> pod/name
// in namespace shop), then containerd's tasks with their PIDs.
func crictlPS(pids map[string]int, ids ...string) string {
	var cs []string
	for _, id := range ids {
		pod, name, _ := strings.Cut(id, "-")
		cs = append(cs, fmt.Sprintf(`{"id":%q,"metadata":{"name":%q},"state":"CONTAINER_RUNNING","createdAt":"1764028800000000000",`+
			`"labels":{"io.kubernetes.pod.namespace":"shop","io.kubernetes.pod.name":%q,"io.kubernetes.pod.uid":"uid-%s","io.kubernetes.container.name":%q}}`, id, name, pod, pod, name))
	}
	out := `{"containers":[` + strings.Join(cs, ",") + "]}\n"
	if pids != nil {
		out += "### tasks\nTASK    PID    STATUS\n"
		for _, id := range ids {
			out += fmt.Sprintf("%s    %d    RUNNING\n", id, pids[id])
		}
	}
	return out
}

// A container that keeps its ID but not its process (restarted in place
// by the runtime) counts as restarted: verify compares containerd's task
// PIDs, not only container IDs. Where no tasks could be read, IDs alone
// decide.
func TestVerifyComparesProcesses(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		before, after map[string]int
		want          string // "" when verify passes
		counted       record.Containers
	}{
		{name: "same processes", before: map[string]int{"api-app": 101, "web-app": 202}, after: map[string]int{"api-app": 101, "web-app": 202},
			counted: record.Containers{Before: 2, Kept: 2}},
		{name: "a process replaced", before: map[string]int{"api-app": 101, "web-app": 202}, after: map[string]int{"api-app": 101, "web-app": 303},
			want: "node worker-1: 1 containers restarted: shop/web/app (process 202, now 303)", counted: record.Containers{Before: 2, Kept: 1, Restarted: 1}},
		{name: "no tasks readable", before: nil, after: nil, counted: record.Containers{Before: 2, Kept: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := crictlPS(tc.before, "api-app", "web-app")
			node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
				nodescript.Containers.Name: func([]string) (string, error) { return out, nil },
			}}
			o := &nodeops.Ops{Node: node, Name: "worker-1", Facts: &nodefacts.Facts{}}
			r := &upgradeRun{res: &ApplyResult{}, client: fake.NewClientset(), target: &release.Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 4}},
				state: &record.Upgrade{}}
			before, err := o.Containers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			out = crictlPS(tc.after, "api-app", "web-app")
			err = r.verify(ctx, o, before, nil)
			// The record counts them, for the report.
			if got := r.state.Node("worker-1", "").Containers; got == nil || *got != tc.counted {
				t.Errorf("counted %+v, want %+v", got, tc.counted)
			}
			if tc.want == "" {
				if err != nil {
					t.Fatalf("verify: %v", err)
				}
				return
			}
			var re *verify.RestartedError
			if !errors.As(err, &re) || err.Error() != tc.want {
				t.Fatalf("verify: %v, want %q", err, tc.want)
			}
		})
	}
}

// A task line that does not parse is refused, naming the node and line.
func TestContainersRefusesBadTasks(t *testing.T) {
	out := crictlPS(nil, "api-app") + "### tasks\nTASK PID STATUS\napi-app $(reboot) RUNNING\n"
	node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
		nodescript.Containers.Name: func([]string) (string, error) { return out, nil },
	}}
	o := &nodeops.Ops{Node: node, Name: "worker-1", Facts: &nodefacts.Facts{}}
	_, err := o.Containers(context.Background())
	if err == nil || !strings.Contains(err.Error(), "node worker-1") || !strings.Contains(err.Error(), `line 2: PID "$(reboot)"`) {
		t.Fatalf("containers: %v", err)
	}
}

// A static pod's containers are started anew by a kubelet of another
// minor (new pod UID, new mirror pod): verify expects it, and waits until
// the static pod runs again; within a minor, a static pod's new
// containers are restarts like any other.
func TestVerifyStaticPods(t *testing.T) {
	ctx := context.Background()
	mirror := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: "shop", UID: "api-edge",
		Annotations: map[string]string{kubeletcompat.MirrorAnnotation: "uid-edge"}},
		Spec: corev1.PodSpec{NodeName: "worker-1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	api := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "shop", UID: "api-api"},
		Spec: corev1.PodSpec{NodeName: "worker-1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, tc := range []struct {
		name, from string
		after      []string // containers after the swap
		mirrorUID  string   // the mirror pod's API UID after the swap
		pending    bool     // the static pod was Pending before the swap
		want       string   // "" when verify passes
	}{
		{name: "new minor, recreated", from: "v1.30.14", after: []string{"api-app", "edge2-app"}, mirrorUID: "api-edge2"}, // counted: 1 kept, 1 recreated
		{name: "new minor, not back", from: "v1.30.14", after: []string{"api-app"}, mirrorUID: "api-edge2",
			want: "node worker-1: static pods not recreated within 10ms: shop/edge (0 of 1 new containers running)"},
		{name: "new minor, not yet recreated", from: "v1.30.14", after: []string{"api-app", "edge-app"}, mirrorUID: "api-edge",
			want: "shop/edge (no mirror pod of a new UID yet)"},
		{name: "new minor, was Pending, not back", from: "v1.30.14", after: []string{"api-app"}, mirrorUID: "api-edge2", pending: true},
		{name: "same minor, restarted", from: "v1.31.1", after: []string{"api-app", "edge2-app"}, mirrorUID: "api-edge",
			want: "node worker-1: 1 containers restarted: shop/edge/app"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := crictlPS(nil, "api-app", "edge-app")
			node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
				nodescript.Containers.Name: func([]string) (string, error) { return out, nil },
			}}
			m := mirror.DeepCopy()
			if tc.pending {
				m.Status.Phase = corev1.PodPending
			}
			client := fake.NewClientset(m, api.DeepCopy())
			to, _ := catalog.ParseVersion("v1.31.4")
			o := &nodeops.Ops{Node: node, Name: "worker-1", From: tc.from, Facts: &nodefacts.Facts{}}
			r := &upgradeRun{res: &ApplyResult{}, client: client, target: &release.Release{Version: to}, log: slog.New(slog.DiscardHandler),
				opts: ApplyOptions{ReadyTimeout: 10 * time.Millisecond, Plan: preflight.PlanOptions{Now: time.Now}}, state: &record.Upgrade{}}
			before, err := o.Containers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			podsBefore, err := r.checker().PodsOn(ctx, "worker-1")
			if err != nil {
				t.Fatal(err)
			}
			// the kubelet's work: new containers; the mirror pod made again
			out = crictlPS(nil, tc.after...)
			out = strings.ReplaceAll(out, `"io.kubernetes.pod.name":"edge2"`, `"io.kubernetes.pod.name":"edge"`)
			if tc.mirrorUID != string(mirror.UID) {
				if err := client.CoreV1().Pods("shop").Delete(ctx, "edge", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				m := mirror.DeepCopy()
				m.UID = "api-edge2"
				m.Annotations[kubeletcompat.MirrorAnnotation] = "uid-edge2"
				if _, err := client.CoreV1().Pods("shop").Create(ctx, m, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			err = r.verify(ctx, o, before, podsBefore)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("verify: %v", err)
				}
				if c := r.state.Node("worker-1", "").Containers; tc.name == "new minor, recreated" && (c == nil || *c != record.Containers{Before: 2, Kept: 1, Recreated: 1}) {
					t.Errorf("counted %+v, want 1 kept and 1 recreated of 2", c)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("verify: %v, want %q", err, tc.want)
			}
		})
	}
}
