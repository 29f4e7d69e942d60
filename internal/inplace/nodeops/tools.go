package nodeops

import (
	"context"
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// toolsBackupDir is BACKUP/FROM/tools: the tools' files apart from the
// kubelet's and the runtime's.
func (o *Ops) toolsBackupDir() string { return path.Join(o.BackupDirOf(), "tools") }

// SwapTools moves the node's CNI plugins and crictl to the archives
// staged with the target's files (each m carries; the other stays), at p:
// tools-swap checks their sums, compares each program with the one in
// place, and when any differs backs the old ones up once and renames the
// new ones into place (nothing restarts). It says how many programs it
// replaced or added: 0 when the node had the bundle's already. Run again,
// it ends the same, the first backup kept.
func (o *Ops) SwapTools(ctx context.Context, m *release.ToolsMove, p release.ToolsPaths) (int, error) {
	cniDir, crictlBin := p.Resolved()
	cni, crictl := release.StagePath(o.StageDir, o.To, release.FileCNIPlugins), release.StagePath(o.StageDir, o.To, release.FileCrictl)
	cniSum, crictlSum := m.CNISHA256, m.CrictlSHA256
	if cniSum == "" {
		cni, cniSum = "-", "-"
	}
	if crictlSum == "" {
		crictl, crictlSum = "-", "-"
	}
	out, err := o.Run(ctx, "move the CNI plugins and crictl", nodescript.ToolsSwap,
		o.toolsBackupDir(), cni, cniSum, cniDir, crictl, crictlSum, crictlBin)
	if err != nil || o.Dry != nil {
		return 0, err
	}
	return toolsMoved(o.Name, out)
}

// toolsMoved reads tools-swap's last line: "### same" (0) or
// "### moved N".
func toolsMoved(node, out string) (int, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	if last == "### same" {
		return 0, nil
	}
	if n, ok := strings.CutPrefix(last, "### moved "); ok {
		if moved, err := strconv.Atoi(n); err == nil && moved > 0 {
			return moved, nil
		}
	}
	return 0, fmt.Errorf("node %s: tools-swap said %q, want \"### same\" or \"### moved N\"", node, last)
}

// ToolsBackedUp says a tools move backed the node's CNI plugins or
// crictl up (from o.From), so RestoreTools has something to put back.
func (o *Ops) ToolsBackedUp(ctx context.Context) (bool, error) {
	return o.Exists(ctx, path.Join(o.toolsBackupDir(), "tools-files"))
}

// RestoreTools puts back the CNI plugins and crictl SwapTools backed up,
// where the backup says it found them, and removes the programs it added;
// where it backed up nothing, nothing changes.
func (o *Ops) RestoreTools(ctx context.Context) error {
	_, err := o.Run(ctx, "put the CNI plugins and crictl back", nodescript.ToolsRestore, o.toolsBackupDir())
	return err
}
