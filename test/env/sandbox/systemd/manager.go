package systemd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Manager runs a node's services: the stand-in for PID 1 and systemd.
// Processes are started in their own process group and stopped by pid
// (SIGTERM, then SIGKILL after the unit's TimeoutStopSec).
type Manager struct {
	// UnitDir, WantsDir, LogDir and PidDir default to the constants of
	// this package. PidDir holds NAME.pid for every running service, so
	// that whoever tears the node down can kill by pid what is left.
	UnitDir, WantsDir, LogDir, PidDir string
	// Log reports what goes wrong at boot (a unit that cannot be read or
	// started); nil discards it.
	Log func(format string, args ...any)

	mu       sync.Mutex
	services map[string]*service
	// jobs are the --no-block jobs under way: Boot waits for them before
	// its last stops, so that none starts a service after them.
	jobs sync.WaitGroup
}

type service struct {
	unit       *Unit
	want       bool // the operator wants it running (start, not stop)
	state      string
	result     string // why it last stopped
	cmd        *exec.Cmd
	since      time.Time
	restarts   int
	exited     chan struct{}
	generation int
	// transient: started by systemd-run, from no unit file; collect: it
	// is forgotten once it ends (--collect).
	transient, collect bool
}

// NewManager returns a manager over the default directories.
func NewManager() *Manager {
	return &Manager{UnitDir: UnitDir, WantsDir: WantsDir, LogDir: LogDir, PidDir: PidDir, services: map[string]*service{}}
}

// Boot starts every enabled unit (in After= order), serves systemctl on
// socket until ctx ends, then stops every service, last started first.
func (m *Manager) Boot(ctx context.Context, socket string) error {
	for _, d := range []string{m.LogDir, m.PidDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	_ = os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("systemd: listen %s: %w", socket, err)
	}
	defer l.Close()
	units := map[string]*Unit{}
	enabled := m.enabled()
	for _, n := range enabled {
		u, err := ParseUnit(filepath.Join(m.UnitDir, n))
		if err != nil {
			m.logf("%v", err)
			continue
		}
		units[n] = u
	}
	order := bootOrder(units, enabled)
	for _, n := range order {
		if _, err := m.Do(ctx, []string{"start", n}); err != nil {
			m.logf("start %s: %v", n, err)
		}
	}
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			break
		}
		go m.serve(ctx, c)
	}
	m.jobs.Wait()
	for i := len(order) - 1; i >= 0; i-- {
		m.stop(order[i])
	}
	m.mu.Lock()
	var rest []string
	for n := range m.services {
		rest = append(rest, n)
	}
	m.mu.Unlock()
	for _, n := range rest {
		m.stop(n)
	}
	return nil
}

func (m *Manager) logf(format string, args ...any) {
	if m.Log != nil {
		m.Log(format, args...)
	}
}

// request and response are systemctl's messages on the socket.
type request struct {
	Args []string `json:"args"`
}

type response struct {
	Code   int    `json:"code"`
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
}

func (m *Manager) serve(ctx context.Context, c net.Conn) {
	defer c.Close()
	var req request
	if err := json.NewDecoder(c).Decode(&req); err != nil {
		return
	}
	out, err := m.Do(ctx, req.Args)
	resp := response{Stdout: out}
	if err != nil {
		resp.Code, resp.Stderr = 1, err.Error()+"\n"
		var ce codeError
		if errors.As(err, &ce) {
			resp.Code, resp.Stderr = ce.code, ce.msg
		}
	}
	_ = json.NewEncoder(c).Encode(resp)
}

// codeError is a result with a specific exit code (is-active answers 3).
type codeError struct {
	code int
	msg  string
}

func (e codeError) Error() string { return fmt.Sprintf("exit %d: %s", e.code, e.msg) }

