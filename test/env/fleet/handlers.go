package fleet

import (
	"bytes"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/nodescript"
)

// handler plays one node script (internal/nodescript) on a node: it gets
// the script's positional arguments and returns the exit status.
type handler struct {
	name string // as counted in Stats and logged per command
	run  func(f *Fleet, n *node, args []string, io *stdio) int
}

// handlers maps each nodescript script's name to the handler playing it,
// named as the fleet's statistics (and the scale tests) call it.
var handlers = map[string]handler{
	"facts":         {"facts", playFacts},
	"list-staged":   {"list staged", playListStaged},
	"stage-file":    {"stage file", playStage},
	"backup":        {"back up", playBackup},
	"swap":          {"swap", playSwap},
	"restore":       {"restore", playRestore},
	"write-file":    {"write hash-skip", playWriteFile},
	"put-file":      {"put file", playPutFile},
	"running":       {"running version", playRunning},
	"installed":     {"program version", playInstalled},
	"containers":    {"crictl ps", playCrictl},
	"healthz":       {"healthz", playHealthz},
	"etcd-snapshot": {"etcd snapshot", playEtcd},
	"read-file":     {"read file", playReadFile},
	"check-file":    {"check file", playCheckFile},
	"exists":        {"exists", playExists},
	"remove":        {"rm", playRm},
	"start":         {"start", playStart},
}

// exec plays cmd on n: one of the engine's node scripts, exactly as
// embedded, or a failure (exit 127) naming what it is not.
func (f *Fleet) exec(n *node, cmd string, io *stdio) int {
	s, args, err := nodescript.Parse(cmd)
	h, ok := handlers[s.Name]
	if err != nil || !ok {
		f.count("not played")
		first, _, _ := strings.Cut(cmd, "\n")
		msg := fmt.Sprintf("fleet: %s: command not played (%v): %s", n.spec.Name, err, first)
		f.cfg.Log("%s", msg)
		fmt.Fprintln(io.err, msg)
		return 127
	}
	f.count(h.name)
	began := time.Now()
	n.held(h.name)
	code := n.injected(h.name)
	if code != 0 {
		fmt.Fprintln(io.err, injectedMessage(n.spec.Name, h.name, code))
	} else {
		code = h.run(f, n, args, io)
	}
	n.mu.Lock()
	n.commands = append(n.commands, Command{Handler: h.name, Began: began, Ended: time.Now(), Code: code})
	n.mu.Unlock()
	return code
}

// unitPaths are where the facts script looks for a component's unit
// file and drop-ins, in its order ($c is the component).
var unitPaths = []string{"/etc/systemd/system/$c.service", "/run/systemd/system/$c.service", "/lib/systemd/system/$c.service", "/usr/lib/systemd/system/$c.service",
	"/etc/systemd/system/$c.service.d/*.conf", "/run/systemd/system/$c.service.d/*.conf", "/lib/systemd/system/$c.service.d/*.conf", "/usr/lib/systemd/system/$c.service.d/*.conf"}

// playFacts answers the facts script. args: VERSION_DIR STAGE_DIR
// COMPONENT...
func playFacts(f *Fleet, n *node, args []string, io *stdio) int {
	if len(args) < 2 {
		return 2
	}
	vdir, comps := args[0], args[2:]
	var b bytes.Buffer
	n.mu.Lock()
	for _, c := range comps {
		if u := n.units[c]; u != nil && u.pid != 0 {
			fmt.Fprintf(&b, "### version %s\nKubernetes %s\n", c, u.version)
			fmt.Fprintf(&b, "### cmdline %s\n", c)
			for _, a := range u.cmdline {
				b.WriteString(a + "\n")
			}
			b.WriteString("\n")
		}
		for _, pat := range unitPaths {
			pat = strings.ReplaceAll(pat, "$c", c)
			for _, file := range n.glob(pat) {
				v, ok := n.files[file]
				if !ok {
					continue
				}
				fmt.Fprintf(&b, "### unit %s %s\n%s\n", c, file, v.data)
				for _, line := range strings.Split(string(v.data), "\n") {
					e, ok := strings.CutPrefix(strings.TrimLeft(line, " \t"), "EnvironmentFile=")
					if !ok {
						continue
					}
					for _, ef := range strings.Fields(strings.TrimPrefix(e, "-")) {
						if env, ok := n.files[ef]; ok {
							fmt.Fprintf(&b, "### env %s %s\n%s\n", c, ef, env.data)
						}
					}
				}
			}
		}
	}
	b.WriteString("### staged\n")
	n.writeSums(&b, path.Clean(vdir))
	n.mu.Unlock()
	// df -Pk: 1 TiB, a tenth used.
	b.WriteString("### df\n/dev/vda1 1073741824 107374182 966367642 10% /\n")
	b.WriteString("### crictl\n")
	out, err := f.crictlPS(n)
	if err != nil {
		fmt.Fprintf(&b, "%v\n### crictl-failed\n", err)
	} else {
		b.Write(out)
		b.WriteString("\n")
	}
	io.out.Write(b.Bytes())
	return 0
}

