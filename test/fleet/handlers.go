package fleet

import (
	"bytes"
	"fmt"
	"path"
	"regexp"
	"strings"
	"time"
)

// handler plays one script the engine sends. Its pattern is the script's
// stable text, with W for each shell word the engine fills in (a path, a
// version, a sha256: quoted with nodeaccess.Quote); run gets the words,
// unquoted, and returns the exit status.
type handler struct {
	name string
	re   *regexp.Regexp
	run  func(f *Fleet, n *node, args []string, io *stdio) int
}

// wordNC is one shell word as nodeaccess.Quote writes it: safe
// characters, or single-quoted, each quote inside closing the quotes,
// escaped and reopening them; word captures it.
const (
	wordNC = `(?:'[^']*'|\\.|[A-Za-z0-9@%+=:,./_-])+`
	word   = `(` + wordNC + `)`
)

// compile turns a pattern into a regexp: {W} is a word, captured; {V} a
// word, not captured (inside repeated lines); `set -e` (which nodeOps.run
// puts first) is optional, and the match is whole.
func compile(pattern string) *regexp.Regexp {
	pattern = strings.NewReplacer("{W}", word, "{V}", wordNC).Replace(pattern)
	return regexp.MustCompile(`(?s)^(?:set -e\n)?` + pattern + `\n?$`)
}

// handlers are tried in order; the first that matches plays the command.
// Each names the engine function whose script it plays.
var handlers = []handler{
	// inplace.ReadFacts (factsScript): versions, command lines, unit and
	// environment files of every component, the staged files, free space
	// and the containers, in "### " sections.
	{"facts", compile(`export LC_ALL=C PATH=\S+\nfor c in ([a-z -]+); do\n.*\n  for f in ([^;]+); do\n.*` +
		`echo '### staged'; \[ -d {W} \] && \(cd {W} && sha256sum -- \* 2>/dev/null\)\n` +
		`d={W}; while \[ ! -d "\$d" \]; do d=\$\(dirname "\$d"\); done; echo '### df'; df -Pk "\$d" \| tail -n 1\n` +
		`echo '### crictl'; crictl ps -o json 2>&1 \|\| echo '### crictl-failed'`), playFacts},
	// inplace.stageNode: the files already staged, to skip them.
	{"list staged", compile(`\[ -d {W} \] && cd {W} && sha256sum -- \* 2>/dev/null; true`), playListStaged},
	// inplace.sendFile: stdin is a gzip stream, decompressed to a
	// temporary file, checked against the signed sha256 (exit 65) and
	// renamed into place.
	{"stage file", compile(`umask 022\nmkdir -p {W}\ntrap 'rm -f {W}' EXIT\nsum=\$\(gzip -dc \| tee {W} \| sha256sum \| cut -d ' ' -f 1\)\n` +
		`\[ -n "\$sum" \]\nif \[ "\$sum" != {W} \]; then echo "sha256 \$sum on the node, signed {W}" >&2; exit 65; fi\n` +
		`chmod 0755 {W}\nmv -f {W} {W}\ntrap - EXIT`), playStage},
	// nodeOps.backup: the binary (if it runs FROM; exit 66 if not) and,
	// for the kubelet, its checkpoint files, to BACKUP/FROM once.
	{"back up", compile(`b={W}; mkdir -p "\$b"\nif \[ ! -e "\$b/{W}" \]; then\n  v=\$\({W} --version 2>&1 \| head -n 1\)\n` +
		`  case "\$v" in \*([^)]+)\) ;; \*\) echo "[^\n]*" >&2; exit 66;; esac\n` +
		`  cp -p {W} "\$b/{W}"; mv -f "\$b/{W}" "\$b/{W}"\nfi\n` +
		`((?:if \[ -f {V} \] && \[ ! -e "\$b/{V}" \]; then cp -p {V} "\$b/{V}"; mv -f "\$b/{V}" "\$b/{V}"; fi\n)*)`), playBackup},
	// nodeOps.swap: check the staged file, copy it over the binary,
	// restart the unit.
	{"swap", compile(`echo {W} \| sha256sum -c --quiet - >&2\ncp {W} {W}; chmod 0755 {W}; mv -f {W} {W}\nsystemctl restart {W}`), playSwap},
	// nodeOps.restore: the backed-up binary (and checkpoint files) back,
	// the hash-skip file removed, the unit restarted.
	{"restore", compile(`cp -p {W} {W}; mv -f {W} {W}\n` +
		`((?:if \[ -f {V} \]; then cp -p {V} {V}; mv -f {V} {V}; fi\n)*)` +
		`((?:rm -f {V}\n)?)systemctl restart {W}`), playRestore},
	// nodeOps.writeHashSkip: printf the JSON to a temporary file, rename.
	{"write hash-skip", compile(`printf '%s\\n' {W} > {W}; mv -f {W} {W}`), playWriteFile},
	// nodeOps.running: the version the unit's main process runs.
	{"running version", compile(`pid=\$\(systemctl show {W} -p MainPID 2>/dev/null \| sed -n 's/\^MainPID=//p'\)\n` +
		`if \[ -n "\$pid" \] && \[ "\$pid" != 0 \] && \[ -e "/proc/\$pid/exe" \]; then "/proc/\$pid/exe" --version 2>&1 \| head -n 1; fi`), playRunning},
	// nodeOps.containers (verify, and the containers before a swap).
	{"crictl ps", compile(`crictl ps -o json`), playCrictl},
	// applyRun.etcdStep: a snapshot with the API server's etcd client
	// flags; a small file says it is simulated.
	{"etcd snapshot", compile(`mkdir -p {W}; ETCDCTL_API=3 etcdctl --endpoints={W}((?: --[a-z]+={V})*) snapshot save {W} >&2`), playEtcd},
	// cleanupNode: is the hash-skip file there?
	{"exists", compile(`\[ -e {W} \] && echo yes \|\| echo no`), playExists},
	// cleanupNode: remove the hash-skip file.
	{"rm", compile(`rm -f {W}`), playRm},
}