// Do runs one systemctl command line and returns what it prints.
func (m *Manager) Do(ctx context.Context, args []string) (string, error) {
	var flags, words []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case (a == "-p" || a == "--property") && i+1 < len(args):
			flags = append(flags, "-p"+args[i+1]) // -p VALUE takes the next word
			i++
		case a == "--unit" && i+1 < len(args):
			flags = append(flags, "--unit="+args[i+1])
			i++
		case a == "--" && len(words) > 0 && words[0] == "run":
			words = append(words, args[i+1:]...) // systemd-run's command, as it is
			i = len(args)
		case strings.HasPrefix(a, "-"):
			flags = append(flags, a)
		default:
			words = append(words, a)
		}
	}
	if len(words) == 0 {
		return "", errors.New("usage: systemctl COMMAND [UNIT...]")
	}
	verb, names := words[0], words[1:]
	if verb == "run" {
		return "", m.run(flags, names)
	}
	for i := range names {
		names[i] = Normalize(names[i])
	}
	has := func(f string) bool {
		for _, x := range flags {
			if x == f {
				return true
			}
		}
		return false
	}
	var out strings.Builder
	var errs []error
	switch verb {
	case "daemon-reload":
		m.mu.Lock()
		for _, s := range m.services {
			if u, err := ParseUnit(filepath.Join(m.UnitDir, s.unit.Name)); err == nil {
				s.unit = u
			}
		}
		m.mu.Unlock()
	case "start", "restart":
		job := func() error {
			var errs []error
			for _, n := range names {
				if verb == "restart" {
					m.stop(n)
				}
				if err := m.start(n); err != nil {
					errs = append(errs, fmt.Errorf("Job for %s failed: %w", n, err))
				}
			}
			return errors.Join(errs...)
		}
		if has("--no-block") { // the job is queued; systemctl does not wait for it
			m.jobs.Add(1)
			go func() {
				defer m.jobs.Done()
				_ = job()
			}()
		} else if err := job(); err != nil {
			errs = append(errs, err)
		}
	case "stop":
		for _, n := range names {
			m.stop(n)
		}
	case "enable", "disable":
		for _, n := range names {
			link := filepath.Join(m.WantsDir, n)
			if verb == "enable" {
				if _, err := os.Stat(filepath.Join(m.UnitDir, n)); err != nil {
					errs = append(errs, fmt.Errorf("Unit file %s does not exist.", n))
					continue
				}
				_ = os.MkdirAll(m.WantsDir, 0o755)
				if _, err := os.Lstat(link); err != nil {
					if err := os.Symlink(filepath.Join(m.UnitDir, n), link); err != nil {
						errs = append(errs, err)
					}
					fmt.Fprintf(&out, "Created symlink %s → %s.\n", link, filepath.Join(m.UnitDir, n))
				}
				if has("--now") {
					if err := m.start(n); err != nil {
						errs = append(errs, err)
					}
				}
			} else {
				if err := os.Remove(link); err == nil {
					fmt.Fprintf(&out, "Removed %s.\n", link)
				}
				if has("--now") {
					m.stop(n)
				}
			}
		}
	case "is-active":
		code := 0
		for _, n := range names {
			st := m.state(n)
			fmt.Fprintln(&out, st)
			if st != "active" {
				code = 3
			}
		}
		if code != 0 {
			return out.String(), codeError{code, ""}
		}
	case "is-enabled":
		code := 0
		for _, n := range names {
			if _, err := os.Lstat(filepath.Join(m.WantsDir, n)); err == nil {
				fmt.Fprintln(&out, "enabled")
			} else {
				fmt.Fprintln(&out, "disabled")
				code = 1
			}
		}
		if code != 0 {
			return out.String(), codeError{code, ""}
		}
	case "status":
		code := 0
		for _, n := range names {
			st, err := m.status(n)
			if err != nil {
				return out.String(), codeError{4, fmt.Sprintf("Unit %s could not be found.\n", n)}
			}
			out.WriteString(st)
			if m.state(n) != "active" {
				code = 3
			}
		}
		if code != 0 {
			return out.String(), codeError{code, ""}
		}
	case "show":
		for _, n := range names {
			out.WriteString(m.show(n, flags))
		}
	case "list-units":
		m.mu.Lock()
		var all []string
		for n := range m.services {
			all = append(all, n)
		}
		m.mu.Unlock()
		sort.Strings(all)
		for _, n := range all {
			fmt.Fprintf(&out, "%-28s loaded %-8s\n", n, m.state(n))
		}
	default:
		return "", fmt.Errorf("Unknown command verb %s.", verb)
	}
	return out.String(), errors.Join(errs...)
}

