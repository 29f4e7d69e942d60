package inplace

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/pkg/hashskip"
)

// checkpointFiles are the kubelet's node-local state files that a newer
// kubelet may rewrite in a form an older one cannot read
// (kubernetes#86676, #127653): backed up with the binary, restored on
// rollback.
var checkpointFiles = []string{"cpu_manager_state", "memory_manager_state", "dra_manager_state"}

// nodeOps are the swaps on one node, each one shell command over SSH,
// each safe to run again.
type nodeOps struct {
	n         nodeaccess.Node
	name      string
	stageDir  string
	backupDir string
	from, to  string // versions
	facts     *nodefacts.Facts
	// dry, in a dry run, is told each script that would change the node
	// instead of it being run (scripts that only read still run).
	dry func(node, command string)
	// restarted is told how long each unit restart of a swap took.
	restarted func(time.Duration)
}

// run runs one node script with its arguments, bounded by defaultTimeout.
func (o *nodeOps) run(ctx context.Context, step string, sc nodescript.Script, args ...string) (string, error) {
	if o.dry != nil && !sc.ReadOnly {
		o.dry(o.name, sc.Show(args...))
		return "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, defaultTimeout)
	defer cancel()
	out, err := o.n.Run(ctx, sc.Command(args...), nil)
	if err != nil {
		return string(out), fmt.Errorf("node %s: %s: %w", o.name, step, err)
	}
	return string(out), nil
}

// exists says whether the file or directory p exists on the node.
func (o *nodeOps) exists(ctx context.Context, p string) (bool, error) {
	out, err := o.run(ctx, "look for "+p, nodescript.Exists, p)
	if err != nil {
		return false, err
	}
	switch strings.TrimSpace(out) {
	case "yes":
		return true, nil
	case "no":
		return false, nil
	}
	return false, fmt.Errorf("node %s: exists %s: unexpected answer %.40q", o.name, p, out)
}

// binary is where the unit of comp runs its program from (a path the
// facts checked).
func (o *nodeOps) binary(comp string) string {
	if p := o.facts.Programs[comp]; p != "" {
		return p
	}
	return "/usr/local/bin/" + comp
}

func (o *nodeOps) kubeletRoot() string {
	if r := o.facts.Values["kubelet --root-dir"]; r != "" {
		return r
	}
	return "/var/lib/kubelet"
}

// backupDirOf is BACKUP/FROM.
func (o *nodeOps) backupDirOf() string { return path.Join(o.backupDir, o.from) }

// backup copies comp's binary (and, for the kubelet, its checkpoint
// files) to BACKUP/FROM once; a binary that already runs another version
// than FROM is not taken for the old one.
func (o *nodeOps) backup(ctx context.Context, comp string) error {
	args := []string{o.backupDirOf(), comp, o.binary(comp), o.from}
	if comp == "kubelet" {
		args = append(append(append(args, o.kubeletRoot()), checkpointFiles...), path.Base(hashskip.DefaultPath))
	}
	_, err := o.run(ctx, "back up "+comp, nodescript.Backup, args...)
	return err
}

// swap puts the staged binary in place of comp's by rename (atomic) after
// checking its sha256 once more, and restarts the unit.
func (o *nodeOps) swap(ctx context.Context, comp, sha256 string) error {
	began := time.Now()
	out, err := o.run(ctx, "swap "+comp, nodescript.Swap, release.StagePath(o.stageDir, o.to, comp), sha256, o.binary(comp), comp)
	if err == nil && o.restarted != nil {
		o.restarted(restartTime(out, time.Since(began)))
	}
	return err
}

// restartTime reads the "### restart BEGAN ENDED" line swap prints (the
// node's uptime around its systemctl restart): how long the unit took to
// stop and start. What does not parse, or does not fit in the call's own
// time, counts as nothing: it is a figure for the report, never a
// decision.
func restartTime(out string, call time.Duration) time.Duration {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 4 || f[0] != "###" || f[1] != "restart" {
			continue
		}
		b, err1 := strconv.ParseFloat(f[2], 64)
		e, err2 := strconv.ParseFloat(f[3], 64)
		if err1 != nil || err2 != nil || !(e-b >= 0 && e-b <= call.Seconds()) { // NaN fails too
			return 0
		}
		return time.Duration((e - b) * float64(time.Second))
	}
	return 0
}

