package sandbox_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubelift/kubelift/test/env/sandbox"
)

// interruptChildEnv makes the test binary, run again by
// TestInterruptTakesTheSandboxDown, the child it interrupts: a sandbox
// in the directory it names, brought up under sandbox.DownOnInterrupt.
const interruptChildEnv = "KUBELIFT_SANDBOX_INTERRUPT_CHILD"

// interruptChild brings up a one-node sandbox in dir (the tool, name and
// subnet from the environment), says "up" with its state on stdout, and
// waits to be interrupted.
func interruptChild(dir string) {
	c := sandbox.Config{Dir: dir, Name: os.Getenv("KUBELIFT_SANDBOX_INTERRUPT_NAME"), Subnet: "10.87.0",
		ControlPlanes: 1, Workers: 0, Tool: os.Getenv("KUBELIFT_SANDBOX_INTERRUPT_TOOL"),
		Log: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "child sandbox: "+format+"\n", args...) }}
	c.Defaults()
	td := sandbox.DownOnInterrupt(c.Dir, c.Log)
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		_ = td.Down()
		os.Exit(1)
	}
	s, err := sandbox.Up(td.Ctx, c)
	if err != nil {
		fail(err)
	}
	b, err := json.Marshal(s)
	if err != nil {
		fail(err)
	}
	fmt.Printf("up %s\n", b)
	select {}
}

// A test binary interrupted (^C in make test, or SIGTERM) takes its
// sandbox down before it ends: Go's default ended it at once, and the
// sandbox's processes (in sessions of their own), namespaces and cgroups
// outlived it.
func TestInterruptTakesTheSandboxDown(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sandbox-interrupted")
	name := cfg.Name + "i"
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), interruptChildEnv+"="+dir, "KUBELIFT_SANDBOX_INTERRUPT_NAME="+name, "KUBELIFT_SANDBOX_INTERRUPT_TOOL="+cfg.Tool)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if err := sandbox.Down(t.Context(), dir, nil); err != nil {
			t.Error(err)
		}
	})
	up := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "up "); ok {
				up <- line
			}
		}
		exited <- cmd.Wait()
	}()
	var state sandbox.State
	select {
	case line := <-up:
		if err := json.Unmarshal([]byte(line), &state); err != nil {
			t.Fatalf("the child's state: %v", err)
		}
	case err := <-exited:
		t.Fatalf("the child ended before its sandbox was up: %v\n%s", err, stderr.String())
	case <-time.After(5 * time.Minute):
		t.Fatalf("the child's sandbox not up in 5 minutes:\n%s", stderr.String())
	}
	if len(state.Machines) == 0 {
		t.Fatalf("the child's sandbox has no machines: %+v", state)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-exited:
	case <-time.After(3 * time.Minute):
		t.Fatalf("the child still runs 3 minutes after the interrupt:\n%s", stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("the interrupted child ended with %v, want exit status 130\n%s", err, stderr.String())
	}
	for _, m := range state.Machines {
		if m.Pid > 0 && sandbox.Running(m.Pid) {
			t.Errorf("after the interrupt, init of %s (pid %d) still runs", m.Name, m.Pid)
		}
		if _, err := os.Stat("/run/netns/" + m.NetNS); m.NetNS != "" && err == nil {
			t.Errorf("after the interrupt, namespace %s still exists", m.NetNS)
		}
	}
	if left := sandbox.CgroupDirs(name); len(left) > 0 {
		t.Errorf("after the interrupt, cgroups left: %v", left)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after the interrupt, %s: %v (want it removed)", dir, err)
	}
}