func (m *Manager) get(name string) (*service, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.services[name]; s != nil {
		return s, nil
	}
	u, err := ParseUnit(filepath.Join(m.UnitDir, name))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("Unit %s not found.", name)
		}
		return nil, err
	}
	s := &service{unit: u, state: "inactive"}
	m.services[name] = s
	return s, nil
}

func (m *Manager) state(name string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.services[name]; s != nil {
		return s.state
	}
	return "inactive"
}

func (m *Manager) status(name string) (string, error) {
	s, err := m.get(name)
	if err != nil {
		return "", err
	}
	m.mu.Lock()
	var b strings.Builder
	fmt.Fprintf(&b, "● %s - %s\n", name, s.unit.Description)
	fmt.Fprintf(&b, "     Loaded: loaded (%s)\n", filepath.Join(m.UnitDir, name))
	switch s.state {
	case "active":
		fmt.Fprintf(&b, "     Active: active (running) since %s\n   Main PID: %d\n", s.since.Format(time.RFC1123), s.cmd.Process.Pid)
	default:
		fmt.Fprintf(&b, "     Active: %s (%s)\n", s.state, s.result)
	}
	m.mu.Unlock()
	data, _ := os.ReadFile(filepath.Join(m.LogDir, strings.TrimSuffix(name, ".service")+".log"))
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	b.WriteString("\n" + strings.Join(lines, "\n") + "\n")
	return b.String(), nil
}

// show prints systemd properties (MainPID, ActiveState, NRestarts,
// ActiveEnterTimestampMonotonic is not kept); -p/--property selects,
// --value prints the values alone.
func (m *Manager) show(name string, flags []string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	props := map[string]string{"Id": name, "ActiveState": "inactive", "MainPID": "0", "NRestarts": "0"}
	if s := m.services[name]; s != nil {
		props["ActiveState"] = s.state
		props["NRestarts"] = fmt.Sprint(s.restarts)
		if s.state == "active" {
			props["MainPID"] = fmt.Sprint(s.cmd.Process.Pid)
			props["ActiveEnterTimestamp"] = s.since.Format(time.RFC1123)
		}
	}
	var want []string
	for _, f := range flags {
		for _, p := range []string{"--property=", "-p"} {
			if strings.HasPrefix(f, p) && len(f) > len(p) {
				want = append(want, strings.Split(f[len(p):], ",")...)
			}
		}
	}
	if len(want) == 0 {
		for k := range props {
			want = append(want, k)
		}
		sort.Strings(want)
	}
	value := slices.Contains(flags, "--value") // values alone, as systemctl show --value
	var b strings.Builder
	for _, k := range want {
		if value {
			fmt.Fprintln(&b, props[k])
			continue
		}
		fmt.Fprintf(&b, "%s=%s\n", k, props[k])
	}
	return b.String()
}

func (m *Manager) enabled() []string {
	entries, _ := os.ReadDir(m.WantsDir)
	var out []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".service") {
			out = append(out, e.Name())
		}
	}
	return out
}

// Systemctl is the client: it sends args to the manager on socket and
// returns what the manager printed and the exit code.
func Systemctl(socket string, args []string) (stdout, stderr string, code int) {
	c, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		return "", "System has not been booted with the kubelift sandbox's systemd (" + err.Error() + ")\n", 1
	}
	defer c.Close()
	if err := json.NewEncoder(c).Encode(request{Args: args}); err != nil {
		return "", err.Error() + "\n", 1
	}
	var resp response
	if err := json.NewDecoder(c).Decode(&resp); err != nil {
		return "", "no answer from the service manager: " + err.Error() + "\n", 1
	}
	return resp.Stdout, resp.Stderr, resp.Code
}
