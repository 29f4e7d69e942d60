// Package nodeops is what kubelift does on one node, each operation one
// constant node script over the node's access (SSH today), each safe to
// Run again: read what runs, back up, swap by rename and restart,
// Restore, write the hash-skip file, list the running containers.
package nodeops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/agent"
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

// Ops are the swaps on one node, each one shell command over SSH,
// each safe to run again.
type Ops struct {
	Node      nodeaccess.Node
	Name      string
	StageDir  string
	BackupDir string
	From, To  string // versions
	Facts     *nodefacts.Facts
	// dry, in a dry run, is told each script that would change the node
	// instead of it being run (scripts that only read still run).
	Dry func(node, command string)
	// Restarted is told, for each unit a swap restarted (the kubelet,
	// kube-proxy, containerd), how long its restart took.
	Restarted func(unit string, took time.Duration)
}

// Timeout bounds one command on a node.
const Timeout = 2 * time.Minute

// Run runs one node script with its arguments, bounded by Timeout.
func (o *Ops) Run(ctx context.Context, step string, sc nodescript.Script, args ...string) (string, error) {
	if o.Dry != nil && !sc.ReadOnly {
		o.Dry(o.Name, sc.Show(args...))
		return "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	out, err := o.Node.Run(ctx, sc.Command(args...), nil)
	if err != nil {
		return string(out), fmt.Errorf("node %s: %s: %w", o.Name, step, err)
	}
	return string(out), nil
}

// Exists says whether the file or directory p exists on the node.
func (o *Ops) Exists(ctx context.Context, p string) (bool, error) {
	out, err := o.Run(ctx, "look for "+p, nodescript.Exists, p)
	if err != nil {
		return false, err
	}
	switch strings.TrimSpace(out) {
	case "yes":
		return true, nil
	case "no":
		return false, nil
	}
	return false, fmt.Errorf("node %s: exists %s: unexpected answer %.40q", o.Name, p, out)
}

// Binary is where the unit of comp runs its program from (a path the
// facts checked).
func (o *Ops) Binary(comp string) string {
	if p := o.Facts.Programs[comp]; p != "" {
		return p
	}
	return "/usr/local/bin/" + comp
}

func (o *Ops) KubeletRoot() string {
	if r := o.Facts.Values["kubelet --root-dir"]; r != "" {
		return r
	}
	return "/var/lib/kubelet"
}

// BackupDirOf is BACKUP/FROM.
func (o *Ops) BackupDirOf() string { return path.Join(o.BackupDir, o.From) }

// Backup copies comp's binary (and, for the kubelet, its checkpoint
// files) to BACKUP/FROM once; a binary that already runs another version
// than FROM is not taken for the old one.
func (o *Ops) Backup(ctx context.Context, comp string) error {
	args := []string{o.BackupDirOf(), comp, o.Binary(comp), o.From}
	if comp == "kubelet" {
		args = append(append(append(args, o.KubeletRoot()), checkpointFiles...), path.Base(hashskip.DefaultPath))
	}
	_, err := o.Run(ctx, "back up "+comp, nodescript.Backup, args...)
	return err
}

// Swap puts the staged binary in place of comp's by rename (atomic) after
// checking its sha256 once more, and restarts the unit.
func (o *Ops) Swap(ctx context.Context, comp, sha256 string) error {
	began := time.Now()
	out, err := o.Run(ctx, "swap "+comp, nodescript.Swap, release.StagePath(o.StageDir, o.To, comp), sha256, o.Binary(comp), comp)
	if err == nil && o.Restarted != nil {
		o.Restarted(comp, restartTime(out, time.Since(began)))
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

// Restore puts the backed-up binary (and checkpoint files) back, removes
// a hash-skip file, and restarts the unit.
func (o *Ops) Restore(ctx context.Context, comp string) error {
	args := []string{o.BackupDirOf(), o.Binary(comp), comp}
	if comp == "kubelet" {
		args = append(append(append(args, o.KubeletRoot(), path.Base(hashskip.DefaultPath)), checkpointFiles...), path.Base(hashskip.DefaultPath))
	}
	_, err := o.Run(ctx, "restore "+comp, nodescript.Restore, args...)
	return err
}

// WriteHashSkip writes the hash-skip file the upgraded kubelet reads,
// atomically: the old kubelet's version and hash era (oldEra).
func (o *Ops) WriteHashSkip(ctx context.Context, oldEra string, now time.Time) error {
	data, err := json.Marshal(hashskip.File{SchemaVersion: hashskip.SchemaVersion, OldKubeletVersion: o.From, OldHashEra: oldEra, NewKubeletVersion: o.To, UpgradedAt: now.UTC()})
	if err != nil {
		return err
	}
	_, err = o.Run(ctx, "write the hash-skip file", nodescript.WriteFile, path.Join(o.KubeletRoot(), path.Base(hashskip.DefaultPath)), string(data))
	return err
}

// Running reports the version comp's unit runs now ("" when not
// Running); a version that does not parse is an error naming it.
func (o *Ops) Running(ctx context.Context, comp string) (string, error) {
	v, _, err := o.Process(ctx, comp)
	return v, err
}

// Process reports the version comp's running process runs and its pid
// ("" and 0 when the unit does not run, or restarted while read); what
// does not parse is an error naming node, field and value.
func (o *Ops) Process(ctx context.Context, comp string) (string, int, error) {
	out, err := o.Run(ctx, "read "+comp+"'s version", nodescript.Running, comp)
	if err != nil {
		return "", 0, err
	}
	out = strings.TrimSpace(out)
	if out == "" {
		return "", 0, nil
	}
	line, pidLine, _ := strings.Cut(out, "\n")
	v, bad := nodefacts.ParseVersionLine(o.Name, comp+" --version", strings.TrimSpace(line))
	if bad != nil {
		return "", 0, bad
	}
	pid, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(pidLine), "pid "))
	if err != nil || pid <= 0 || !strings.HasPrefix(strings.TrimSpace(pidLine), "pid ") {
		return "", 0, fmt.Errorf("node %s: %s's main process: %q is not \"pid N\"", o.Name, comp, pidLine)
	}
	return v.String(), pid, nil
}

// Start starts comp's unit where it does not run.
func (o *Ops) Start(ctx context.Context, comp string) error {
	_, err := o.Run(ctx, "start "+comp, nodescript.Start, comp)
	return err
}

// Installed reports the version of the program comp's unit starts
// ("" when there is none): for a unit that does not run, what it would
// Run; a version that does not parse is an error naming it.
func (o *Ops) Installed(ctx context.Context, comp string) (string, error) {
	out, err := o.Run(ctx, "read "+comp+"'s program version", nodescript.Installed, o.Binary(comp))
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(out) == "" {
		return "", nil
	}
	v, bad := nodefacts.ParseVersionLine(o.Name, o.Binary(comp)+" --version", strings.TrimSpace(out))
	if bad != nil {
		return "", bad
	}
	return v.String(), nil
}

// Container is one running container as the runtime reports it: what it
// is (namespace/pod/name) and, where containerd's tasks were read, its
// Process (0 when unknown).
type Container struct {
	What string // ns/pod/container
	PID  int
}

// Pod is the container's pod, ns/name.
func (c Container) Pod() string {
	if i := strings.LastIndexByte(c.What, '/'); i > 0 {
		return c.What[:i]
	}
	return c.What
}

// tasksMarker separates crictl's JSON from containerd's tasks in the
// Containers script's output.
const tasksMarker = "\n### tasks\n"

// runtimeRetries and runtimeRetryPause bound how long Containers waits
// for a runtime that does not answer (containerd restarting: its own
// swap, or an operator's restart in the middle of a node's step).
var (
	runtimeRetries    = 30
	runtimeRetryPause = time.Second
)

// runtimeUnavailable says crictl could not reach the runtime's socket.
func runtimeUnavailable(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "validate service connection") || strings.Contains(msg, "code = Unavailable") ||
		strings.Contains(msg, "connect: connection refused")
}

