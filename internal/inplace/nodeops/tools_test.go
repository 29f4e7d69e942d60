package nodeops

import (
	"context"
	"strings"
	"testing"

	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
)

// SwapTools and RestoreTools run tools-swap and tools-restore with the
// backup apart from the kubelet's and the runtime's, tools-swap with the
// staged archives of the target and the node's paths (defaults where it
// said none; tools-restore reads them from the backup); a
// tool the bundle does not carry is "-"; what tools-swap says it did is
// read, and anything else refused, naming the node.
func TestToolsMoveArguments(t *testing.T) {
	for _, tc := range []struct {
		name    string
		m       release.ToolsMove
		p       release.ToolsPaths
		said    string
		moved   int
		swap    []string
		restore []string
	}{
		{"defaults, both", release.ToolsMove{CNISHA256: "ccc", CrictlSHA256: "ddd"}, release.ToolsPaths{}, "### moved 5\n", 5,
			[]string{"/b/v1.30.14/tools", "/s/v1.31.4/cni-plugins", "ccc", "/opt/cni/bin", "/s/v1.31.4/crictl", "ddd", "/usr/local/bin/crictl"},
			[]string{"/b/v1.30.14/tools"}},
		{"the node's paths, crictl only, the same", release.ToolsMove{CrictlSHA256: "ddd"}, release.ToolsPaths{CNIBinDir: "/usr/libexec/cni", Crictl: "/usr/bin/crictl"}, "### same\n", 0,
			[]string{"/b/v1.30.14/tools", "-", "-", "/usr/libexec/cni", "/s/v1.31.4/crictl", "ddd", "/usr/bin/crictl"},
			[]string{"/b/v1.30.14/tools"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
				nodescript.ToolsSwap.Name:    func([]string) (string, error) { return tc.said, nil },
				nodescript.ToolsRestore.Name: func([]string) (string, error) { return "", nil },
			}}
			o := &Ops{Node: node, Name: "worker-1", StageDir: "/s", BackupDir: "/b", From: "v1.30.14", To: "v1.31.4"}
			ctx := context.Background()
			moved, err := o.SwapTools(ctx, &tc.m, tc.p)
			if err != nil || moved != tc.moved {
				t.Fatalf("moved %d, %v; want %d", moved, err, tc.moved)
			}
			if err := o.RestoreTools(ctx); err != nil {
				t.Fatal(err)
			}
			calls := node.Calls()
			if len(calls) != 2 || calls[0].Script != nodescript.ToolsSwap.Name || calls[1].Script != nodescript.ToolsRestore.Name {
				t.Fatalf("ran %+v", calls)
			}
			if got := strings.Join(calls[0].Args, " "); got != strings.Join(tc.swap, " ") {
				t.Errorf("tools-swap %s\nwant       %s", got, strings.Join(tc.swap, " "))
			}
			if got := strings.Join(calls[1].Args, " "); got != strings.Join(tc.restore, " ") {
				t.Errorf("tools-restore %s\nwant          %s", got, strings.Join(tc.restore, " "))
			}
		})
	}
	for _, said := range []string{"", "### moved 0\n", "### moved x\n", "### moved 2; reboot\n"} {
		node := &fakenode.Node{Scripts: map[string]fakenode.Handler{nodescript.ToolsSwap.Name: func([]string) (string, error) { return said, nil }}}
		o := &Ops{Node: node, Name: "worker-1", StageDir: "/s", BackupDir: "/b", From: "v1.30.14", To: "v1.31.4"}
		if _, err := o.SwapTools(context.Background(), &release.ToolsMove{CNISHA256: "ccc"}, release.ToolsPaths{}); err == nil || !strings.Contains(err.Error(), "node worker-1") {
			t.Errorf("tools-swap said %q: %v", said, err)
		}
	}
}
