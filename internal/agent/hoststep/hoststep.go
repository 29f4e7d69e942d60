// Package hoststep runs agent mode's steps on the node's host: each
// request as a transient unit of the host's service manager (the
// agent-step node script under systemd-run), its output and exit status
// kept in a directory of its own until read. A kubelet, containerd or
// agent restart therefore cuts no step off, and a request seen twice
// (a restarted agent, a watch listed again) runs once: it is answered
// from its directory, waited on while its unit runs, or reported failed
// where its unit ended without a result.
package hoststep

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/atomicfile"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// DefaultDir is where the steps' directories are, on the host.
const DefaultDir = "/var/lib/kubelift/agent"

// Units starts and reads the host's transient units (Systemd: through
// systemd-run and systemctl, chrooted to the host's root).
type Units interface {
	// Start starts argv as the transient unit name, without waiting for
	// it; a unit of that name that exists already is ErrExists.
	Start(ctx context.Context, name string, argv []string) error
	// Active says whether the unit is loaded and not yet ended.
	Active(ctx context.Context, name string) (bool, error)
	// Stop stops the unit.
	Stop(ctx context.Context, name string) error
}

// ErrExists is a transient unit whose name is taken.
var ErrExists = errors.New("the unit exists already")

// errNameUsedTwice is a step directory that holds another request's
// command under this request's name.
var errNameUsedTwice = errors.New("a request name used twice")

// Host runs steps on one node.
type Host struct {
	// Root is the host's root as the agent sees it ("/host"), and Dir
	// where the steps' directories are on the host (DefaultDir).
	Root, Dir string
	Units     Units
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Grace is how long a unit this agent started may take to begin its
	// step before it is stopped and reported failed (10 s when 0).
	Grace time.Duration

	mu      sync.Mutex
	started map[string]time.Time // this agent's Start of each step
	// forgotten: requests deleted from the API; never started again,
	// their directories removed once their units end (Sweep).
	forgotten map[string]bool
}

// UnitName is the transient unit that runs request name.
func UnitName(name string) string { return name + ".service" }

func (h *Host) dir(name string) string { return path.Join(h.Dir, name) }

func (h *Host) local(name string, file ...string) string {
	return filepath.Join(append([]string{h.Root, filepath.FromSlash(h.dir(name))}, file...)...)
}

// Run starts r if it never began, and returns its result once there is
// one: nil while its unit runs. Called again with the same request, it
// never starts it twice; a request forgotten (deleted) is never started.
func (h *Host) Run(ctx context.Context, r agent.Request) (*agent.Result, error) {
	h.mu.Lock()
	forgotten := h.forgotten[r.Name]
	at, started := h.started[r.Name]
	h.mu.Unlock()
	if forgotten {
		return nil, nil
	}
	if res, err := h.result(r); res != nil || err != nil {
		return res, err
	}
	unit := UnitName(r.Name)
	if _, err := os.Stat(h.local(r.Name, "began")); err == nil {
		active, err := h.Units.Active(ctx, unit)
		if err != nil {
			return nil, fmt.Errorf("step %s: unit %s: %w", r.Name, unit, err)
		}
		if active {
			return nil, nil
		}
		// The unit may have written rc and ended since result looked.
		if res, err := h.result(r); res != nil || err != nil {
			return res, err
		}
		return &agent.Result{Exit: 1, Unit: unit, Failed: fmt.Sprintf("the step's unit %s ended without a result (the host restarted, or the unit was stopped)", unit)}, nil
	}
	if started {
		if h.now().Sub(at) < h.grace() {
			return nil, nil
		}
		// Stopped first: a start job still queued would begin the step
		// after it was reported failed. A unit that failed at once is
		// gone already (--collect), and stopping it fails: what counts
		// is that it does not run.
		stopErr := h.Units.Stop(ctx, unit)
		if active, err := h.Units.Active(ctx, unit); err != nil || active {
			return nil, errors.Join(err, stopErr)
		}
		if _, err := os.Stat(h.local(r.Name, "began")); err == nil {
			return nil, nil // it began after all: the next call reads it
		}
		return &agent.Result{Exit: 1, Unit: unit, Failed: fmt.Sprintf("the step's unit %s did not begin within %s, and was stopped", unit, h.grace())}, nil
	}
	if err := h.prepare(r); err != nil {
		if errors.Is(err, errNameUsedTwice) { // for good: answered, not tried again
			return &agent.Result{Exit: 1, Unit: unit, Failed: err.Error()}, nil
		}
		return nil, err
	}
	// The script is a file of the step's, not a word of the command:
	// systemd expands $VAR and ${VAR} in a unit's command words.
	argv := []string{"/bin/sh", path.Join(h.dir(r.Name), "step"), h.dir(r.Name), strconv.Itoa(int(r.Deadline / time.Second))}
	// Under the lock, so that a Forget (the request deleted meanwhile)
	// either comes first and the step never starts, or comes after and
	// finds it started.
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.forgotten[r.Name] {
		return nil, nil
	}
	if err := h.Units.Start(ctx, unit, argv); err != nil && !errors.Is(err, ErrExists) {
		return nil, fmt.Errorf("step %s: starting unit %s: %w", r.Name, unit, err)
	}
	if h.started == nil {
		h.started = map[string]time.Time{}
	}
	h.started[r.Name] = h.now()
	return nil, nil
}

