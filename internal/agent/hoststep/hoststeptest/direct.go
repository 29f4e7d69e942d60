// Package hoststeptest runs hoststep's units as the test's own child
// processes, for tests of the agent's loop where no service manager is
// at hand (the sandbox's nodes have theirs).
package hoststeptest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"

	"github.com/kubelift/kubelift/internal/agent/hoststep"
)

// Direct runs each unit's argv as a child process; a name in use is
// hoststep.ErrExists, as the host's manager says.
type Direct struct {
	mu     sync.Mutex
	active map[string]bool
	starts map[string]int
}

// Start starts argv.
func (d *Direct) Start(_ context.Context, name string, argv []string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.active == nil {
		d.active, d.starts = map[string]bool{}, map[string]int{}
	}
	if d.active[name] {
		return hoststep.ErrExists
	}
	for _, w := range argv {
		if strings.Contains(w, "$") { // systemd may expand it (the sandbox's manager refuses it too)
			return fmt.Errorf("a word with $: %q", w)
		}
	}
	d.active[name] = true
	d.starts[name]++
	go func() {
		_ = exec.Command(argv[0], argv[1:]...).Run()
		d.mu.Lock()
		d.active[name] = false
		d.mu.Unlock()
	}()
	return nil
}

// Active says whether the unit's process runs.
func (d *Direct) Active(_ context.Context, name string) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.active[name], nil
}

// Stop does nothing: the tests' steps end on their own.
func (d *Direct) Stop(context.Context, string) error { return nil }

// Starts is how many times name was started.
func (d *Direct) Starts(name string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.starts[name]
}