// ContainersWaiting is Containers, but a runtime that does not answer is
// asked again, every runtimeRetryPause, up to runtimeRetries times: a
// containerd restarting (an operator's restart in the middle of a
// node's kubelet step) is back within seconds. The runtime's own move
// waits for its socket itself, with Containers.
func (o *Ops) ContainersWaiting(ctx context.Context) (map[string]Container, error) {
	cs, err := o.Containers(ctx)
	for i := 0; err != nil && runtimeUnavailable(err) && i < runtimeRetries; i++ {
		select {
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		case <-time.After(runtimeRetryPause):
		}
		cs, err = o.Containers(ctx)
	}
	return cs, err
}

// Containers lists the runtime's running containers (crictl ps) and,
// where containerd's tasks can be read, each one's process.
func (o *Ops) Containers(ctx context.Context) (map[string]Container, error) {
	raw, err := o.Run(ctx, "crictl ps", nodescript.Containers)
	if err != nil {
		return nil, err
	}
	ps, tasks, _ := strings.Cut(raw, tasksMarker)
	cs, err := kubeletcompat.ParseCrictl([]byte(ps))
	if err != nil {
		return nil, fmt.Errorf("node %s: crictl ps: %w", o.Name, err)
	}
	pids, err := kubeletcompat.ParseTasks([]byte(tasks))
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", o.Name, err)
	}
	out := map[string]Container{}
	for _, c := range cs {
		if c.Namespace == agent.Namespace {
			continue // agent mode's agent: the run's own, made again where it goes
		}
		if c.Running {
			out[c.ID] = Container{What: c.Namespace + "/" + c.Pod + "/" + c.Name, PID: pids[c.ID]}
		}
	}
	return out, nil
}

// HasUnit says the node has unit (a systemd unit its facts list).
func (o *Ops) HasUnit(unit string) bool {
	_, ok := o.Facts.Units[unit]
	return ok
}

// Healthz is the HTTP status GET url answers on the node ("000" when
// nothing answers, "none" without curl).
func (o *Ops) Healthz(ctx context.Context, url string) (string, error) {
	out, err := o.Run(ctx, "read "+url, nodescript.Healthz, url)
	return strings.TrimSpace(out), err
}
