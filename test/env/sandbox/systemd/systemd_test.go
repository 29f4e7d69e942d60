package systemd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// boot runs a manager over units written into a temporary directory and
// returns its socket.
func boot(t *testing.T, units map[string]string, enabled ...string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	m := NewManager()
	m.UnitDir, m.WantsDir = filepath.Join(dir, "units"), filepath.Join(dir, "units", "multi-user.target.wants")
	m.LogDir, m.PidDir = filepath.Join(dir, "log"), filepath.Join(dir, "pids")
	if err := os.MkdirAll(m.WantsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range units {
		if err := os.WriteFile(filepath.Join(m.UnitDir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range enabled {
		if err := os.Symlink(filepath.Join(m.UnitDir, name), filepath.Join(m.WantsDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(dir, "systemd.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Boot(ctx, sock) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	// The socket appears once the manager listens; on a loaded machine
	// (every test package at once) that can take seconds.
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i == 3000 {
			t.Fatalf("the manager did not listen on %s within 30s", sock)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return sock, dir
}

func systemctl(t *testing.T, sock string, args ...string) (string, int) {
	t.Helper()
	out, errOut, code := Systemctl(sock, args)
	return out + errOut, code
}

func mainPID(t *testing.T, sock, unit string) int {
	t.Helper()
	out, _ := systemctl(t, sock, "show", unit, "-p", "MainPID")
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(out, "MainPID=")))
	if err != nil {
		t.Fatalf("show %s: %q", unit, out)
	}
	return pid
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("gave up waiting for %s", what)
}

const sleeper = `[Unit]
Description=sleeps
After=first.service

[Service]
Environment="ARGS=1000 extra-ignored" NAME=demo
ExecStart=/bin/sh -c 'echo started $NAME; exec sleep 1000'
Restart=always
RestartSec=0.1
`

func TestBootStartStopRestart(t *testing.T) {
	sock, dir := boot(t, map[string]string{"sleeper.service": sleeper, "idle.service": "[Service]\nExecStart=/bin/sleep 1000\n"}, "sleeper.service")
	if out, code := systemctl(t, sock, "is-active", "sleeper"); code != 0 || out != "active\n" {
		t.Fatalf("enabled unit after boot: %q %d", out, code)
	}
	if out, code := systemctl(t, sock, "is-active", "idle"); code != 3 || out != "inactive\n" {
		t.Fatalf("unit not enabled: %q %d, want inactive and exit 3", out, code)
	}
	pid := mainPID(t, sock, "sleeper")
	if data, _ := os.ReadFile(filepath.Join(dir, "pids", "sleeper.service.pid")); strings.TrimSpace(string(data)) != fmt.Sprint(pid) {
		t.Errorf("pid file %q, MainPID %d", data, pid)
	}

	// restart: a new process.
	if out, code := systemctl(t, sock, "restart", "sleeper"); code != 0 {
		t.Fatalf("restart: %q %d", out, code)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Errorf("old process %d still runs after restart", pid)
	}
	pid2 := mainPID(t, sock, "sleeper")
	if pid2 == pid || pid2 == 0 {
		t.Fatalf("MainPID %d after restart, was %d", pid2, pid)
	}

	// restart --no-block: queued, and done.
	if out, code := systemctl(t, sock, "restart", "--no-block", "sleeper"); code != 0 {
		t.Fatalf("restart --no-block: %q %d", out, code)
	}
	waitUntil(t, "sleeper restarted after restart --no-block", func() bool {
		p := mainPID(t, sock, "sleeper")
		return p != 0 && p != pid2 && syscall.Kill(pid2, 0) != nil
	})
	pid2 = mainPID(t, sock, "sleeper")

	// Restart=always: a killed process comes back.
	_ = syscall.Kill(pid2, syscall.SIGKILL)
	waitUntil(t, "sleeper restarted after SIGKILL", func() bool {
		p := mainPID(t, sock, "sleeper")
		return p != 0 && p != pid2
	})
	if out, _ := systemctl(t, sock, "show", "sleeper", "-p", "NRestarts"); out != "NRestarts=1\n" {
		t.Errorf("after one crash: %q", out)
	}

	// stop: gone, and not restarted.
	pid3 := mainPID(t, sock, "sleeper")
	if _, code := systemctl(t, sock, "stop", "sleeper"); code != 0 {
		t.Fatal("stop failed")
	}
	if syscall.Kill(pid3, 0) == nil {
		t.Errorf("process %d runs after stop", pid3)
	}
	time.Sleep(300 * time.Millisecond)
	if out, code := systemctl(t, sock, "is-active", "sleeper"); code != 3 || out != "inactive\n" {
		t.Errorf("after stop: %q %d", out, code)
	}

	// status shows the journal stand-in; the environment was expanded.
	systemctl(t, sock, "start", "sleeper")
	out, code := systemctl(t, sock, "status", "sleeper")
	if code != 0 || !strings.Contains(out, "Active: active (running)") || !strings.Contains(out, "started demo") {
		t.Errorf("status: %d\n%s", code, out)
	}
}

func TestEnableDisableAndErrors(t *testing.T) {
	sock, dir := boot(t, map[string]string{"idle.service": "[Service]\nExecStart=/bin/sleep 1000\n"})
	if out, code := systemctl(t, sock, "enable", "--now", "idle"); code != 0 || !strings.Contains(out, "Created symlink") {
		t.Fatalf("enable --now: %q %d", out, code)
	}
	if _, err := os.Lstat(filepath.Join(dir, "units", "multi-user.target.wants", "idle.service")); err != nil {
		t.Error(err)
	}
	if out, code := systemctl(t, sock, "is-enabled", "idle"); code != 0 || out != "enabled\n" {
		t.Errorf("is-enabled: %q %d", out, code)
	}
	if out, code := systemctl(t, sock, "is-active", "idle"); code != 0 {
		t.Errorf("enable --now did not start: %q", out)
	}
	if _, code := systemctl(t, sock, "disable", "--now", "idle"); code != 0 {
		t.Error("disable failed")
	}
	if out, code := systemctl(t, sock, "is-enabled", "idle"); code == 0 || out != "disabled\n" {
		t.Errorf("after disable: %q %d", out, code)
	}
	if out, code := systemctl(t, sock, "start", "missing"); code == 0 || !strings.Contains(out, "missing.service not found") {
		t.Errorf("start of a missing unit: %q %d", out, code)
	}
	if out, code := systemctl(t, sock, "frobnicate", "idle"); code == 0 || !strings.Contains(out, "Unknown command verb frobnicate") {
		t.Errorf("unknown verb: %q %d", out, code)
	}
	// A unit changed on disk runs its new command after daemon-reload.
	if err := os.WriteFile(filepath.Join(dir, "units", "idle.service"), []byte("[Service]\nExecStart=/bin/sleep 999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	systemctl(t, sock, "daemon-reload")
	systemctl(t, sock, "restart", "idle")
	// The kernel fills /proc/PID/cmdline a moment after the exec that
	// `restart` waited for (under load a read can find it empty): wait for
	// a non-empty one, then judge it.
	var cmdline []byte
	waitUntil(t, "the restarted unit's command line", func() bool {
		cmdline, _ = os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", mainPID(t, sock, "idle")))
		return len(cmdline) > 0
	})
	if !strings.Contains(string(cmdline), "999") {
		t.Errorf("after daemon-reload and restart the unit runs %q", cmdline)
	}
}

func TestParseUnit(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kubelet.service")
	unit := "[Unit]\nAfter=a.service b.service\n[Service]\nEnvironment=\"KUBELET_ARGS=--v=2 --node-ip=10.0.0.1\"\nExecStart=/usr/local/bin/kubelet \\\n  --config=/x.yaml $KUBELET_ARGS $EMPTY\nRestart=always\nRestartSec=10\n"
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	u, err := ParseUnit(path)
	if err != nil {
		t.Fatal(err)
	}
	env, err := u.environment()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(expandArgs(u.ExecStart, env), " ")
	if got != "/usr/local/bin/kubelet --config=/x.yaml --v=2 --node-ip=10.0.0.1" {
		t.Errorf("argv %q", got)
	}
	if u.RestartSec != 10*time.Second || u.Restart != "always" || strings.Join(u.After, ",") != "a.service,b.service" {
		t.Errorf("parsed %+v", u)
	}
	if err := os.WriteFile(path, []byte("[Service]\nExecStart=/bin/sh -c 'unterminated\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseUnit(path); err == nil || !strings.Contains(err.Error(), "kubelet.service:2") {
		t.Errorf("bad quoting: %v", err)
	}
}

// KillMode=process stops the main process only: what it started in its
// process group lives on (containerd's shims and containers). The
// default kills the group.
func TestKillModeProcessSparesChildren(t *testing.T) {
	dir := t.TempDir()
	unit := func(mode, pidFile string) string {
		script := pidFile + ".sh"
		if err := os.WriteFile(script, []byte("sleep 300 &\necho $! > "+pidFile+"\nexec sleep 300\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("[Service]\nExecStart=/bin/sh %s\n%s\n", script, mode)
	}
	spared, killed := filepath.Join(dir, "spared.pid"), filepath.Join(dir, "killed.pid")
	sock, _ := boot(t, map[string]string{
		"runtime.service": unit("KillMode=process", spared),
		"plain.service":   unit("", killed),
	}, "runtime.service", "plain.service")
	childOf := func(pidFile string) int {
		var pid int
		waitUntil(t, pidFile+" written", func() bool {
			data, err := os.ReadFile(pidFile)
			if err != nil {
				return false
			}
			pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
			return err == nil
		})
		return pid
	}
	sparedChild, killedChild := childOf(spared), childOf(killed)
	t.Cleanup(func() { _ = syscall.Kill(sparedChild, syscall.SIGKILL) })
	for _, u := range []string{"runtime.service", "plain.service"} {
		if out, code := systemctl(t, sock, "stop", u); code != 0 {
			t.Fatalf("stop %s: %d %s", u, code, out)
		}
	}
	waitUntil(t, "the default unit's child killed", func() bool { return !alive(killedChild) })
	if !alive(sparedChild) {
		t.Fatalf("KillMode=process: the main process's child %d was killed with it", sparedChild)
	}
}

// alive says whether pid runs (a zombie does not).
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(data), ')')
	return i > 0 && i+2 < len(data) && data[i+2] != 'Z'
}

// systemd-run's transient units (agent mode's steps): started without
// waiting, active while they run, forgotten once ended with --collect,
// and a name in use refused in systemd's words.
func TestTransientUnit(t *testing.T) {
	sock, dir := boot(t, nil)
	mark := filepath.Join(dir, "mark")
	gate := filepath.Join(dir, "gate")
	script := filepath.Join(dir, "step")
	if err := os.WriteFile(script, []byte("while [ ! -e "+gate+" ]; do sleep 0.05; done; echo ran >>"+mark+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(name string, argv ...string) (string, int) {
		if argv == nil {
			argv = []string{"/bin/sh", script}
		}
		return systemctl(t, sock, append([]string{"run", "--unit", name, "--collect", "--no-block", "--quiet", "--property", "KillMode=control-group", "--"}, argv...)...)
	}
	if out, code := run("kubelift-step-b.service", "/bin/sh", "-c", "echo $HOME"); code == 0 || !strings.Contains(out, "a word with $") {
		t.Errorf("a word with $: %d %q", code, out)
	}
	if out, code := run("kubelift-step-a.service"); code != 0 {
		t.Fatalf("systemd-run: %d %s", code, out)
	}
	state := func() string {
		out, _ := systemctl(t, sock, "show", "--property", "ActiveState", "--value", "kubelift-step-a.service")
		return strings.TrimSpace(out)
	}
	if st := state(); st != "active" {
		t.Errorf("running: ActiveState %q", st)
	}
	if out, code := run("kubelift-step-a.service"); code == 0 || !strings.Contains(out, "was already loaded") {
		t.Errorf("the same name again: %d %q", code, out)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := 0; state() != "inactive"; i++ {
		if i == 200 {
			t.Fatalf("still %s after its command ended", state())
		}
		time.Sleep(25 * time.Millisecond)
	}
	if b, _ := os.ReadFile(mark); string(b) != "ran\n" {
		t.Errorf("the command wrote %q", b)
	}
	if out, code := systemctl(t, sock, "list-units"); code != 0 || strings.Contains(out, "kubelift-step-a") {
		t.Errorf("collected unit still listed: %q", out)
	}
	// Stopped, it is collected too.
	if out, code := run("kubelift-step-c.service", "/bin/sleep", "60"); code != 0 {
		t.Fatalf("systemd-run: %d %s", code, out)
	}
	if out, code := systemctl(t, sock, "stop", "kubelift-step-c.service"); code != 0 {
		t.Fatalf("stop: %d %s", code, out)
	}
	if out, _ := systemctl(t, sock, "list-units"); strings.Contains(out, "kubelift-step-c") {
		t.Errorf("a stopped transient unit is still listed: %q", out)
	}
}
