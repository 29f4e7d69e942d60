package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Down stops every process the sandbox in dir started (by pid), deletes
// its namespaces (killing whatever still runs in them) and removes dir.
// It is safe on a half-made or already removed sandbox.
func Down(ctx context.Context, dir string, log func(string, ...any)) error {
	if log == nil {
		log = func(string, ...any) {}
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	s, err := Load(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			log("no sandbox in %s", dir)
			return os.RemoveAll(dir)
		}
		return err
	}
	var errs []error
	// Machines stop their services themselves on SIGTERM (kubelets first,
	// as listed last); then anything left in a machine is killed.
	for i := len(s.Machines) - 1; i >= 0; i-- {
		m := s.Machines[i]
		if m.Pid > 0 && isInit(m.Pid, m.Root) {
			_ = syscall.Kill(m.Pid, syscall.SIGTERM)
		}
	}
	for _, m := range s.Machines {
		if m.Pid > 0 && isInit(m.Pid, m.Root) {
			waitGone(m.Pid, 30*time.Second)
			if Running(m.Pid) {
				_ = syscall.Kill(m.Pid, syscall.SIGKILL)
				waitGone(m.Pid, 5*time.Second)
			}
		}
		for _, pid := range unitPids(m.Root) {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for i := len(s.Machines) - 1; i >= 0; i-- {
		m := s.Machines[i]
		if m.NetNS == "" || !m.NetNSMade {
			continue
		}
		if err := deleteNetNS(m.NetNS); err != nil {
			errs = append(errs, err)
		}
	}
	if s.CgroupsMade {
		if err := removeCgroups(s.Name); err != nil {
			errs = append(errs, err)
		}
	}
	for i := len(s.MountPoints) - 1; i >= 0; i-- {
		_ = os.Remove(s.MountPoints[i]) // only if still empty
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	log("sandbox in %s removed: %d machines stopped, namespaces deleted", dir, len(s.Machines))
	return nil
}

// isInit says whether pid is still this machine's init (pids are reused).
func isInit(pid int, root string) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(cmdline), "node-init") && strings.Contains(string(cmdline), root)
}

func waitGone(pid int, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && Running(pid) {
		time.Sleep(50 * time.Millisecond)
	}
}

// unitPids reads the pid files the machine's service manager keeps.
func unitPids(root string) []int {
	files, _ := filepath.Glob(filepath.Join(root, "run", "kubelift-units", "*.pid"))
	var out []int
	for _, f := range files {
		var pid int
		data, _ := os.ReadFile(f)
		if _, err := fmt.Sscan(string(data), &pid); err == nil && pid > 1 {
			out = append(out, pid)
		}
	}
	return out
}

// deleteNetNS kills every process still in the namespace, then deletes it.
// Not this one: while one of its threads dials from the namespace
// (kube.NetNS.DialContext), `ip netns pids` lists it if that thread is
// its main one, and a test that tore its sandbox down so ended "signal:
// killed", the namespace left behind.
func deleteNetNS(name string) error {
	if _, err := os.Stat("/run/netns/" + name); err != nil {
		return nil
	}
	for i := 0; i < 3; i++ {
		out, _ := exec.Command("ip", "netns", "pids", name).Output()
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			var pid int
			if _, err := fmt.Sscan(p, &pid); err == nil && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %v: %s", name, err, out)
	}
	return nil
}
