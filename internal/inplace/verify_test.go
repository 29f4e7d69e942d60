package inplace

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

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
	}{
		{name: "same processes", before: map[string]int{"api-app": 101, "web-app": 202}, after: map[string]int{"api-app": 101, "web-app": 202}},
		{name: "a process replaced", before: map[string]int{"api-app": 101, "web-app": 202}, after: map[string]int{"api-app": 101, "web-app": 303},
			want: "node worker-1: 1 containers restarted: shop/web/app (process 202, now 303)"},
		{name: "no tasks readable", before: nil, after: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := crictlPS(tc.before, "api-app", "web-app")
			node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
				nodescript.Containers.Name: func([]string) (string, error) { return out, nil },
			}}
			o := &nodeOps{n: node, name: "worker-1", facts: &nodefacts.Facts{}}
			r := &applyRun{res: &ApplyResult{}, client: fake.NewClientset()}
			before, err := o.containers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			out = crictlPS(tc.after, "api-app", "web-app")
			err = r.verify(ctx, o, before, nil)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("verify: %v", err)
				}
				return
			}
			var re *restartedError
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
	o := &nodeOps{n: node, name: "worker-1", facts: &nodefacts.Facts{}}
	_, err := o.containers(context.Background())
	if err == nil || !strings.Contains(err.Error(), "node worker-1") || !strings.Contains(err.Error(), `line 2: PID "$(reboot)"`) {
		t.Fatalf("containers: %v", err)
	}
}
