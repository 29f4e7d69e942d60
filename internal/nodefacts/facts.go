// Package nodefacts reads what a node says of itself over SSH (the
// versions its units run, their programs and flags, what is staged, free
// space, its containers), in one node script, and parses every value
// where it enters: a value that does not parse is refused, named by node,
// field and value, and never reaches a node script.
package nodefacts

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/pkg/hashskip"
)

// Runner runs a shell command on a node (nodeaccess.Node does).
type Runner interface {
	Run(ctx context.Context, cmd string, stdin io.Reader) ([]byte, error)
}

// Facts is what a node says of itself over SSH, read in one command.
type Facts struct {
	Name string `json:"name"`
	// Components maps each program the node runs as a unit (kubelet and
	// the catalog's server components) to the version of its running
	// binary (/proc/PID/exe --version): what runs, not what is installed.
	Components map[string]string `json:"components"`
	// Flags maps each component to the flags it is started with: its
	// running command line, its unit's ExecStart lines (drop-ins
	// included) and the EnvironmentFiles they read, so a flag written
	// there but not yet in effect counts too. FlagSources says where.
	Flags       map[string][]string `json:"-"`
	FlagSources map[string]string   `json:"-"`
	// Values maps "COMPONENT --flag" to its value, the running command
	// line's first.
	Values map[string]string `json:"-"`
	// Programs maps each component to its program's path: the running
	// command line's first word, or, for a unit that does not run, its
	// ExecStart's.
	Programs map[string]string `json:"-"`
	// Units maps each component with a unit file on the node to that
	// file, whether it runs or not.
	Units map[string]string `json:"-"`
	// Etcd is the version of the etcd member the node runs as a unit
	// ("" when none runs): not among Components, which are Kubernetes'.
	// Its program, flags and unit are in Programs, Values and Units
	// under "etcd".
	Etcd string `json:"etcd,omitempty"`
	// EtcdUnread says why the member's version was not taken (quoting
	// what the node said): not among Bad, since only an etcd move needs it.
	EtcdUnread string `json:"etcdUnread,omitempty"`
	// Staged maps the files of StageDir/VERSION to their sha256.
	Staged map[string]string `json:"staged,omitempty"`
	// FreeBytes is free space on the file system of the stage directory.
	FreeBytes int64 `json:"freeBytes"`
	// Containers are the runtime's containers (crictl ps -o json);
	// ContainersErr says why they could not be read.
	Containers    []kubeletcompat.RuntimeContainer `json:"-"`
	ContainersErr string                           `json:"containersError,omitempty"`
	// Cgroup is the node's cgroup version: 1, 2, or 0 when not read.
	Cgroup int `json:"cgroup,omitempty"`
	// FailCgroupV1 is what the running kubelet is told of failCgroupV1,
	// by --fail-cgroupv1 or its configuration file: nil when neither
	// says (the kubelet's default then applies: true from 1.35).
	FailCgroupV1 *bool `json:"failCgroupV1,omitempty"`
	// FailCgroupV1Source says where FailCgroupV1 was read: the flag or
	// the configuration file.
	FailCgroupV1Source string `json:"-"`
	// KubeletCgroupDriver is the cgroup driver the running kubelet is
	// told, by --cgroup-driver or its configuration file's cgroupDriver:
	// "" when neither says (the kubelet's default, cgroupfs).
	KubeletCgroupDriver string `json:"kubeletCgroupDriver,omitempty"`
	// KubeletCgroupDriverSource says where KubeletCgroupDriver was read.
	KubeletCgroupDriverSource string `json:"-"`
	// CRI is what the container runtime says of itself over CRI (crictl
	// version and runtime-config): nil when it could not be asked, and
	// CRIErr says why.
	CRI    *CRI   `json:"cri,omitempty"`
	CRIErr string `json:"criError,omitempty"`
	// Containerd is where the node's containerd and runc run from, each
	// path checked as it was read; empty where not read.
	Containerd ContainerdPaths `json:"containerd,omitzero"`
	// HashSkipEra is the hash era (OldHashEra) of the hash-skip file an
	// earlier upgrade left in the kubelet's root directory: containers
	// the kubelet before that one started may still run, kept by it; ""
	// when there is none.
	HashSkipEra string `json:"hashSkipEra,omitempty"`
	// HashSkipUnread says why such a file's era was not taken (a schema
	// or era kubelift does not know, quoting what the file says): not
	// among Bad, which refuses the whole node, since cleanup and rollback
	// must still reach it; plan warns.
	HashSkipUnread string `json:"hashSkipUnread,omitempty"`
	// Bad are the values read that did not parse: refused, each left
	// out of the fields above.
	Bad []BadValue `json:"refused,omitempty"`
}

