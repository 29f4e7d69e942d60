package runbook

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/driver/drivertest"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/verify"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
	"github.com/kubelift/kubelift/internal/waiter"
)

// The runtime step moves a node's older containerd to the bundle's, where
// the node keeps it (its facts), and goes on when the same containers run with the same processes after it;
// it puts the old containerd back and stops the node when a process
// changed or the swap failed; it does nothing where the node runs the
// bundle's containerd already, and a dry run says what it would do.
func TestRuntimeStep(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		runtime  string         // the Node's containerRuntimeVersion
		after    map[string]int // the tasks' PIDs after the swap
		swapFail bool
		tools    bool   // the tools step backed the node's tools up
		refused  int    // the reads after the swap that find no socket
		ran      string // the scripts run after the first containers read
		want     string // "" when the step passes
	}{
		{name: "moved, same processes", runtime: "containerd://1.7.35", after: map[string]int{"api-app": 101, "web-app": 202},
			ran: "runtime-swap containers"},
		{name: "the socket answers a moment after the restart", runtime: "containerd://1.7.35", after: map[string]int{"api-app": 101, "web-app": 202},
			refused: 2, ran: "runtime-swap containers containers containers"},
		{name: "a process replaced", runtime: "containerd://1.7.35", after: map[string]int{"api-app": 101, "web-app": 303},
			ran: "runtime-swap containers runtime-restore exists", want: "shop/web/app (process 202, now 303); the old containerd is back"},
		{name: "the socket never answers", runtime: "containerd://1.7.35", after: map[string]int{"api-app": 101, "web-app": 202}, refused: 99,
			ran:  "runtime-swap containers containers containers containers containers containers runtime-restore exists",
			want: `connect: no such file or directory" (still, 5s after the restart); the old containerd is back`},
		{name: "the swap failed", runtime: "containerd://1.7.35", swapFail: true,
			ran: "runtime-swap runtime-restore exists", want: "exit status 66"},
		// The tools step before it moved the CNI plugins: back too, so
		// the node is as it was.
		{name: "the swap failed after the tools moved", runtime: "containerd://1.7.35", swapFail: true, tools: true,
			ran: "runtime-swap runtime-restore exists tools-restore", want: "exit status 66; the old containerd is back; the old CNI plugins and crictl are back"},
		{name: "the bundle's already", runtime: "containerd://2.3.7", ran: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := crictlPS(map[string]int{"api-app": 101, "web-app": 202}, "api-app", "web-app")
			var swapArgs []string
			swapped := false
			refused := tc.refused
			node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
				nodescript.Containers.Name: func([]string) (string, error) {
					if swapped && refused > 0 {
						refused--
						return "", errors.New(`exit status 1: level=fatal msg="validate service connection: dial unix /run/containerd/containerd.sock: connect: no such file or directory"`)
					}
					return out, nil
				},
				nodescript.RuntimeSwap.Name: func(args []string) (string, error) {
					swapArgs, swapped = args, true
					if tc.swapFail {
						return "", errors.New("exit status 66")
					}
					return "### restart 1.0 1.5\n", nil
				},
				nodescript.RuntimeRestore.Name: func([]string) (string, error) { return "", nil },
				nodescript.Exists.Name:         backups(t, false, tc.tools),
				nodescript.ToolsRestore.Name:   func([]string) (string, error) { return "", nil },
			}}
			o := &nodeops.Ops{Node: node, Name: "worker-1", From: "v1.30.14", To: "v1.31.4", StageDir: "/s", BackupDir: "/b", Facts: &nodefacts.Facts{}}
			n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}}
			n.Status.NodeInfo.ContainerRuntimeVersion = tc.runtime
			target := &release.Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 4}, Manifest: &bundle.Manifest{Files: []bundle.File{
				{Name: release.FileContainerd, Version: "v2.3.7", Arch: "amd64", Path: "stack/linux/amd64/containerd", SHA256: "aaa"},
			}}}
			r := &upgradeRun{res: &ApplyResult{}, client: fake.NewClientset(), target: target, log: slog.New(slog.DiscardHandler),
				view: &preflight.View{Nodes: []corev1.Node{n}, Facts: map[string]*nodefacts.Facts{"worker-1": {
					Containerd: nodefacts.ContainerdPaths{Binary: "/opt/bin/containerd", Config: "/etc/ctd.toml", Runc: "/usr/sbin/runc"}}}},
				wait: waiter.Waiter{Clock: drivertest.SteppingClock(t, time.Second)},
				opts: ApplyOptions{ReadyTimeout: 5 * time.Second, Plan: preflight.PlanOptions{Now: time.Now}}}
			before, err := o.Containers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			first := len(node.Calls())
			k := &kubeletRun{o: o, name: "worker-1", to: "v1.31.4", before: before}
			out = crictlPS(tc.after, "api-app", "web-app")
			err = r.moveRuntime(ctx, k)
			if got := scriptsRun(node, first); got != tc.ran {
				t.Errorf("ran %q, want %q", got, tc.ran)
			}
			if tc.want == "" {
				if err != nil {
					t.Fatalf("runtime step: %v", err)
				}
			} else if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("runtime step: %v, want %q", err, tc.want)
			}
			if tc.name == "a process replaced" {
				var re *verify.RestartedError
				if !errors.As(err, &re) {
					t.Errorf("%v is not a RestartedError", err)
				}
			}
			if swapArgs != nil && (swapArgs[2] != "aaa" || swapArgs[8] != "migrate" || swapArgs[10] != "v1.7.35" ||
				swapArgs[5] != "/usr/sbin/runc" || swapArgs[6] != "/opt/bin" || swapArgs[7] != "/etc/ctd.toml") {
				t.Errorf("runtime-swap %v: want the manifest's sum, the node's paths as read, the config migrated, from v1.7.35", swapArgs)
			}

			r.dry = true
			said := r.stack().Would(k.name, k.arch)
			if (tc.ran != "") != strings.HasPrefix(said, "move containerd v1.7.35 to v2.3.7, its config migrated") {
				t.Errorf("dry run says %q", said)
			}
		})
	}
}

