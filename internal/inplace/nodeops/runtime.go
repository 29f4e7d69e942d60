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

// RuntimeMove is a move of the node's containerd (and runc) in place, to
// the node-stack parts staged with the target's files ("containerd", its
// release archive; "runc").
type RuntimeMove struct {
	// From is the containerd version the node runs (v1.7.35), as the
	// plan read it: the backup is taken only of that one. To is the
	// bundle's.
	From, To string
	// ArchiveSHA256 and RuncSHA256 are the staged parts' sums; RuncSHA256
	// is empty when the bundle carries no runc (runc stays).
	ArchiveSHA256, RuncSHA256 string
	// Migrate: the major version changes, and with it the config's
	// schema (1.x's version 2, 2.x's version 3): containerd's own `config
	// migrate` rewrites it.
	Migrate bool
	// ContainerdDir, RuncBinary and Config are where the node keeps
	// containerd's programs, runc and containerd's config; empty, the
	// defaults above.
	ContainerdDir, RuncBinary, Config string
}

// paths are where the node keeps containerd's programs, runc and the
// config: the move's, else the defaults.
func (m RuntimeMove) paths() (dir, runc, config string) {
	dir, runc, config = m.ContainerdDir, m.RuncBinary, m.Config
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

// SwapRuntime moves the node's containerd (and runc) to the staged
// parts: backs up the old programs and config once (only while the
// node's containerd runs m.From), migrates the config where m.Migrate,
// renames each program into place and restarts containerd. The
// containers stay with their shims; the caller checks every task's PID.
// Run again, it ends the same, the first backup kept.
func (o *Ops) SwapRuntime(ctx context.Context, m RuntimeMove) error {
	dir, runcBin, config := m.paths()
	runc, runcSum := release.StagePath(o.StageDir, o.To, release.FileRunc), m.RuncSHA256
	if runcSum == "" {
		runc, runcSum = "-", "-"
	}
	migrate := "keep"
	if m.Migrate {
		migrate = "migrate"
	}
	began := time.Now()
	out, err := o.Run(ctx, fmt.Sprintf("move containerd %s to %s", m.From, m.To), nodescript.RuntimeSwap,
		o.runtimeBackupDir(), release.StagePath(o.StageDir, o.To, release.FileContainerd), m.ArchiveSHA256, runc, runcSum, runcBin,
		dir, config, migrate, ContainerdUnit, m.From)
	if err == nil && o.Restarted != nil {
		o.Restarted(restartTime(out, time.Since(began)))
	}
	return err
}

// RestoreRuntime puts back the containerd programs, runc and config
// SwapRuntime backed up (at m's paths), removes the programs it added,
// and restarts containerd; where it backed up nothing, nothing changes.
func (o *Ops) RestoreRuntime(ctx context.Context, m RuntimeMove) error {
	dir, runcBin, config := m.paths()
	_, err := o.Run(ctx, "restore containerd", nodescript.RuntimeRestore, o.runtimeBackupDir(), dir, runcBin, config, ContainerdUnit)
	return err
}