// glob expands a pattern whose last element may hold a *, as the shell
// does: no match leaves the pattern itself. The caller holds n.mu.
func (n *node) glob(pattern string) []string {
	dir, base := path.Split(pattern)
	if !strings.ContainsAny(base, "*?[") {
		return []string{pattern}
	}
	var out []string
	for _, name := range n.list(dir) {
		if ok, _ := path.Match(base, name); ok && !strings.HasPrefix(name, ".") {
			out = append(out, dir+name)
		}
	}
	if len(out) == 0 {
		return []string{pattern}
	}
	return out
}

// writeSums is `cd DIR && sha256sum -- *` (errors dropped). The caller
// holds n.mu.
func (n *node) writeSums(b *bytes.Buffer, dir string) {
	if !n.dirs[dir] {
		return
	}
	for _, name := range n.list(dir) {
		if !strings.HasPrefix(name, ".") {
			fmt.Fprintf(b, "%s  %s\n", n.files[dir+"/"+name].digest(), name)
		}
	}
}

// playListStaged answers the list-staged script. args: VERSION_DIR.
func playListStaged(_ *Fleet, n *node, args []string, io *stdio) int {
	var b bytes.Buffer
	n.mu.Lock()
	n.writeSums(&b, path.Clean(args[0]))
	n.mu.Unlock()
	io.out.Write(b.Bytes())
	return 0
}

// playStage answers the stage-file script. args: VERSION_DIR NAME
// SHA256 SIZE CODEC OFFSET; stdin is the gzip stream (the fleet's nodes
// list no zstd, and the scale tests stage with --codec gzip, so staging
// sends them gzip, whole: a probe of --codec auto, or the rest of a file,
// is refused with exit 64).
func playStage(f *Fleet, n *node, args []string, io *stdio) int {
	if len(args) != 6 || args[4] != "gzip" || args[5] != "0" {
		fmt.Fprintf(io.err, "fleet: stage-file %q: a gzip stream from the start is all the fleet plays\n", args)
		return 64
	}
	dir, want := path.Clean(args[0]), args[2]
	dst := dir + "/" + args[1]
	got, read, err := f.stream.read(f.ctx, io.in)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.received += read
	n.mkdirAll(dir)
	if err != nil {
		fmt.Fprintln(io.err, err)
	}
	if got.sum != want || err == errUnverifiable {
		fmt.Fprintf(io.err, "sha256 %s on the node, signed %s\n", got.sum, want)
		return 65
	}
	n.put(dst, vfile{sum: got.sum, size: got.size})
	return 0
}

// playBackup answers the backup script. args: BACKUP_DIR NAME BINARY
// FROM [KUBELET_ROOT CHECKPOINT...].
func playBackup(f *Fleet, n *node, args []string, io *stdio) int {
	dir, name, bin, from := path.Clean(args[0]), args[1], args[2], args[3]
	n.mu.Lock()
	defer n.mu.Unlock()
	n.mkdirAll(dir)
	if !n.exists(dir + "/" + name) {
		if v := f.versionOf(n, bin); !strings.HasSuffix(v, " "+from) {
			fmt.Fprintf(io.err, "%s is %s, not %s: no backup of the old binary can be taken\n", bin, v, from)
			return 66
		}
		n.files[dir+"/"+name] = n.files[bin]
	}
	if len(args) > 4 {
		root := args[4]
		for _, c := range args[5:] {
			if v, ok := n.files[root+"/"+c]; ok && !n.exists(dir+"/"+c) {
				n.files[dir+"/"+c] = v
			}
		}
	}
	return 0
}