// Components are the programs read on every node, kubelet first, then
// etcd (a binary cluster's member, read apart: Facts.Etcd).
func components() []string {
	return append(append([]string{"kubelet"}, catalog.ServerComponents...), Etcd)
}

// Etcd is the unit of a binary cluster's etcd member.
const Etcd = "etcd"

// scriptPaths are the flag values the engine hands to node scripts, each
// checked as it is read: a path or, for the etcd servers, URLs. (An etcd
// member's client URL is checked where an etcd move takes it:
// etcd.Members.)
var scriptPaths = []string{"kubelet --root-dir", "kube-apiserver --etcd-cafile", "kube-apiserver --etcd-certfile", "kube-apiserver --etcd-keyfile"}

// Read reads a node's facts in one command.
func Read(ctx context.Context, r Runner, node, stageDir, version string) (*Facts, error) {
	out, err := r.Run(ctx, nodescript.Facts.Command(append([]string{path.Join(stageDir, version), stageDir}, components()...)...), nil)
	if err != nil {
		return nil, fmt.Errorf("read node %s: %w", node, err)
	}
	f := &Facts{Name: node, Components: map[string]string{}, Flags: map[string][]string{}, FlagSources: map[string]string{}, Values: map[string]string{},
		Programs: map[string]string{}, Units: map[string]string{}, Staged: map[string]string{}}
	sections := splitSections(string(out))
	cmdline := map[string][]string{}
	units := map[string]string{}
	for _, s := range sections {
		fields := strings.Fields(s.head)
		switch {
		case len(fields) == 2 && fields[0] == "version" && fields[1] == Etcd:
			// Not among Bad, which refuses the whole node: etcd's version
			// matters only where the bundle carries etcd, and the etcd step
			// refuses then (etcd.Members).
			v, bad := ParseEtcdVersion(node, s.body)
			if bad != nil {
				f.EtcdUnread = fmt.Sprintf("%s %q: %s", bad.Field, bad.Value, bad.Reason)
				break
			}
			f.Etcd = v.String()
		case len(fields) == 2 && fields[0] == "version":
			v, bad := ParseVersionLine(node, fields[1]+" --version", strings.TrimSpace(s.body))
			if bad != nil {
				f.Bad = append(f.Bad, *bad)
				break
			}
			f.Components[fields[1]] = v.String()
		case len(fields) == 2 && fields[0] == "cmdline":
			if strings.TrimSpace(s.body) == "" {
				// Read a moment after an exec, before the kernel filled
				// it: nothing to judge; the unit's ExecStart names the
				// program.
				break
			}
			args := strings.Split(strings.TrimSpace(s.body), "\n")
			if len(args) > 0 {
				if bad := CheckPath(node, fields[1]+" program (/proc/PID/cmdline)", args[0]); bad != nil {
					f.Bad = append(f.Bad, *bad)
				} else {
					f.Programs[fields[1]] = args[0]
				}
				args = args[1:]
			}
			// What runs now: its values count, but what the next start
			// uses is the unit's (below); without a unit, this is all.
			cmdline[fields[1]] = args
			f.addValues(fields[1], args)
		case len(fields) == 3 && fields[0] == "unit":
			if _, ok := f.Units[fields[1]]; !ok {
				f.Units[fields[1]] = fields[2]
			}
			// The first unit file found is the one systemd reads (/etc
			// before /run before /lib); its drop-ins follow it.
			if _, seen := units[fields[1]]; !seen || strings.HasSuffix(fields[2], ".conf") {
				units[fields[1]] += s.body + "\n"
			}
			f.AddFlags(fields[1], fields[2], unitExecArgs(s.body))
		case len(fields) == 3 && fields[0] == "env":
			f.AddFlags(fields[1], fields[2], envArgs(s.body))
		case s.head == "staged":
			for _, line := range strings.Split(s.body, "\n") {
				if sum, name, ok := strings.Cut(strings.TrimSpace(line), "  "); ok {
					f.Staged[name] = sum
				}
			}
		case s.head == "df":
			if cols := strings.Fields(s.body); len(cols) >= 4 {
				if kb, err := strconv.ParseInt(cols[3], 10, 64); err == nil {
					f.FreeBytes = kb << 10
				}
			}
		case s.head == "kubelet-config":
			for _, line := range strings.Split(s.body, "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "failCgroupV1:"); ok {
					f.setFailCgroupV1("failCgroupV1 (kubelet configuration file)", v)
				}
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cgroupDriver:"); ok {
					f.setCgroupDriver("cgroupDriver (kubelet configuration file)", v)
				}
			}
		case s.head == "containerd":
			f.Bad = append(f.Bad, f.Containerd.parse(node, s.body)...)
		case s.head == "cri-info":
			f.Containerd.setCNI(node, s.body, sectionsHave(sections, "cri-info-failed"))
		case s.head == "cri-version":
			if sectionsHave(sections, "cri-version-failed") {
				f.CRIErr = "crictl version: " + strings.TrimSpace(lastLines(s.body, 3))
				break
			}
			cri, bad := ParseCRIVersion(node, s.body)
			if bad != nil {
				f.Bad = append(f.Bad, *bad)
				break
			}
			f.CRI = cri
		case s.head == "cri-config" && f.CRI != nil:
			// After cri-version (the script's order): the runtime's answer
			// to RuntimeConfig, or why there is none.
			if bad := f.CRI.setConfig(node, s.body, sectionsHave(sections, "cri-config-failed")); bad != nil {
				f.Bad = append(f.Bad, *bad)
			}
		case s.head == "hash-skip":
			schema, era, _ := strings.Cut(strings.TrimSpace(s.body), " ")
			switch {
			case schema != strconv.Itoa(hashskip.SchemaVersion):
				f.HashSkipUnread = fmt.Sprintf("schemaVersion %q, want %d", schema, hashskip.SchemaVersion)
			case era != hashskip.EraJSON && era != hashskip.EraJSONWithoutResources && era != hashskip.EraNameImage:
				f.HashSkipUnread = fmt.Sprintf("oldHashEra %q, want %s, %s or %s", era, hashskip.EraJSON, hashskip.EraJSONWithoutResources, hashskip.EraNameImage)
			default:
				f.HashSkipEra = era
			}
		case s.head == "cgroupfs":
			switch t := strings.TrimSpace(s.body); t {
			case "cgroup2fs":
				f.Cgroup = 2
			case "tmpfs":
				f.Cgroup = 1
			default:
				f.Bad = append(f.Bad, BadValue{Node: node, Field: "file system type of /sys/fs/cgroup", Value: t, Reason: "want cgroup2fs (cgroup v2) or tmpfs (cgroup v1)"})
			}
		case s.head == "crictl":
			if sectionsHave(sections, "crictl-failed") {
				f.ContainersErr = strings.TrimSpace(lastLines(s.body, 3))
				break
			}
			cs, err := kubeletcompat.ParseCrictl([]byte(s.body))
			if err != nil {
				f.ContainersErr = err.Error()
				break
			}
			// Agent mode's agents are the run's own, made again where
			// they go: no workload of the node's.
			f.Containers = slices.DeleteFunc(cs, func(c kubeletcompat.RuntimeContainer) bool { return c.Namespace == agent.Namespace })
		}
	}
	for _, c := range slices.Sorted(maps.Keys(units)) {
		if _, running := f.Programs[c]; running {
			continue
		}
		if p := unitProgram(units[c]); p != "" {
			if bad := CheckPath(node, c+" program (ExecStart of "+f.Units[c]+")", p); bad != nil {
				f.Bad = append(f.Bad, *bad)
			} else {
				f.Programs[c] = p
			}
		}
	}
	for c, args := range cmdline {
		if _, fromUnit := f.Flags[c]; !fromUnit {
			f.AddFlags(c, "running command line", args)
		}
	}
	for c := range f.Flags {
		sort.Strings(f.Flags[c])
	}
	// The flags override the file.
	if v, ok := f.Values["kubelet --cgroup-driver"]; ok {
		f.setCgroupDriver("kubelet --cgroup-driver", v)
	}
	if v, ok := f.Values["kubelet --fail-cgroupv1"]; ok {
		if v == "" {
			v = "true"
		}
		f.setFailCgroupV1("kubelet --fail-cgroupv1", v)
	}
	f.checkValues()
	return f, nil
}