// A node rolled back after its runtime moved gets its old kubelet back
// first (it runs on either containerd), then its old containerd: moved
// by this run, or by a run this one resumes (killed after the node's
// runtime step: its backup is on the node). A node whose runtime no run
// of this upgrade moved keeps it. Then its old CNI plugins and crictl,
// where a tools move backed them up.
func TestRollbackNodePutsTheRuntimeBack(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name                 string
		moved, backed, tools bool
		ran                  string
	}{
		{"moved by this run", true, true, false, "restore running runtime-restore exists"},
		{"moved by the run this one resumes", false, true, false, "restore running exists runtime-restore exists"},
		{"never moved", false, false, false, "restore running exists exists"},
		{"tools moved too", true, true, true, "restore running runtime-restore exists tools-restore"},
		{"only the tools moved", false, false, true, "restore running exists exists tools-restore"},
	} {
		node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
			nodescript.Restore.Name:        func([]string) (string, error) { return "", nil },
			nodescript.Running.Name:        func([]string) (string, error) { return "Kubernetes v1.30.14\npid 4242\n", nil },
			nodescript.RuntimeRestore.Name: func([]string) (string, error) { return "", nil },
			nodescript.ToolsRestore.Name:   func([]string) (string, error) { return "", nil },
			nodescript.Exists.Name:         backups(t, tc.backed, tc.tools),
		}}
		o := &nodeops.Ops{Node: node, Name: "worker-1", From: "v1.30.14", To: "v1.31.4", StageDir: "/s", BackupDir: "/b", Facts: &nodefacts.Facts{}}
		r := &upgradeRun{res: &ApplyResult{}, client: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}}), log: slog.New(slog.DiscardHandler),
			target: &release.Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 4}},
			wait:   waiter.Waiter{Clock: drivertest.SteppingClock(t, time.Second)},
			opts:   ApplyOptions{ReadyTimeout: 10 * time.Second, Plan: preflight.PlanOptions{Now: time.Now}}}
		k := &kubeletRun{o: o, name: "worker-1", to: "v1.31.4", runtimeMoved: tc.moved}
		err := r.rollbackNode(ctx, k, errors.New("not Ready"))
		if got := scriptsRun(node, 0); got != tc.ran {
			t.Errorf("%s: ran %q, want %q", tc.name, got, tc.ran)
		}
		if err == nil || !strings.Contains(err.Error(), "rolled back to v1.30.14") || strings.Contains(err.Error(), "the old containerd is back") != tc.backed {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// backups answers the exists checks for worker-1's runtime backup and
// tools backup (From v1.30.14, BackupDir /b): each there when asked.
func backups(t *testing.T, runtime, tools bool) fakenode.Handler {
	return func(args []string) (string, error) {
		there := false
		switch args[0] {
		case "/b/v1.30.14/runtime/runtime-files":
			there = runtime
		case "/b/v1.30.14/tools/tools-files":
			there = tools
		default:
			t.Errorf("looked for %s", args[0])
		}
		if there {
			return "yes\n", nil
		}
		return "no\n", nil
	}
}

// The tools step, where the bundle carries the node stack, moves the
// node's CNI plugins and crictl where the node keeps them (its facts),
// and goes on whether they moved or were the bundle's already; a failed
// swap puts the old ones back and stops the node; a node whose runtime
// did not say where it takes the plugins from is refused before anything
// runs; without the node stack nothing runs; a dry run says what it would
// do.
func TestToolsStep(t *testing.T) {
	ctx := context.Background()
	stack := []bundle.File{
		{Name: release.FileContainerd, Version: "v2.3.7", Arch: "amd64", Path: "stack/linux/amd64/containerd", SHA256: "aaa"},
		{Name: release.FileCNIPlugins, Arch: "amd64", Path: "bin/linux/amd64/cni-plugins", SHA256: "ccc"},
		{Name: release.FileCrictl, Arch: "amd64", Path: "bin/linux/amd64/crictl", SHA256: "ddd"},
	}
	read := nodefacts.ContainerdPaths{Crictl: "/usr/bin/crictl", CNIBinDir: "/usr/libexec/cni"}
	for _, tc := range []struct {
		name  string
		files []bundle.File
		paths nodefacts.ContainerdPaths
		said  string // tools-swap's output; "fail": it fails
		ran   string
		would string
		want  string // "" when the step passes
	}{
		{"moved", stack, read, "### moved 3\n", "tools-swap", "move the CNI plugins in /usr/libexec/cni and crictl at /usr/bin/crictl", ""},
		{"the bundle's already", stack, read, "### same\n", "tools-swap", "move the CNI plugins", ""},
		{"the swap failed", stack, read, "fail", "tools-swap tools-restore", "move the CNI plugins", "exit status 65; the old CNI plugins and crictl are back"},
		{"where the plugins are not read", stack, nodefacts.ContainerdPaths{CNIErr: "crictl info failed"}, "", "", "refuse the node: node worker-1: where its runtime takes the CNI plugins from was not read (crictl info failed)", "crictl info failed"},
		{"no node stack", stack[1:], read, "", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var swapArgs []string
			node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
				nodescript.ToolsSwap.Name: func(args []string) (string, error) {
					swapArgs = args
					if tc.said == "fail" {
						return "", errors.New("exit status 65")
					}
					return tc.said, nil
				},
				nodescript.ToolsRestore.Name: func([]string) (string, error) { return "", nil },
			}}
			o := &nodeops.Ops{Node: node, Name: "worker-1", From: "v1.30.14", To: "v1.31.4", StageDir: "/s", BackupDir: "/b", Facts: &nodefacts.Facts{}}
			target := &release.Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 4}, Manifest: &bundle.Manifest{Files: tc.files}}
			r := &upgradeRun{res: &ApplyResult{}, client: fake.NewClientset(), target: target, log: slog.New(slog.DiscardHandler),
				view: &preflight.View{Facts: map[string]*nodefacts.Facts{"worker-1": {Containerd: tc.paths}}},
				opts: ApplyOptions{Plan: preflight.PlanOptions{Now: time.Now}}}
			k := &kubeletRun{o: o, name: "worker-1", to: "v1.31.4"}
			err := r.moveTools(ctx, k)
			if got := scriptsRun(node, 0); got != tc.ran {
				t.Errorf("ran %q, want %q", got, tc.ran)
			}
			if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Errorf("tools step: %v, want %q", err, tc.want)
			}
			if swapArgs != nil && strings.Join(swapArgs, " ") != "/b/v1.30.14/tools /s/v1.31.4/cni-plugins ccc /usr/libexec/cni /s/v1.31.4/crictl ddd /usr/bin/crictl" {
				t.Errorf("tools-swap %q: want the staged archives with the manifest's sums and the node's paths as read", swapArgs)
			}
			if said := r.stack().WouldTools(k.name, k.arch); !strings.HasPrefix(said, tc.would) || (tc.would == "") != (said == "") {
				t.Errorf("dry run says %q, want %q", said, tc.would)
			}
		})
	}
}

