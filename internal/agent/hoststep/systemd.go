package hoststep

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
)

// Systemd is the host's service manager, reached by the host's own
// systemd-run and systemctl, chrooted to Root (the host's root as the
// agent sees it; "" or "/": not chrooted).
type Systemd struct{ Root string }

// command runs the host's program name (found on the host's PATH) with
// args, inside Root.
func (s Systemd) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c", `exec "$0" "$@"`, name}, args...)...)
	// SYSTEMD_IGNORE_CHROOT: systemctl, finding itself chrooted, would
	// ignore a verb that needs the running manager ("Running in chroot,
	// ignoring command"); here the chroot is the host's own root.
	c.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "SYSTEMD_IGNORE_CHROOT=1"}
	if s.Root != "" && s.Root != "/" {
		c.SysProcAttr = &syscall.SysProcAttr{Chroot: s.Root}
		c.Dir = "/"
	}
	return c
}

func (s Systemd) run(ctx context.Context, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	c := s.command(ctx, name, args...)
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Start runs systemd-run for argv as the transient service name, not
// waiting for it, collected once it ends (its result is in its
// directory, not in the unit).
func (s Systemd) Start(ctx context.Context, name string, argv []string) error {
	_, err := s.run(ctx, "systemd-run", append([]string{"--unit", name, "--collect", "--no-block", "--quiet",
		"--property", "KillMode=control-group", "--"}, argv...)...)
	if err != nil && (strings.Contains(err.Error(), "already exists") || strings.Contains(err.Error(), "already loaded")) {
		return fmt.Errorf("%w: %v", ErrExists, err)
	}
	return err
}

// Active reads the unit's ActiveState.
func (s Systemd) Active(ctx context.Context, name string) (bool, error) {
	out, err := s.run(ctx, "systemctl", "show", "--property", "ActiveState", "--value", name)
	if err != nil {
		return false, err
	}
	switch st := strings.TrimSpace(out); st {
	case "active", "activating", "deactivating", "reloading", "refreshing":
		return true, nil
	case "inactive", "failed":
		return false, nil
	default:
		return false, fmt.Errorf("systemctl show %s: ActiveState %q: not a unit state", name, st)
	}
}

// Stop has the unit stopped (its whole control group).
func (s Systemd) Stop(ctx context.Context, name string) error {
	_, err := s.run(ctx, "systemctl", "stop", "--no-block", name)
	if err != nil && strings.Contains(err.Error(), "not loaded") {
		return nil // gone already: a transient unit collected once it ended
	}
	return err
}