// setFailCgroupV1 records a failCgroupV1 setting read from field (the
// flag, as strconv.ParseBool reads it, or the configuration file, as YAML
// 1.1 does), or refuses a value neither would take.
func (f *Facts) setFailCgroupV1(field, v string) {
	v, _, _ = strings.Cut(v, " #") // a YAML comment
	v = strings.Trim(strings.TrimSpace(v), `"'`)
	b, err := strconv.ParseBool(v)
	if err != nil && !strings.HasPrefix(field, "kubelet --") {
		switch strings.ToLower(v) {
		case "yes", "on", "y":
			b, err = true, nil
		case "no", "off", "n":
			b, err = false, nil
		}
	}
	if err != nil {
		f.Bad = append(f.Bad, BadValue{Node: f.Name, Field: field, Value: v, Reason: "want true or false"})
		return
	}
	f.FailCgroupV1, f.FailCgroupV1Source = &b, field
}

// setCgroupDriver records the kubelet's cgroup driver read from field,
// or refuses a value the kubelet would not take.
func (f *Facts) setCgroupDriver(field, v string) {
	v, _, _ = strings.Cut(v, " #") // a YAML comment
	v = strings.Trim(strings.TrimSpace(v), `"'`)
	if v != "systemd" && v != "cgroupfs" {
		f.Bad = append(f.Bad, BadValue{Node: f.Name, Field: field, Value: v, Reason: "want systemd or cgroupfs"})
		return
	}
	f.KubeletCgroupDriver, f.KubeletCgroupDriverSource = v, field
}

