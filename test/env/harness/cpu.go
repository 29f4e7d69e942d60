package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// joinAdminCPU moves this test process, and what it starts from then on
// (the sandbox's registry and balancer, the upgrade program, ssh, a
// build), into a CPU cgroup of its own, kubelift-NAME-admin, of one
// machine's weight (cgroup v1's default cpu.shares): the test process is
// the story's admin machine and its users' clients (the prober), which do
// not share a CPU with the nodes or with other stories in a real
// cluster. In make test's session it was weighed as one with every
// compile and every other story's test process (autogroup), and once
// each node weighed as a machine its prober's own requests stalled for
// seconds. leave moves the process back to where it was and removes the
// cgroup; on a host without cgroup v1's cpu hierarchy both do nothing.
func joinAdminCPU(name string) (leave func() error, err error) {
	type move struct{ from, to string }
	var joined []move
	leave = func() error {
		var errs []error
		for _, m := range joined {
			d := m.to
			if err := os.WriteFile(filepath.Join(m.from, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("leave cgroup %s: %w", d, err))
				continue
			}
			if err := syscall.Rmdir(d); err != nil && !os.IsNotExist(err) {
				errs = append(errs, fmt.Errorf("remove cgroup %s (a process this test started is left in it): %w", d, err))
			}
		}
		return errors.Join(errs...)
	}
	for _, h := range []string{"cpu", "cpuacct"} {
		base := filepath.Join("/sys/fs/cgroup", h)
		if _, err := os.Stat(filepath.Join(base, "cgroup.procs")); err != nil {
			continue // not a cgroup v1 hierarchy here
		}
		from, err := cgroupOf(h)
		if err != nil {
			return nil, errors.Join(err, leave())
		}
		dir := filepath.Join(base, "kubelift-"+name+"-admin")
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return nil, errors.Join(fmt.Errorf("cgroup %s: %w", dir, err), leave())
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			_ = syscall.Rmdir(dir)
			return nil, errors.Join(fmt.Errorf("join cgroup %s: %w", dir, err), leave())
		}
		joined = append(joined, move{from: filepath.Join(base, from), to: dir})
	}
	return leave, nil
}

// cgroupOf is this process's cgroup in the cgroup v1 hierarchy of
// controller (from /proc/self/cgroup: "ID:CONTROLLERS:PATH").
func cgroupOf(controller string) (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), controller) {
			return parts[2], nil
		}
	}
	return "", fmt.Errorf("/proc/self/cgroup names no %s cgroup", controller)
}