// The cluster's rollback puts a node's containerd back only where a
// runtime move backed it up, and holds it to the same containers with
// the same processes; then its CNI plugins and crictl, where a tools move
// backed them up, even when containerd's put-back failed.
func TestRollbackPutsTheRuntimeBack(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		backed bool
		after  map[string]int
		ran    string
		want   string
	}{
		{"moved, kept", true, map[string]int{"api-app": 101}, "exists containers runtime-restore containers exists", ""},
		{"moved, a process replaced", true, map[string]int{"api-app": 102}, "exists containers runtime-restore containers exists", "shop/api/app (process 101, now 102)"},
		{"never moved", false, nil, "exists exists", ""},
		{"only the tools moved", false, nil, "exists exists tools-restore", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := crictlPS(map[string]int{"api-app": 101}, "api-app")
			node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
				nodescript.Exists.Name:       backups(t, tc.backed, tc.name == "only the tools moved"),
				nodescript.ToolsRestore.Name: func([]string) (string, error) { return "", nil },
				nodescript.Containers.Name:   func([]string) (string, error) { return out, nil },
				nodescript.RuntimeRestore.Name: func([]string) (string, error) {
					out = crictlPS(tc.after, "api-app")
					return "", nil
				},
			}}
			o := &nodeops.Ops{Node: node, Name: "worker-1", From: "v1.30.14", To: "v1.31.4", StageDir: "/s", BackupDir: "/b", Facts: &nodefacts.Facts{}}
			r := &upgradeRun{res: &ApplyResult{}, client: fake.NewClientset(), log: slog.New(slog.DiscardHandler),
				target: &release.Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 4}}, view: &preflight.View{},
				opts: ApplyOptions{Plan: preflight.PlanOptions{Now: time.Now}}}
			err := r.putBack(ctx, o)
			if got := scriptsRun(node, 0); got != tc.ran {
				t.Errorf("ran %q, want %q", got, tc.ran)
			}
			if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Errorf("rollback: %v, want %q", err, tc.want)
			}
		})
	}
}

// scriptsRun names the node scripts node ran from its call from on, in
// order, space-separated.
func scriptsRun(node *fakenode.Node, from int) string {
	var ran []string
	for _, c := range node.Calls()[from:] {
		ran = append(ran, c.Script)
	}
	return strings.Join(ran, " ")
}
