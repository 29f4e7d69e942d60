package hoststep

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// units runs each transient unit's argv as a process of the test (the
// steps' directory is the test's own), counting the starts, as the
// host's service manager would: a name in use is ErrExists.
type units struct {
	mu     sync.Mutex
	active map[string]bool
	starts map[string]int
	// never: a started unit never runs (systemd could not exec it).
	never bool
	stops int
}

func newUnits() *units { return &units{active: map[string]bool{}, starts: map[string]int{}} }

// set says whether the unit runs, as the test wants it.
func (u *units) set(name string, active bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.active[name] = active
}

// counts are the unit's starts, and all stops.
func (u *units) counts(name string) (starts, stops int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.starts[name], u.stops
}

func (u *units) Start(_ context.Context, name string, argv []string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.active[name] {
		return ErrExists
	}
	for _, w := range argv {
		if strings.Contains(w, "$") { // systemd may expand it (the sandbox's manager refuses it too)
			return fmt.Errorf("a word with $: %q", w)
		}
	}
	u.starts[name]++
	if u.never {
		return nil
	}
	u.active[name] = true
	go func() {
		_ = exec.Command(argv[0], argv[1:]...).Run()
		u.mu.Lock()
		u.active[name] = false
		u.mu.Unlock()
	}()
	return nil
}

func (u *units) Active(_ context.Context, name string) (bool, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.active[name], nil
}

// Stop fails for a unit that is not loaded, as systemctl does (exit 5);
// it counts the stops.
func (u *units) Stop(_ context.Context, name string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.stops++
	if !u.active[name] {
		return fmt.Errorf("Failed to stop %s: Unit %s not loaded.", name, name)
	}
	return nil
}