// restore puts the backed-up binary (and checkpoint files) back, removes
// a hash-skip file, and restarts the unit.
func (o *nodeOps) restore(ctx context.Context, comp string) error {
	args := []string{o.backupDirOf(), o.binary(comp), comp}
	if comp == "kubelet" {
		args = append(append(append(args, o.kubeletRoot(), path.Base(hashskip.DefaultPath)), checkpointFiles...), path.Base(hashskip.DefaultPath))
	}
	_, err := o.run(ctx, "restore "+comp, nodescript.Restore, args...)
	return err
}

// writeHashSkip writes the hash-skip file the upgraded kubelet reads,
// atomically: the old kubelet's version and hash era (oldEra).
func (o *nodeOps) writeHashSkip(ctx context.Context, oldEra string, now time.Time) error {
	data, err := json.Marshal(hashskip.File{SchemaVersion: hashskip.SchemaVersion, OldKubeletVersion: o.from, OldHashEra: oldEra, NewKubeletVersion: o.to, UpgradedAt: now.UTC()})
	if err != nil {
		return err
	}
	_, err = o.run(ctx, "write the hash-skip file", nodescript.WriteFile, path.Join(o.kubeletRoot(), path.Base(hashskip.DefaultPath)), string(data))
	return err
}

// running reports the version comp's unit runs now ("" when not
// running); a version that does not parse is an error naming it.
func (o *nodeOps) running(ctx context.Context, comp string) (string, error) {
	v, _, err := o.process(ctx, comp)
	return v, err
}

// process reports the version comp's running process runs and its pid
// ("" and 0 when the unit does not run, or restarted while read); what
// does not parse is an error naming node, field and value.
func (o *nodeOps) process(ctx context.Context, comp string) (string, int, error) {
	out, err := o.run(ctx, "read "+comp+"'s version", nodescript.Running, comp)
	if err != nil {
		return "", 0, err
	}
	out = strings.TrimSpace(out)
	if out == "" {
		return "", 0, nil
	}
	line, pidLine, _ := strings.Cut(out, "\n")
	v, bad := nodefacts.ParseVersionLine(o.name, comp+" --version", strings.TrimSpace(line))
	if bad != nil {
		return "", 0, bad
	}
	pid, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(pidLine), "pid "))
	if err != nil || pid <= 0 || !strings.HasPrefix(strings.TrimSpace(pidLine), "pid ") {
		return "", 0, fmt.Errorf("node %s: %s's main process: %q is not \"pid N\"", o.name, comp, pidLine)
	}
	return v.String(), pid, nil
}

// start starts comp's unit where it does not run.
func (o *nodeOps) start(ctx context.Context, comp string) error {
	_, err := o.run(ctx, "start "+comp, nodescript.Start, comp)
	return err
}

// installed reports the version of the program comp's unit starts
// ("" when there is none): for a unit that does not run, what it would
// run; a version that does not parse is an error naming it.
func (o *nodeOps) installed(ctx context.Context, comp string) (string, error) {
	out, err := o.run(ctx, "read "+comp+"'s program version", nodescript.Installed, o.binary(comp))
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(out) == "" {
		return "", nil
	}
	v, bad := nodefacts.ParseVersionLine(o.name, o.binary(comp)+" --version", strings.TrimSpace(out))
	if bad != nil {
		return "", bad
	}
	return v.String(), nil
}

// container is one running container as the runtime reports it: what it
// is (namespace/pod/name) and, where containerd's tasks were read, its
// process (0 when unknown).
type container struct {
	what string // ns/pod/container
	pid  int
}

// pod is the container's pod, ns/name.
func (c container) pod() string {
	if i := strings.LastIndexByte(c.what, '/'); i > 0 {
		return c.what[:i]
	}
	return c.what
}

// tasksMarker separates crictl's JSON from containerd's tasks in the
// containers script's output.
const tasksMarker = "\n### tasks\n"

// containers lists the runtime's running containers (crictl ps) and,
// where containerd's tasks can be read, each one's process.
func (o *nodeOps) containers(ctx context.Context) (map[string]container, error) {
	raw, err := o.run(ctx, "crictl ps", nodescript.Containers)
	if err != nil {
		return nil, err
	}
	ps, tasks, _ := strings.Cut(raw, tasksMarker)
	cs, err := kubeletcompat.ParseCrictl([]byte(ps))
	if err != nil {
		return nil, fmt.Errorf("node %s: crictl ps: %w", o.name, err)
	}
	pids, err := kubeletcompat.ParseTasks([]byte(tasks))
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", o.name, err)
	}
	out := map[string]container{}
	for _, c := range cs {
		if c.Running {
			out[c.ID] = container{what: c.Namespace + "/" + c.Pod + "/" + c.Name, pid: pids[c.ID]}
		}
	}
	return out, nil
}