// playSwap answers the swap script. args: STAGED SHA256 BINARY UNIT.
func playSwap(f *Fleet, n *node, args []string, io *stdio) int {
	staged, want, bin, comp := args[0], args[1], args[2], args[3]
	n.mu.Lock()
	v, ok := n.files[staged]
	switch {
	case !ok:
		n.mu.Unlock()
		fmt.Fprintf(io.err, "sha256sum: %s: No such file or directory\n%s: FAILED open or read\nsha256sum: WARNING: 1 listed file could not be read\n", staged, staged)
		return 1
	case v.digest() != want:
		n.mu.Unlock()
		fmt.Fprintf(io.err, "%s: FAILED\nsha256sum: WARNING: 1 computed checksum did NOT match\n", staged)
		return 1
	case !n.dirs[path.Dir(bin)]:
		n.mu.Unlock()
		fmt.Fprintf(io.err, "cp: cannot create regular file '%s/.%s.kubelift-new': No such file or directory\n", path.Dir(bin), comp)
		return 1
	}
	n.files[bin] = v
	n.mu.Unlock()
	return f.systemctlRestart(n, comp, io)
}

// playRestore answers the restore script. args: BACKUP_DIR BINARY UNIT
// [KUBELET_ROOT HASH_SKIP_FILE CHECKPOINT...].
func playRestore(f *Fleet, n *node, args []string, io *stdio) int {
	dir, bin, comp := path.Clean(args[0]), args[1], args[2]
	backup := dir + "/" + comp
	n.mu.Lock()
	v, ok := n.files[backup]
	if !ok {
		n.mu.Unlock()
		fmt.Fprintf(io.err, "cp: cannot stat '%s': No such file or directory\n", backup)
		return 1
	}
	n.files[bin] = v
	if len(args) > 4 {
		root, skip := args[3], args[4]
		for _, c := range args[5:] {
			if v, ok := n.files[dir+"/"+c]; ok {
				n.put(root+"/"+c, v)
			}
		}
		delete(n.files, root+"/"+skip)
	}
	n.mu.Unlock()
	return f.systemctlRestart(n, comp, io)
}

func (f *Fleet) systemctlRestart(n *node, comp string, io *stdio) int {
	if err := f.restart(n, comp); err != nil {
		fmt.Fprintln(io.err, err)
		return 5
	}
	return 0
}

// playWriteFile answers the write-file script (the hash-skip file).
// args: FILE CONTENT.
func playWriteFile(_ *Fleet, n *node, args []string, io *stdio) int {
	file, data := args[0], args[1]
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.dirs[path.Dir(file)] {
		fmt.Fprintf(io.err, "sh: 1: cannot create %s.kubelift-tmp: Directory nonexistent\n", file)
		return 2
	}
	n.files[file] = vfile{data: []byte(data + "\n")}
	return 0
}

// playPutFile answers the put-file script (agent mode's upload): the
// file's content on standard input. args: FILE MODE.
func playPutFile(_ *Fleet, n *node, args []string, io *stdio) int {
	file := args[0]
	var data bytes.Buffer
	if _, err := data.ReadFrom(io.in); err != nil {
		fmt.Fprintf(io.err, "put-file: %s: %v\n", file, err)
		return 1
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.dirs[path.Dir(file)] = true // put-file makes the parent
	n.files[file] = vfile{data: data.Bytes()}
	return 0
}

// playRunning answers the running script: the version line and the main
// process's pid. args: UNIT.
func playRunning(_ *Fleet, n *node, args []string, io *stdio) int {
	n.mu.Lock()
	u := n.units[args[0]]
	version, pid := "", int64(0)
	if u != nil && u.pid != 0 {
		version, pid = u.version, u.pid
	}
	n.mu.Unlock()
	if version != "" {
		fmt.Fprintf(io.out, "Kubernetes %s\npid %d\n", version, pid)
	}
	return 0
}

// playStart answers the start script: a unit that does not run is
// started (as systemctl start does; one that runs is left). args: UNIT.
func playStart(f *Fleet, n *node, args []string, io *stdio) int {
	n.mu.Lock()
	u := n.units[args[0]]
	runs := u != nil && u.pid != 0
	n.mu.Unlock()
	if runs {
		return 0
	}
	return f.systemctlRestart(n, args[0], io)
}

// playHealthz answers the healthz script: 200 for kube-proxy's endpoint
// while its unit runs, 000 (nothing answers) otherwise. args: URL.
func playHealthz(_ *Fleet, n *node, args []string, io *stdio) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if u := n.units["kube-proxy"]; u != nil && u.pid != 0 && args[0] == "http://127.0.0.1:10256/healthz" {
		fmt.Fprint(io.out, "200")
		return 0
	}
	fmt.Fprint(io.out, "000")
	return 0
}