// checkValues refuses the flag values node scripts would be given that
// do not parse, so none of them reaches a script.
func (f *Facts) checkValues() {
	for _, k := range scriptPaths {
		if v, ok := f.Values[k]; ok && v != "" {
			if bad := CheckPath(f.Name, k, v); bad != nil {
				f.Bad = append(f.Bad, *bad)
				delete(f.Values, k)
			}
		}
	}
	const servers = "kube-apiserver --etcd-servers"
	if v := f.Values[servers]; v != "" {
		for _, e := range strings.Split(v, ",") {
			if bad := CheckEndpoint(f.Name, servers, e); bad != nil {
				f.Bad = append(f.Bad, *bad)
				delete(f.Values, servers)
				break
			}
		}
	}
}

type section struct{ head, body string }

func splitSections(out string) []section {
	var ss []section
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var body strings.Builder
	for sc.Scan() {
		line := sc.Text()
		if h, ok := strings.CutPrefix(line, "### "); ok {
			if len(ss) > 0 {
				ss[len(ss)-1].body = body.String()
			}
			body.Reset()
			ss = append(ss, section{head: h})
			continue
		}
		body.WriteString(line)
		body.WriteByte('\n')
	}
	if len(ss) > 0 {
		ss[len(ss)-1].body = body.String()
	}
	return ss
}

func sectionsHave(ss []section, head string) bool {
	for _, s := range ss {
		if s.head == head {
			return true
		}
	}
	return false
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