// Regexps for the repeated lines inside some scripts.
var (
	backupExtraRE  = regexp.MustCompile(`if \[ -f ` + word + ` \] && \[ ! -e "\$b/` + word + `" \]`)
	restoreExtraRE = regexp.MustCompile(`if \[ -f ` + word + ` \]; then cp -p ` + word + ` ` + word + `; mv -f ` + word + ` ` + word + `; fi`)
	rmRE           = regexp.MustCompile(`rm -f ` + word)
)

// exec plays cmd on n.
func (f *Fleet) exec(n *node, cmd string, io *stdio) int {
	for _, h := range handlers {
		m := h.re.FindStringSubmatch(cmd)
		if m == nil {
			continue
		}
		f.count(h.name)
		args := make([]string, len(m)-1)
		for i, a := range m[1:] {
			args[i] = unquote(a)
		}
		began := time.Now()
		code := h.run(f, n, args, io)
		n.mu.Lock()
		n.commands = append(n.commands, Command{Handler: h.name, Began: began, Ended: time.Now(), Code: code})
		n.mu.Unlock()
		return code
	}
	f.count("not played")
	first := strings.TrimPrefix(cmd, "set -e\n")
	first, _, _ = strings.Cut(first, "\n")
	msg := fmt.Sprintf("fleet: %s: command not played: %s", n.spec.Name, first)
	f.cfg.Log("%s", msg)
	fmt.Fprintln(io.err, msg)
	return 127
}

