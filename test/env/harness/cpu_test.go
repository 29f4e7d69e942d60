package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func cpuCgroup(t *testing.T) string {
	t.Helper()
	cg, err := cgroupOf("cpu")
	if err != nil {
		t.Fatal(err)
	}
	return cg
}

// The test process weighs as one machine of its own (the story's admin),
// not as part of make test's session, and leaves no cgroup behind.
func TestTestProcessWeighsAsTheAdminMachine(t *testing.T) {
	name := fmt.Sprintf("harness-test-%d", os.Getpid())
	before := cpuCgroup(t)
	leave, err := joinAdminCPU(name)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cpuCgroup(t), "/kubelift-"+name+"-admin"; got != want {
		t.Errorf("in cpu cgroup %s, want %s", got, want)
	}
	if err := leave(); err != nil {
		t.Fatal(err)
	}
	if got := cpuCgroup(t); got != before {
		t.Errorf("after leave in cpu cgroup %s, want %s, where it was", got, before)
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/cpu", "kubelift-"+name+"-admin")); !os.IsNotExist(err) {
		t.Errorf("the admin cgroup is left: %v", err)
	}
}