// playInstalled answers the installed script: the version of the
// program at PROGRAM, nothing when there is none. args: PROGRAM.
func playInstalled(f *Fleet, n *node, args []string, io *stdio) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.files[args[0]]; ok {
		fmt.Fprintln(io.out, f.versionOf(n, args[0]))
	}
	return 0
}

// playCrictl answers the containers script.
func playCrictl(f *Fleet, n *node, _ []string, io *stdio) int {
	out, err := f.crictlPS(n)
	if err != nil {
		fmt.Fprintln(io.err, err)
		return 1
	}
	io.out.Write(append(out, '\n'))
	return 0
}

// playEtcd answers the etcd-snapshot script with a small file that says
// what it is. args: SNAPSHOT ENDPOINT CACERT CERT KEY.
func playEtcd(_ *Fleet, n *node, args []string, io *stdio) int {
	snap, endpoint := args[0], args[1]
	dir := path.Dir(snap)
	if !n.spec.ControlPlane {
		fmt.Fprintln(io.err, "sh: 1: etcdctl: not found")
		return 127
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.mkdirAll(dir)
	if !n.dirs[path.Dir(snap)] {
		fmt.Fprintf(io.err, "Error: could not open %s.part (open %s.part: no such file or directory)\n", snap, snap)
		return 1
	}
	n.files[snap] = vfile{data: []byte(fmt.Sprintf("kubelift fleet: a simulated etcd snapshot of %s, taken %s\n", endpoint, time.Now().UTC().Format(time.RFC3339)))}
	fmt.Fprintf(io.err, "Snapshot saved at %s\n", snap)
	return 0
}

// playExists answers the exists script. args: FILE.
func playExists(_ *Fleet, n *node, args []string, io *stdio) int {
	n.mu.Lock()
	ok := n.exists(args[0])
	n.mu.Unlock()
	if ok {
		fmt.Fprintln(io.out, "yes")
	} else {
		fmt.Fprintln(io.out, "no")
	}
	return 0
}

// playReadFile answers the read-file script (a file copied off the
// node: the etcd snapshot). args: FILE.
func playReadFile(_ *Fleet, n *node, args []string, io *stdio) int {
	f, ok := n.file(args[0])
	if !ok {
		fmt.Fprintf(io.err, "cat: %s: No such file or directory\n", args[0])
		return 1
	}
	_, _ = io.out.Write(f.data)
	return 0
}

// playCheckFile answers the check-file script. args: FILE SHA256.
func playCheckFile(_ *Fleet, n *node, args []string, io *stdio) int {
	f, ok := n.file(args[0])
	if !ok {
		fmt.Fprintf(io.err, "sh: 1: cannot open %s: No such file\n", args[0])
		return 2
	}
	if got := f.digest(); got != args[1] {
		fmt.Fprintf(io.err, "%s has sha256 %s, not %s\n", args[0], got, args[1])
		return 65
	}
	return 0
}

// playRm answers the remove script. args: FILE.
func playRm(_ *Fleet, n *node, args []string, io *stdio) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.dirs[args[0]] {
		fmt.Fprintf(io.err, "rm: cannot remove '%s': Is a directory\n", args[0])
		return 1
	}
	delete(n.files, args[0])
	return 0
}
