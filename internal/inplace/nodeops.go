package inplace

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodeaccess"
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
	facts     *NodeFacts
}

func (o *nodeOps) run(ctx context.Context, step, script string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, defaultTimeout)
	defer cancel()
	out, err := o.n.Run(ctx, "set -e\n"+script, nil)
	if err != nil {
		return string(out), fmt.Errorf("node %s: %s: %w", o.name, step, err)
	}
	return string(out), nil
}

// binary is where the unit of comp runs its program from.
func (o *nodeOps) binary(comp string) string {
	if p := o.facts.Programs[comp]; strings.HasPrefix(p, "/") {
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

// backup copies comp's binary (and, for the kubelet, its checkpoint
// files) to BACKUP/FROM once; a binary that already runs another version
// than FROM is not taken for the old one.
func (o *nodeOps) backup(ctx context.Context, comp string) error {
	q := nodeaccess.Quote
	dir := path.Join(o.backupDir, o.from)
	s := fmt.Sprintf(`b=%[1]s; mkdir -p "$b"
if [ ! -e "$b/%[2]s" ]; then
  v=$(%[3]s --version 2>&1 | head -n 1)
  case "$v" in *%[4]s) ;; *) echo "%[3]s is $v, not %[4]s: no backup of the old binary can be taken" >&2; exit 66;; esac
  cp -p %[3]s "$b/.%[2]s.partial"; mv -f "$b/.%[2]s.partial" "$b/%[2]s"
fi
`, q(dir), comp, q(o.binary(comp)), o.from)
	if comp == "kubelet" {
		for _, f := range checkpointFiles {
			s += fmt.Sprintf("if [ -f %[1]s ] && [ ! -e \"$b/%[2]s\" ]; then cp -p %[1]s \"$b/.%[2]s.partial\"; mv -f \"$b/.%[2]s.partial\" \"$b/%[2]s\"; fi\n",
				q(path.Join(o.kubeletRoot(), f)), f)
		}
	}
	_, err := o.run(ctx, "back up "+comp, s)
	return err
}

// swap puts the staged binary in place of comp's by rename (atomic) after
// checking its sha256 once more, and restarts the unit.
func (o *nodeOps) swap(ctx context.Context, comp, sha256 string) error {
	q := nodeaccess.Quote
	staged := StagePath(o.stageDir, o.to, comp)
	bin := o.binary(comp)
	tmp := path.Join(path.Dir(bin), "."+comp+".kubelift-new")
	s := fmt.Sprintf(`echo %[1]s | sha256sum -c --quiet - >&2
cp %[2]s %[3]s; chmod 0755 %[3]s; mv -f %[3]s %[4]s
systemctl restart %[5]s
`, q(sha256+"  "+staged), q(staged), q(tmp), q(bin), comp)
	_, err := o.run(ctx, "swap "+comp, s)
	return err
}

// restore puts the backed-up binary (and checkpoint files) back, removes
// a hash-skip file, and restarts the unit.
func (o *nodeOps) restore(ctx context.Context, comp string) error {
	q := nodeaccess.Quote
	b := path.Join(o.backupDir, o.from)
	bin := o.binary(comp)
	tmp := path.Join(path.Dir(bin), "."+comp+".kubelift-old")
	s := fmt.Sprintf("cp -p %[1]s %[2]s; mv -f %[2]s %[3]s\n", q(path.Join(b, comp)), q(tmp), q(bin))
	if comp == "kubelet" {
		for _, f := range checkpointFiles {
			s += fmt.Sprintf("if [ -f %[1]s ]; then cp -p %[1]s %[2]s.kubelift-old; mv -f %[2]s.kubelift-old %[2]s; fi\n", q(path.Join(b, f)), q(path.Join(o.kubeletRoot(), f)))
		}
		s += "rm -f " + q(path.Join(o.kubeletRoot(), path.Base(hashskip.DefaultPath))) + "\n"
	}
	s += "systemctl restart " + comp + "\n"
	_, err := o.run(ctx, "restore "+comp, s)
	return err
}

// writeHashSkip writes the hash-skip file the upgraded kubelet reads,
// atomically.
func (o *nodeOps) writeHashSkip(ctx context.Context, now time.Time) error {
	data, err := json.Marshal(hashskip.File{SchemaVersion: hashskip.SchemaVersion, OldKubeletVersion: o.from, NewKubeletVersion: o.to, UpgradedAt: now.UTC()})
	if err != nil {
		return err
	}
	q := nodeaccess.Quote
	p := path.Join(o.kubeletRoot(), path.Base(hashskip.DefaultPath))
	_, err = o.run(ctx, "write the hash-skip file", fmt.Sprintf("printf '%%s\\n' %s > %s.tmp; mv -f %s.tmp %s\n", q(string(data)), q(p), q(p), q(p)))
	return err
}

// running reports the version comp's unit runs now ("" when not running).
func (o *nodeOps) running(ctx context.Context, comp string) (string, error) {
	out, err := o.run(ctx, "read "+comp+"'s version", fmt.Sprintf(`pid=$(systemctl show %[1]s -p MainPID 2>/dev/null | sed -n 's/^MainPID=//p')
if [ -n "$pid" ] && [ "$pid" != 0 ] && [ -e "/proc/$pid/exe" ]; then "/proc/$pid/exe" --version 2>&1 | head -n 1; fi
`, comp))
	return versionRE.FindString(out), err
}

// containers lists the runtime's running containers (crictl ps).
func (o *nodeOps) containers(ctx context.Context) (map[string]string, error) {
	raw, err := o.run(ctx, "crictl ps", "crictl ps -o json")
	if err != nil {
		return nil, err
	}
	cs, err := kubeletcompat.ParseCrictl([]byte(raw))
	if err != nil {
		return nil, fmt.Errorf("node %s: crictl ps: %w", o.name, err)
	}
	out := map[string]string{}
	for _, c := range cs {
		if c.Running {
			out[c.ID] = c.Namespace + "/" + c.Pod + "/" + c.Name
		}
	}
	return out, nil
}
