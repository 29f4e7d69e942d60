package systemd

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func (m *Manager) start(name string) error {
	s, err := m.get(name)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s.want = true
	if s.state == "active" {
		return nil
	}
	return m.spawn(name, s)
}

// spawn starts the unit's process; m.mu is held.
func (m *Manager) spawn(name string, s *service) error {
	u := s.unit
	for _, d := range u.RuntimeDirectory {
		if err := os.MkdirAll(filepath.Join("/run", d), 0o755); err != nil {
			return err
		}
	}
	env, err := u.environment()
	if err != nil {
		s.state, s.result = "failed", err.Error()
		return err
	}
	argv := expandArgs(u.ExecStart, env)
	logf, err := os.OpenFile(filepath.Join(m.LogDir, strings.TrimSuffix(name, ".service")+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "-- %s systemd: Starting %s (%s) --\n", time.Now().Format(time.RFC3339), name, strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Dir = "/"
	if u.WorkingDirectory != "" {
		cmd.Dir = u.WorkingDirectory
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		s.state, s.result = "failed", err.Error()
		return err
	}
	s.generation++
	gen := s.generation
	s.cmd, s.state, s.since, s.result = cmd, "active", time.Now(), ""
	pidFile := filepath.Join(m.PidDir, name+".pid")
	_ = os.WriteFile(pidFile, []byte(fmt.Sprintln(cmd.Process.Pid)), 0o644)
	s.exited = make(chan struct{})
	exited := s.exited
	go func() {
		err := cmd.Wait()
		m.mu.Lock()
		defer m.mu.Unlock()
		_ = os.Remove(pidFile)
		close(exited)
		if s.generation != gen {
			return
		}
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		if !s.want {
			s.state, s.result = "inactive", "stopped"
			m.collect(name, s)
			return
		}
		s.state, s.result = "failed", fmt.Sprintf("exited: %v", err)
		if err == nil {
			s.state, s.result = "inactive", "exited 0"
		}
		m.collect(name, s)
		if s.unit.Restart == "always" || (s.unit.Restart == "on-failure" && code != 0) {
			s.state = "activating"
			time.AfterFunc(s.unit.RestartSec, func() {
				m.mu.Lock()
				defer m.mu.Unlock()
				if s.want && s.generation == gen {
					s.restarts++
					_ = m.spawn(name, s)
				}
			})
		}
	}()
	return nil
}

func (m *Manager) stop(name string) {
	m.mu.Lock()
	s := m.services[name]
	if s == nil {
		m.mu.Unlock()
		return
	}
	s.want = false
	s.generation++ // cancels a pending automatic restart
	cmd, exited, timeout := s.cmd, s.exited, s.unit.TimeoutStopSec
	target := -1 // the process group
	if s.unit.KillMode == "process" {
		target = 1
	}
	running := s.state == "active" && cmd != nil
	m.mu.Unlock()
	if !running {
		m.mu.Lock()
		if s.state == "activating" {
			s.state = "inactive"
		}
		m.mu.Unlock()
		return
	}
	pid := target * cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(timeout):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-exited
	}
	if target < 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL) // what the main process left behind in its group
	}
	m.mu.Lock()
	s.state, s.result = "inactive", "stopped"
	m.collect(name, s) // the exit above saw a new generation, and left it
	m.mu.Unlock()
}

// collect forgets a transient unit started with --collect once it ended;
// m.mu is held.
func (m *Manager) collect(name string, s *service) {
	if s.collect && m.services[name] == s {
		delete(m.services, name)
	}
}
