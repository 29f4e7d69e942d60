// Package systemd is the sandbox's stand-in for systemd on a node: a small
// service manager (the node's init) that runs services from unit files in
// /etc/systemd/system, and the systemctl client that talks to it over a
// unix socket. It understands the subset of unit files that Kubernetes
// hosts use (ExecStart, Environment, EnvironmentFile, WorkingDirectory,
// Restart, RestartSec, RuntimeDirectory, After, WantedBy), so that
// "replace /usr/local/bin/kubelet, then systemctl restart kubelet" works
// as it does on a real host.
package systemd

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Defaults of the stand-in's paths (inside the node's mount namespace).
const (
	UnitDir  = "/etc/systemd/system"
	WantsDir = UnitDir + "/multi-user.target.wants"
	Socket   = "/run/kubelift-systemd.sock"
	LogDir   = "/var/log/units"
	PidDir   = "/run/kubelift-units"
)

// Unit is the part of a service unit file the stand-in acts on.
type Unit struct {
	Name             string // "kubelet.service"
	Description      string
	After            []string
	ExecStart        []string // argv, already split
	Environment      []string
	EnvironmentFiles []string // a leading "-" means optional
	WorkingDirectory string
	Restart          string // no, always, on-failure
	RestartSec       time.Duration
	RuntimeDirectory []string
	TimeoutStopSec   time.Duration
	// KillMode is control-group (the default: the main process's whole
	// process group, the stand-in's control group) or process (the main
	// process only, as containerd's unit asks so that its shims and
	// containers live on).
	KillMode string
}

// ParseUnit reads a unit file.
func ParseUnit(path string) (*Unit, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	u := &Unit{Name: filepath.Base(path), KillMode: "control-group", Restart: "no", RestartSec: 100 * time.Millisecond, TimeoutStopSec: 10 * time.Second}
	var section, pending string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if strings.HasSuffix(line, "\\") { // continuation
			pending += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		line, pending = pending+line, ""
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			section = strings.Trim(line, "[]")
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: not key=value: %q", path, lineNo, line)
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch section + "." + key {
		case "Unit.Description":
			u.Description = val
		case "Unit.After":
			u.After = append(u.After, strings.Fields(val)...)
		case "Service.ExecStart":
			argv, err := splitCommand(val)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: ExecStart: %w", path, lineNo, err)
			}
			u.ExecStart = argv
		case "Service.Environment":
			env, err := splitCommand(val)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: Environment: %w", path, lineNo, err)
			}
			u.Environment = append(u.Environment, env...)
		case "Service.EnvironmentFile":
			u.EnvironmentFiles = append(u.EnvironmentFiles, val)
		case "Service.WorkingDirectory":
			u.WorkingDirectory = val
		case "Service.Restart":
			u.Restart = val
		case "Service.RestartSec":
			d, err := parseSeconds(val)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: RestartSec: %w", path, lineNo, err)
			}
			u.RestartSec = d
		case "Service.TimeoutStopSec":
			d, err := parseSeconds(val)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: TimeoutStopSec: %w", path, lineNo, err)
			}
			u.TimeoutStopSec = d
		case "Service.KillMode":
			switch val {
			case "control-group", "process":
				u.KillMode = val
			default:
				return nil, fmt.Errorf("%s:%d: KillMode %q: the stand-in knows control-group and process", path, lineNo, val)
			}
		case "Service.RuntimeDirectory":
			u.RuntimeDirectory = append(u.RuntimeDirectory, strings.Fields(val)...)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(u.ExecStart) == 0 {
		return nil, fmt.Errorf("%s: no ExecStart", path)
	}
	return u, nil
}

func parseSeconds(v string) (time.Duration, error) {
	if d, err := time.ParseDuration(v); err == nil {
		return d, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, fmt.Errorf("not a duration: %q", v)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// splitCommand splits a command line as systemd does for the common cases:
// whitespace separates words, double and single quotes group them.
func splitCommand(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

// environment returns the unit's environment: EnvironmentFile entries, then
// Environment entries (later wins), over a minimal base.
func (u *Unit) environment() ([]string, error) {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}
	for _, ef := range u.EnvironmentFiles {
		optional := strings.HasPrefix(ef, "-")
		ef = strings.TrimPrefix(ef, "-")
		data, err := os.ReadFile(ef)
		if err != nil {
			if optional && os.IsNotExist(err) {
				continue
			}
			return nil, fmt.Errorf("EnvironmentFile: %w", err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || line[0] == '#' {
				continue
			}
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				continue
			}
			env = append(env, k+"="+strings.Trim(v, `"'`))
		}
	}
	return append(env, u.Environment...), nil
}

// expandArgs substitutes $VAR and ${VAR} from env in each argument, as
// systemd does for ExecStart; a lone $VAR argument that is empty vanishes
// and one with spaces splits into words (kubeadm's $KUBELET_KUBEADM_ARGS).
func expandArgs(argv, env []string) []string {
	vars := map[string]string{}
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		vars[k] = v
	}
	var out []string
	for i, a := range argv {
		if i > 0 && strings.HasPrefix(a, "$") && !strings.HasPrefix(a, "${") {
			out = append(out, strings.Fields(vars[a[1:]])...)
			continue
		}
		out = append(out, os.Expand(a, func(k string) string { return vars[k] }))
	}
	return out
}

// Normalize turns "kubelet" into "kubelet.service".
func Normalize(name string) string {
	if strings.Contains(name, ".") {
		return name
	}
	return name + ".service"
}

// bootOrder sorts enabled units so that each comes after those it names in
// After= (a unit missing from the set is ignored; cycles keep file order).
func bootOrder(units map[string]*Unit, enabled []string) []string {
	sort.Strings(enabled)
	in := map[string]bool{}
	for _, n := range enabled {
		in[n] = true
	}
	var out []string
	done := map[string]bool{}
	var visit func(n string, depth int)
	visit = func(n string, depth int) {
		if done[n] || depth > len(enabled) {
			return
		}
		if u := units[n]; u != nil {
			for _, a := range u.After {
				if in[a] {
					visit(a, depth+1)
				}
			}
		}
		if !done[n] {
			done[n] = true
			out = append(out, n)
		}
	}
	for _, n := range enabled {
		visit(n, 0)
	}
	return out
}
