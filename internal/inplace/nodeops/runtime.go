package nodeops

import (
	"context"
	"fmt"
	"path"
	"time"

	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// Where a node keeps its container runtime when the move names no other
// place: containerd's release archive unpacks into /usr/local/bin,
// runc's release goes to /usr/local/sbin (containerd's getting-started
// guide), and containerd reads /etc/containerd/config.toml.
const (
	DefaultContainerdDir    = "/usr/local/bin"
	DefaultRuncBinary       = "/usr/local/sbin/runc"
	DefaultContainerdConfig = "/etc/containerd/config.toml"
	// ContainerdUnit is containerd's systemd unit.
	ContainerdUnit = "containerd"
)

// RuntimePaths are where a node keeps containerd's programs, runc and
// containerd's config; an empty field takes its default above.
type RuntimePaths struct {
	ContainerdDir, RuncBinary, Config string
}

// resolved are p with the defaults filled in.
func (p RuntimePaths) resolved() (dir, runc, config string) {
	dir, runc, config = p.ContainerdDir, p.RuncBinary, p.Config
	if dir == "" {
		dir = DefaultContainerdDir
	}
	if runc == "" {
		runc = DefaultRuncBinary
	}
	if config == "" {
		config = DefaultContainerdConfig
	}
	return dir, runc, config
}

// runtimeBackupDir is BACKUP/FROM/runtime: the runtime's files apart
// from the kubelet's.
func (o *Ops) runtimeBackupDir() string { return path.Join(o.BackupDirOf(), "runtime") }

// SwapRuntime moves the node's containerd (and runc, where m carries
// it) to the parts staged with the target's files: backs up the old
// programs and config once (only while the node's containerd runs
// m.From, as the plan read it), migrates the config across a major
// version, renames each program into place at p and restarts
// containerd. The containers stay with their shims; the caller checks
// every task's PID. Run again, it ends the same, the first backup kept.
func (o *Ops) SwapRuntime(ctx context.Context, m *release.RuntimeMove, p RuntimePaths) error {
	dir, runcBin, config := p.resolved()
	runc, runcSum := release.StagePath(o.StageDir, o.To, release.FileRunc), m.RuncSHA256
	if runcSum == "" {
		runc, runcSum = "-", "-"
	}
	migrate := "keep"
	if m.Major {
		migrate = "migrate"
	}
	from := m.From.String()
	began := time.Now()
	out, err := o.Run(ctx, fmt.Sprintf("move containerd %s to %s", from, m.To), nodescript.RuntimeSwap,
		o.runtimeBackupDir(), release.StagePath(o.StageDir, o.To, release.FileContainerd), m.ArchiveSHA256, runc, runcSum, runcBin,
		dir, config, migrate, ContainerdUnit, from)
	if err == nil && o.Restarted != nil {
		o.Restarted(ContainerdUnit, restartTime(out, time.Since(began)))
	}
	return err
}

// RuntimeBackedUp says a runtime move backed the node's containerd up
// (from o.From), so RestoreRuntime has something to put back.
func (o *Ops) RuntimeBackedUp(ctx context.Context) (bool, error) {
	return o.Exists(ctx, path.Join(o.runtimeBackupDir(), "runtime-files"))
}

// RestoreRuntime puts back the containerd programs, runc and config
// SwapRuntime backed up (at p), removes the programs it added, and
// restarts containerd; where it backed up nothing, nothing changes.
func (o *Ops) RestoreRuntime(ctx context.Context, p RuntimePaths) error {
	dir, runcBin, config := p.resolved()
	_, err := o.Run(ctx, "restore containerd", nodescript.RuntimeRestore, o.runtimeBackupDir(), dir, runcBin, config, ContainerdUnit)
	return err
}
