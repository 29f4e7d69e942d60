package systemd

import (
	"fmt"
	"strings"
	"time"
)

// run starts a transient service, as systemd-run does (the verb its
// client sends): --unit NAME, --collect (the unit is forgotten once it
// ends: show says inactive), --no-block and --quiet (it never waits for
// more than the start), --property KillMode=... ("-p" as systemctl's),
// then "--" and the command, run as it is (no word may hold a "$"). A
// name in use by a unit that is loaded is refused in systemd's words.
func (m *Manager) run(flags, words []string) error {
	name, collect := "", false
	u := &Unit{KillMode: "control-group", Restart: "no", RestartSec: 100 * time.Millisecond, TimeoutStopSec: 10 * time.Second}
	for _, f := range flags {
		switch {
		case strings.HasPrefix(f, "--unit="):
			name = Normalize(strings.TrimPrefix(f, "--unit="))
		case f == "--collect" || f == "-G":
			collect = true
		case f == "--no-block" || f == "--quiet" || f == "-q":
		case strings.HasPrefix(f, "-pKillMode="):
			u.KillMode = strings.TrimPrefix(f, "-pKillMode=")
		case strings.HasPrefix(f, "-p"):
		default:
			return fmt.Errorf("systemd-run: unknown option %s (the sandbox's stand-in)", f)
		}
	}
	if name == "" || len(words) == 0 {
		return fmt.Errorf("usage: systemd-run --unit NAME [--collect] [--no-block] [--quiet] [--property P=V] -- COMMAND...")
	}
	for _, w := range words {
		// systemd expands ${VAR} in a transient unit's words (and a word
		// that is $VAR), by version and option: a command that has any
		// "$" means one thing here and maybe another on a host.
		if strings.Contains(w, "$") {
			return fmt.Errorf("systemd-run: %q: a word with $, which systemd may expand (the sandbox's stand-in refuses it)", w)
		}
	}
	u.Name, u.ExecStart, u.Description = name, words, "[systemd-run] "+strings.Join(words, " ")
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.services[name]; s != nil && (s.state == "active" || s.state == "activating" || !s.transient) {
		return codeError{1, fmt.Sprintf("Failed to start transient service unit: Unit %s was already loaded or has a fragment file.\n", name)}
	}
	s := &service{unit: u, want: true, state: "inactive", transient: true, collect: collect}
	m.services[name] = s
	return m.spawn(name, s)
}