func request(t *testing.T, cmd string, stdin string, deadline time.Duration) agent.Request {
	t.Helper()
	r, err := agent.NewRequest("r1", "worker-1", 1, cmd, []byte(stdin), deadline)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// wait calls Run until it answers.
func wait(t *testing.T, h *Host, r agent.Request) *agent.Result {
	t.Helper()
	for i := 0; i < 400; i++ {
		res, err := h.Run(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if res != nil {
			return res
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("step %s: no result", r.Name)
	return nil
}

// A step runs once as a unit, and is answered from its directory as often
// as it is asked, by this agent or by the next one.
func TestRunOnce(t *testing.T) {
	dir, u := t.TempDir(), newUnits()
	file := filepath.Join(dir, "data")
	if err := os.WriteFile(file, []byte("the file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := request(t, nodescript.ReadFile.Command(file), "", time.Minute)
	h := &Host{Root: "/", Dir: filepath.Join(dir, "agent"), Units: u}
	res := wait(t, h, r)
	if res.Err() != nil || string(res.Stdout) != "the file\n" || res.Unit != r.Name+".service" || res.Started.IsZero() || res.Finished.Before(res.Started) {
		t.Fatalf("result %+v: %v", res, res.Err())
	}
	again := &Host{Root: "/", Dir: h.Dir, Units: u} // the agent restarted
	if res := wait(t, again, r); string(res.Stdout) != "the file\n" {
		t.Errorf("asked again: %+v", res)
	}
	if first(u.counts(UnitName(r.Name))) != 1 {
		t.Errorf("started %d times", first(u.counts(UnitName(r.Name))))
	}

	// A failing step: its exit status and the end of its standard error.
	r = request(t, nodescript.ReadFile.Command(filepath.Join(dir, "absent")), "", time.Minute)
	r.Name += "-b"
	res = wait(t, h, r)
	if err := res.Err(); err == nil || !strings.Contains(err.Error(), "exit status 1") || !strings.Contains(err.Error(), "No such file") {
		t.Errorf("a failing step: %v", err)
	}
}

// A step whose unit runs when the agent restarts is waited on, not
// started again; one whose unit ended without writing its result (the
// host restarted under it) is reported failed.
func TestRestartedAgent(t *testing.T) {
	dir, u := t.TempDir(), newUnits()
	h := &Host{Root: "/", Dir: dir, Units: u}
	r := request(t, nodescript.Exists.Command("/"), "", time.Minute)
	if err := h.prepare(r); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.local(r.Name, "began"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	u.set(UnitName(r.Name), true) // it runs still
	if res, err := h.Run(context.Background(), r); res != nil || err != nil || first(u.counts(UnitName(r.Name))) != 0 {
		t.Fatalf("a running step: %+v %v, %d starts", res, err, first(u.counts(UnitName(r.Name))))
	}
	u.set(UnitName(r.Name), false) // gone without a result
	res, err := h.Run(context.Background(), r)
	if err != nil || res == nil || !strings.Contains(res.Err().Error(), "ended without a result") || first(u.counts(UnitName(r.Name))) != 0 {
		t.Errorf("a unit gone: %+v %v", res, err)
	}
}

// A unit that never begins its step is reported failed after the grace.
func TestUnitThatNeverBegins(t *testing.T) {
	u := newUnits()
	u.never = true
	now := time.Unix(1000, 0)
	h := &Host{Root: "/", Dir: t.TempDir(), Units: u, Now: func() time.Time { return now }}
	r := request(t, nodescript.Exists.Command("/"), "", time.Minute)
	if res, err := h.Run(context.Background(), r); res != nil || err != nil {
		t.Fatalf("%+v %v", res, err)
	}
	now = now.Add(5 * time.Second)
	if res, _ := h.Run(context.Background(), r); res != nil {
		t.Fatalf("within the grace: %+v", res)
	}
	now = now.Add(6 * time.Second)
	res, err := h.Run(context.Background(), r)
	if err != nil || res == nil || !strings.Contains(res.Err().Error(), "did not begin within 10s") || first(u.counts(UnitName(r.Name))) != 1 || second(u.counts("")) != 1 {
		t.Errorf("after the grace: %+v %v (%d stops: the unit is stopped before it is reported)", res, err, second(u.counts("")))
	}
}

// The step gets its standard input (stage-file writes it, its sum
// checked), and its input is gone from the host once it ended.
func TestInput(t *testing.T) {
	dir, u := t.TempDir(), newUnits()
	h := &Host{Root: "/", Dir: filepath.Join(dir, "agent"), Units: u}
	sum := sha256.Sum256([]byte("kept\n"))
	r := request(t, nodescript.StageFile.Command(dir, "kubelet", hex.EncodeToString(sum[:]), "5", "none", "0"), "kept\n", time.Minute)
	if res := wait(t, h, r); res.Err() != nil {
		t.Fatalf("stage-file: %v", res.Err())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "kubelet")); string(b) != "kept\n" {
		t.Errorf("staged %q", b)
	}
	if _, err := os.Stat(h.local(r.Name, "stdin")); !os.IsNotExist(err) {
		t.Errorf("the step's input is still on the host after it ended (%v)", err)
	}
}

// agent-step bounds the step by its deadline (timeout: 124), and the
// host reports such a step failed, saying why.
func TestDeadline(t *testing.T) {
	dir := t.TempDir()
	h := &Host{Root: "/", Dir: dir, Units: newUnits()}
	r := request(t, nodescript.Exists.Command("/"), "", time.Second)
	if err := h.prepare(r); err != nil {
		t.Fatal(err)
	}
	step := h.local(r.Name)
	if err := os.WriteFile(filepath.Join(step, "cmd"), []byte("sleep 30\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("/bin/sh", filepath.Join(step, "step"), step, "1").CombinedOutput(); err != nil {
		t.Fatalf("agent-step: %v %s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(step, "rc")); string(b) != "124\n" {
		t.Errorf("rc %q, want 124 (timeout)", b)
	}
	res, err := h.result(r)
	if err != nil || res == nil || res.Err() == nil || !strings.Contains(res.Err().Error(), "outlived its deadline of 1s") {
		t.Errorf("a slow step: %+v %v", res, err)
	}
}

// An output over the bound is refused, without the output; an exit
// status that does not parse is answered failed, not left unanswered.
func TestBadOutput(t *testing.T) {
	dir, u := t.TempDir(), newUnits()
	h := &Host{Root: "/", Dir: filepath.Join(dir, "agent"), Units: u}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, agent.MaxStdout+1), 0o600); err != nil {
		t.Fatal(err)
	}
	r := request(t, nodescript.ReadFile.Command(big), "", time.Minute)
	if res := wait(t, h, r); res.Err() == nil || !strings.Contains(res.Err().Error(), "output over agent mode's") || res.Stdout != nil {
		t.Errorf("a large output: %v (%d bytes kept)", res.Err(), len(res.Stdout))
	}
	if err := os.WriteFile(h.local(r.Name, "rc"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if res, err := h.result(r); err != nil || res == nil || !strings.Contains(res.Failed, `exit status "garbage"`) {
		t.Errorf("rc garbage: %+v %v", res, err)
	}
}

// A request name whose directory holds another command is refused (a
// request name used twice), and a forgotten request is never started;
// Sweep removes ended steps of requests no longer asked.
func TestSameNameForgetAndSweep(t *testing.T) {
	dir, u := t.TempDir(), newUnits()
	h := &Host{Root: "/", Dir: dir, Units: u}
	r := request(t, nodescript.Exists.Command("/"), "", time.Minute)
	wait(t, h, r)
	other := request(t, nodescript.Exists.Command("/etc"), "", time.Minute) // same run, node and seq: same name
	if err := os.Remove(h.local(r.Name, "rc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(h.local(r.Name, "began")); err != nil {
		t.Fatal(err)
	}
	h2 := &Host{Root: "/", Dir: dir, Units: u}
	if res, err := h2.Run(context.Background(), other); err != nil || res == nil || !strings.Contains(res.Failed, "a request name used twice") {
		t.Errorf("another command under the same name: %+v %v, want it answered failed (not tried again)", res, err)
	}

	gone := request(t, nodescript.Exists.Command("/tmp"), "", time.Minute)
	gone.Name += "0"
	h.Forget(gone.Name)
	if res, err := h.Run(context.Background(), gone); res != nil || err != nil || first(u.counts(UnitName(gone.Name))) != 0 {
		t.Errorf("a forgotten request: %+v %v, %d starts", res, err, first(u.counts(UnitName(gone.Name))))
	}
	// A step whose unit still runs keeps its directory until it ended.
	running := request(t, nodescript.Exists.Command("/run"), "", time.Minute)
	running.Name += "1"
	if err := h.prepare(running); err != nil {
		t.Fatal(err)
	}
	u.set(UnitName(running.Name), true)
	if err := h.Sweep(context.Background(), func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 1 || left[0].Name() != running.Name {
		t.Errorf("after the sweep: %v, want only the running step's directory", left)
	}
	u.set(UnitName(running.Name), false)
	if err := h.Sweep(context.Background(), func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("%d step directories left after its unit ended", len(left))
	}
}

func first(a, _ int) int  { return a }
func second(_, b int) int { return b }