// unquote undoes nodeaccess.Quote (and backslash escapes).
func unquote(s string) string {
	if !strings.ContainsAny(s, `'\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				j = len(s) - i - 1
			}
			b.WriteString(s[i+1 : i+1+j])
			i += j + 1
		case '\\':
			if i+1 < len(s) {
				i++
				b.WriteByte(s[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// playFacts answers factsScript. args: components, unit file patterns
// (with $c), staged dir (twice), stage dir.
func playFacts(f *Fleet, n *node, args []string, io *stdio) int {
	comps := strings.Fields(args[0])
	var patterns []string
	for _, w := range strings.Fields(args[1]) {
		if w != `\` {
			patterns = append(patterns, w)
		}
	}
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
		for _, pat := range patterns {
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
	n.writeSums(&b, args[2])
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

// playListStaged answers stageNode's listing. args: dir, dir.
func playListStaged(_ *Fleet, n *node, args []string, io *stdio) int {
	var b bytes.Buffer
	n.mu.Lock()
	n.writeSums(&b, args[0])
	n.mu.Unlock()
	io.out.Write(b.Bytes())
	return 0
}

// playStage answers sendFile. args: dir, tmp, tmp, sha256, sha256, tmp,
// tmp, dst.
func playStage(f *Fleet, n *node, args []string, io *stdio) int {
	dir, want, dst := args[0], args[3], args[7]
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

// playBackup answers nodeOps.backup. args: dir, name, binary, from,
// then the .partial names, then the checkpoint lines.
func playBackup(f *Fleet, n *node, args []string, io *stdio) int {
	dir, name, bin, from := args[0], args[1], args[2], args[3]
	n.mu.Lock()
	defer n.mu.Unlock()
	n.mkdirAll(dir)
	if !n.exists(dir + "/" + name) {
		if v := f.versionOf(n, bin); !strings.HasSuffix(v, from) {
			fmt.Fprintf(io.err, "%s is %s, not %s: no backup of the old binary can be taken\n", bin, v, from)
			return 66
		}
		n.files[dir+"/"+name] = n.files[bin]
	}
	for _, m := range backupExtraRE.FindAllStringSubmatch(args[len(args)-1], -1) {
		src, dst := unquote(m[1]), dir+"/"+unquote(m[2])
		if v, ok := n.files[src]; ok && !n.exists(dst) {
			n.files[dst] = v
		}
	}
	return 0
}

// playSwap answers nodeOps.swap. args: "SHA256  STAGED", staged, tmp
// (three times), binary, unit.
func playSwap(f *Fleet, n *node, args []string, io *stdio) int {
	want, staged, _ := strings.Cut(args[0], "  ")
	bin, comp := args[5], args[6]
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
		fmt.Fprintf(io.err, "cp: cannot create regular file '%s': No such file or directory\n", args[2])
		return 1
	}
	n.files[bin] = v
	n.mu.Unlock()
	return f.systemctlRestart(n, comp, io)
}

// playRestore answers nodeOps.restore. args: backup, tmp, tmp, binary,
// checkpoint lines, rm line, unit.
func playRestore(f *Fleet, n *node, args []string, io *stdio) int {
	backup, bin, comp := args[0], args[3], args[len(args)-1]
	n.mu.Lock()
	v, ok := n.files[backup]
	if !ok {
		n.mu.Unlock()
		fmt.Fprintf(io.err, "cp: cannot stat '%s': No such file or directory\n", backup)
		return 1
	}
	n.files[bin] = v
	for _, m := range restoreExtraRE.FindAllStringSubmatch(args[4], -1) {
		if v, ok := n.files[unquote(m[1])]; ok {
			n.put(unquote(m[5]), v)
		}
	}
	if m := rmRE.FindStringSubmatch(args[len(args)-2]); m != nil {
		delete(n.files, unquote(m[1]))
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

// playWriteFile answers nodeOps.writeHashSkip. args: content, tmp, tmp,
// file.
func playWriteFile(_ *Fleet, n *node, args []string, io *stdio) int {
	data, file := args[0], args[3]
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.dirs[path.Dir(file)] {
		fmt.Fprintf(io.err, "sh: 1: cannot create %s: Directory nonexistent\n", args[1])
		return 2
	}
	n.files[file] = vfile{data: []byte(data + "\n")}
	return 0
}

// playRunning answers nodeOps.running. args: unit.
func playRunning(_ *Fleet, n *node, args []string, io *stdio) int {
	n.mu.Lock()
	u := n.units[args[0]]
	version := ""
	if u != nil && u.pid != 0 {
		version = u.version
	}
	n.mu.Unlock()
	if version != "" {
		fmt.Fprintf(io.out, "Kubernetes %s\n", version)
	}
	return 0
}

// playCrictl answers nodeOps.containers.
func playCrictl(f *Fleet, n *node, _ []string, io *stdio) int {
	out, err := f.crictlPS(n)
	if err != nil {
		fmt.Fprintln(io.err, err)
		return 1
	}
	io.out.Write(append(out, '\n'))
	return 0
}

// playEtcd answers etcdStep with a small file that says what it is.
// args: dir, endpoint, flags (the last one's value), snapshot path.
func playEtcd(_ *Fleet, n *node, args []string, io *stdio) int {
	dir, endpoint, snap := args[0], args[1], args[len(args)-1]
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

// playExists answers cleanupNode's check. args: file.
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

// playRm answers cleanupNode's removal. args: file.
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
