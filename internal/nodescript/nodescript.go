// Package nodescript holds every shell script kubelift runs on a node, as
// constant files embedded in the binary (scripts/*.sh, shellcheck-clean),
// and the one way to run them: values (versions, paths, names, anything a
// node or the API reported) reach a script only as positional arguments,
// each quoted by nodeaccess.Quote, never pasted into the script's text.
// A script's name travels as its $0, so a command can be read back
// (Parse) by whoever plays or audits it.
package nodescript

import (
	"embed"
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/kubelift/kubelift/internal/nodeaccess"
)

//go:embed scripts/*.sh
var files embed.FS

// Script is one constant node script.
type Script struct {
	// Name is the file's name without .sh; the command runs it as
	// kubelift-NAME ($0).
	Name string
	// Text is the script, byte for byte as embedded.
	Text string
	// ReadOnly: the script changes nothing on the node.
	ReadOnly bool
}

// The scripts, one per node operation. Those that only read are marked:
// a dry run runs them, and only says the others.
var (
	Facts        = load("facts", readOnly)
	ListStaged   = load("list-staged", readOnly)
	StageFile    = load("stage-file", writes)
	PullFile     = load("pull-file", writes)
	Backup       = load("backup", writes)
	Swap         = load("swap", writes)
	Restore      = load("restore", writes)
	WriteFile    = load("write-file", writes)
	PutFile      = load("put-file", writes)
	Running      = load("running", readOnly)
	Installed    = load("installed", readOnly)
	Containers   = load("containers", readOnly)
	Healthz      = load("healthz", readOnly)
	EtcdSnapshot = load("etcd-snapshot", writes)
	Exists       = load("exists", readOnly)
	CheckFile    = load("check-file", readOnly)
	ReadFile     = load("read-file", readOnly)
	Remove       = load("remove", writes)
	Start        = load("start", writes)
	// kubeadm clusters: kubeadm run detached and followed, etcd's
	// snapshot taken inside its static pod, the static pod manifests and
	// kubeadm's backups of them read, and one put back.
	KubeadmStart           = load("kubeadm-start", writes)
	KubeadmStatus          = load("kubeadm-status", readOnly)
	KubeadmEtcdSnapshot    = load("kubeadm-etcd-snapshot", writes)
	KubeadmManifests       = load("kubeadm-manifests", readOnly)
	KubeadmRestoreManifest = load("kubeadm-restore-manifest", writes)
	// The container runtime: containerd's release archive (and runc)
	// swapped in place, its config migrated, and put back.
	RuntimeSwap    = load("runtime-swap", writes)
	RuntimeRestore = load("runtime-restore", writes)
	// The node's tools: the CNI plugins and crictl replaced in place
	// where they differ from the bundle's, and put back.
	ToolsSwap    = load("tools-swap", writes)
	ToolsRestore = load("tools-restore", writes)
	// A binary cluster's etcd member: what each member says of itself,
	// its programs moved to the bundle's etcd and restarted, and put back.
	EtcdStatus  = load("etcd-status", readOnly)
	EtcdSwap    = load("etcd-swap", writes)
	EtcdRestore = load("etcd-restore", writes)
	// Agent mode: one step run by the host's service manager, its result
	// kept on the host (internal/agent/hoststep).
	AgentStep = load("agent-step", writes)
)

const (
	readOnly = true
	writes   = false
)

// All lists every script, by name.
func All() []Script {
	out := make([]Script, 0, len(byName))
	for _, s := range byName {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

var byName = map[string]Script{}

// Lookup is the script named name (its file's name without .sh).
func Lookup(name string) (Script, bool) {
	s, ok := byName[name]
	return s, ok
}

func load(name string, ro bool) Script {
	b, err := files.ReadFile(path.Join("scripts", name+".sh"))
	if err != nil {
		panic(fmt.Sprintf("nodescript: %s: %v", name, err)) // a build without the file is broken
	}
	s := Script{Name: name, Text: string(b), ReadOnly: ro}
	byName[name] = s
	return s
}

// argv0 is the $0 a script runs as.
func (s Script) argv0() string { return "kubelift-" + s.Name }

// Command is the shell command that runs the script with args as its
// positional parameters: sh -c 'TEXT' kubelift-NAME 'ARG1' 'ARG2' ...
// Every word is quoted by nodeaccess.Quote; no argument is ever part of
// the script's text.
func (s Script) Command(args ...string) string {
	var b strings.Builder
	b.WriteString("sh -c ")
	b.WriteString(nodeaccess.Quote(s.Text))
	b.WriteByte(' ')
	b.WriteString(s.argv0())
	for _, a := range args {
		b.WriteByte(' ')
		b.WriteString(nodeaccess.Quote(a))
	}
	return b.String()
}

// Show is the command as a person reads it: the script's name and its
// quoted arguments, without the text (a dry run prints it).
func (s Script) Show(args ...string) string {
	var b strings.Builder
	b.WriteString(s.argv0())
	for _, a := range args {
		b.WriteByte(' ')
		b.WriteString(nodeaccess.Quote(a))
	}
	return b.String()
}

// Parse reads a command Command made back into its script and
// arguments; a command that is not exactly one of the scripts run with
// its own name is refused.
func Parse(cmd string) (Script, []string, error) {
	words, err := splitWords(cmd)
	if err != nil {
		return Script{}, nil, err
	}
	if len(words) < 4 || words[0] != "sh" || words[1] != "-c" {
		return Script{}, nil, fmt.Errorf("not a node script: %.60q", cmd)
	}
	name, ok := strings.CutPrefix(words[3], "kubelift-")
	s, known := byName[name]
	if !ok || !known {
		return Script{}, nil, fmt.Errorf("unknown node script %q", words[3])
	}
	if words[2] != s.Text {
		return Script{}, nil, fmt.Errorf("node script %s: text differs from the embedded one", s.Name)
	}
	return s, words[4:], nil
}

// splitWords splits what Quote-joined words make: blanks between words,
// single quotes around, '\” for a quote inside.
func splitWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	in := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == ' ':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated quote in %.60q", s)
			}
			w.WriteString(s[i+1 : i+1+j])
			i += j + 1
			in = true
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			in = true
		default:
			w.WriteByte(c)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words, nil
}
