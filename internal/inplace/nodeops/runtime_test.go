package nodeops

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
)

// SwapRuntime and RestoreRuntime run runtime-swap and runtime-restore
// with the staged parts of the target, the backup apart from the
// kubelet's, and the node's paths (defaults where the move names none);
// runc is left alone when the bundle carries none; the config is
// migrated across a major version only; a dry run says the
// commands and runs nothing.
func TestRuntimeMoveArguments(t *testing.T) {
	v := func(major, minor, patch int) catalog.Version {
		return catalog.Version{Major: major, Minor: minor, Patch: patch}
	}
	for _, tc := range []struct {
		name string
		m    release.RuntimeMove
		p    RuntimePaths
		swap []string
	}{
		{"defaults, with runc, migrated",
			release.RuntimeMove{From: v(1, 7, 35), To: v(2, 3, 7), ArchiveSHA256: "aaa", RuncSHA256: "bbb", Major: true}, RuntimePaths{},
			[]string{"/b/v1.30.14/runtime", "/s/v1.31.4/containerd", "aaa", "/s/v1.31.4/runc", "bbb", "/usr/local/sbin/runc", "/usr/local/bin", "/etc/containerd/config.toml", "migrate", "containerd", "v1.7.35"}},
		{"the node's paths, no runc, same major",
			release.RuntimeMove{From: v(2, 1, 0), To: v(2, 3, 7), ArchiveSHA256: "aaa"},
			RuntimePaths{ContainerdDir: "/opt/bin", RuncBinary: "/usr/sbin/runc", Config: "/etc/ctd.toml"},
			[]string{"/b/v1.30.14/runtime", "/s/v1.31.4/containerd", "aaa", "-", "-", "/usr/sbin/runc", "/opt/bin", "/etc/ctd.toml", "keep", "containerd", "v2.1.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
				nodescript.RuntimeSwap.Name:    func([]string) (string, error) { return "### restart 10.0 10.5\n", nil },
				nodescript.RuntimeRestore.Name: func([]string) (string, error) { return "", nil },
			}}
			var restarts []string
			o := &Ops{Node: node, Name: "worker-1", StageDir: "/s", BackupDir: "/b", From: "v1.30.14", To: "v1.31.4",
				Restarted: func(unit string, d time.Duration) { restarts = append(restarts, fmt.Sprint(unit, " ", d)) }}
			ctx := context.Background()
			if err := o.SwapRuntime(ctx, &tc.m, tc.p); err != nil {
				t.Fatal(err)
			}
			if err := o.RestoreRuntime(ctx, tc.p); err != nil {
				t.Fatal(err)
			}
			if len(restarts) != 1 || !strings.HasPrefix(restarts[0], "containerd ") {
				t.Errorf("restart times %v, want the swap's only, containerd's", restarts)
			}
			calls := node.Calls()
			if len(calls) != 2 || calls[0].Script != nodescript.RuntimeSwap.Name || calls[1].Script != nodescript.RuntimeRestore.Name {
				t.Fatalf("ran %+v", calls)
			}
			if got := strings.Join(calls[0].Args, " "); got != strings.Join(tc.swap, " ") {
				t.Errorf("runtime-swap %s\nwant         %s", got, strings.Join(tc.swap, " "))
			}
			want := []string{tc.swap[0], tc.swap[6], tc.swap[5], tc.swap[7], "containerd"}
			if got := strings.Join(calls[1].Args, " "); got != strings.Join(want, " ") {
				t.Errorf("runtime-restore %s\nwant            %s", got, strings.Join(want, " "))
			}

			var said []string
			o.Dry = func(node, command string) { said = append(said, node+": "+command) }
			if err := o.SwapRuntime(ctx, &tc.m, tc.p); err != nil {
				t.Fatal(err)
			}
			if n := len(node.Calls()); n != 2 || len(said) != 1 || !strings.HasPrefix(said[0], "worker-1: kubelift-runtime-swap ") {
				t.Errorf("a dry run ran %d scripts (want none more) and said %q", n-2, said)
			}
		})
	}
}