// prepare writes the step's directory (its command and input), whole or
// not at all, unless an earlier agent did: then it must hold this
// request's command and input, else it is another request's.
func (h *Host) prepare(r agent.Request) error {
	final := h.local(r.Name)
	want := map[string][]byte{"cmd": []byte(r.Command() + "\n"), "stdin": r.Stdin, "step": []byte(nodescript.AgentStep.Text)}
	if _, err := os.Stat(final); err == nil {
		for _, file := range []string{"cmd", "stdin"} {
			if got, err := os.ReadFile(filepath.Join(final, file)); err != nil || !bytes.Equal(got, want[file]) {
				return fmt.Errorf("step %s: %s holds another command or input than the request's (%v): %w", r.Name, final, err, errNameUsedTwice)
			}
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		return fmt.Errorf("step %s: %w", r.Name, err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(final), "."+r.Name+".")
	if err != nil {
		return fmt.Errorf("step %s: %w", r.Name, err)
	}
	defer os.RemoveAll(tmp)
	for file, data := range want {
		if err := atomicfile.WriteFile(filepath.Join(tmp, file), data, 0o600); err != nil {
			return fmt.Errorf("step %s: %w", r.Name, err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("step %s: %w", r.Name, err)
	}
	return nil
}

// result reads the step's result where its rc is written: nil, nil
// where it is not yet. Its input, which may hold credentials, is removed
// once it ended.
func (h *Host) result(r agent.Request) (*agent.Result, error) {
	b, err := os.ReadFile(h.local(r.Name, "rc"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	unit := UnitName(r.Name)
	if err != nil {
		return nil, fmt.Errorf("step %s: %w", r.Name, err)
	}
	_ = os.Remove(h.local(r.Name, "stdin"))
	rc, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || rc < 0 || rc > 255 {
		return &agent.Result{Exit: 1, Unit: unit, Failed: fmt.Sprintf("step %s: %s: exit status %q: not 0 to 255", r.Name, h.local(r.Name, "rc"), b)}, nil
	}
	res := &agent.Result{Exit: rc, Unit: unit}
	switch rc {
	case 124:
		res.Failed = fmt.Sprintf("the step outlived its deadline of %s on the node, and was stopped", r.Deadline)
	case 137:
		res.Failed = fmt.Sprintf("the step was killed (KILL): it outlived its deadline of %s and did not stop on TERM, or the host killed it", r.Deadline)
	}
	if res.Stdout, err = readAtMost(h.local(r.Name, "out"), agent.MaxStdout); err != nil {
		res.Exit, res.Failed, res.Stdout = 1, fmt.Sprintf("step %s: %v", r.Name, err), nil
	}
	stderr, _ := readTail(h.local(r.Name, "err"), agent.StderrTail)
	res.Stderr = strings.TrimSpace(string(stderr))
	if fi, err := os.Stat(h.local(r.Name, "began")); err == nil {
		res.Started = fi.ModTime()
	}
	if fi, err := os.Stat(h.local(r.Name, "rc")); err == nil {
		res.Finished = fi.ModTime()
	}
	return res, nil
}

func (h *Host) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

func (h *Host) grace() time.Duration {
	if h.Grace > 0 {
		return h.Grace
	}
	return 10 * time.Second
}

// Forget marks request name deleted from the API: it is never started
// again, and its directory goes once its unit ended (Sweep).
func (h *Host) Forget(name string) {
	h.mu.Lock()
	if h.forgotten == nil {
		h.forgotten = map[string]bool{}
	}
	h.forgotten[name] = true
	delete(h.started, name)
	h.mu.Unlock()
}

// Sweep removes the directories of forgotten requests whose units ended,
// and of every request on the host that keep does not name (requests
// deleted while no agent ran), once its unit ended.
func (h *Host) Sweep(ctx context.Context, keep func(name string) bool) error {
	entries, err := os.ReadDir(filepath.Join(h.Root, filepath.FromSlash(h.Dir)))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || strings.HasPrefix(name, ".") {
			continue
		}
		h.mu.Lock()
		forgotten := h.forgotten[name]
		h.mu.Unlock()
		if !forgotten && keep(name) {
			continue
		}
		if active, err := h.Units.Active(ctx, UnitName(name)); err != nil || active {
			errs = append(errs, err)
			continue
		}
		h.Forget(name)
		errs = append(errs, os.RemoveAll(h.local(name)))
	}
	return errors.Join(errs...)
}

// readAtMost reads file, refusing one over max bytes.
func readAtMost(file string, max int) ([]byte, error) {
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err == nil && len(b) > max {
		err = fmt.Errorf("output over agent mode's %d bytes (bulk data travels through the registry, or in ranges)", max)
	}
	return b, err
}

// readTail reads the last n bytes of file.
func readTail(file string, n int64) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		if _, err := f.Seek(fi.Size()-n, io.SeekStart); err != nil {
			return nil, err
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, n))
	return bytes.ToValidUTF8(b, []byte("?")), err
}
