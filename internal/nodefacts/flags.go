package nodefacts

// How a component's flags are read: from its running command line, its
// unit's ExecStart and Environment= lines, and the EnvironmentFiles those
// read, each word as systemd splits it.

import (
	"strconv"
	"strings"
)

// FeatureGate is feature gate name's setting in component comp's
// --feature-gates ("A=true,B=false", as the component runs it), and
// whether it sets it in a form the component accepts (strconv.ParseBool's,
// as component-base reads it; the last setting wins).
func (f *Facts) FeatureGate(comp, name string) (on, set bool) {
	for _, kv := range strings.Split(f.Values[comp+" --feature-gates"], ",") {
		k, v, found := strings.Cut(strings.TrimSpace(kv), "=")
		if !found || strings.TrimSpace(k) != name {
			continue
		}
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return false, false
		}
		on, set = b, true
	}
	return on, set
}

// addValues records the values of the --flags in args (the first seen wins).
func (f *Facts) addValues(comp string, args []string) {
	for i := range args {
		if name, value, ok := flagAt(comp, args, i); ok && value != "" {
			if _, seen := f.Values[comp+" "+name]; !seen {
				f.Values[comp+" "+name] = value
			}
		}
	}
}

// flagAt reads args[i] as a --flag and its value: --flag=VALUE; for
// etcd, also --flag VALUE where the next word is neither a flag nor a
// $VARIABLE (etcd's units and examples write its flags so, and etcd has
// few booleans); "" for a flag given alone. The Kubernetes components'
// words are not read so: they mix the words of several sources (ExecStart,
// Environment=, the EnvironmentFiles), so the word after a boolean such
// as --fail-cgroupv1 may be another source's.
func flagAt(comp string, args []string, i int) (name, value string, ok bool) {
	a := args[i]
	if !strings.HasPrefix(a, "--") || len(a) < 3 {
		return "", "", false
	}
	if name, value, ok := strings.Cut(a, "="); ok {
		return name, value, true
	}
	if next := i + 1; comp == Etcd && next < len(args) && !strings.HasPrefix(args[next], "-") && !strings.HasPrefix(args[next], "$") {
		return a, args[next], true
	}
	return a, "", true
}

// AddFlags records the --flag names in args, with where they were read
// (the first source and value of a flag win).
func (f *Facts) AddFlags(comp, source string, args []string) {
	seen := map[string]bool{}
	for _, fl := range f.Flags[comp] {
		seen[fl] = true
	}
	for i := range args {
		name, value, ok := flagAt(comp, args, i)
		if !ok {
			continue
		}
		if _, ok := f.FlagSources[comp+" "+name]; !ok {
			f.FlagSources[comp+" "+name] = source
		}
		if _, ok := f.Values[comp+" "+name]; !ok {
			f.Values[comp+" "+name] = value
		}
		if !seen[name] {
			seen[name] = true
			f.Flags[comp] = append(f.Flags[comp], name)
		}
	}
}

// unitExecArgs returns the words of a unit file's ExecStart lines
// (continuation lines joined) and of its Environment= values, where
// kubeadm's unit keeps flags ($KUBELET_KUBECONFIG_ARGS).
func unitExecArgs(unit string) []string {
	unit = strings.ReplaceAll(unit, "\\\n", " ")
	var args []string
	for _, line := range strings.Split(unit, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			args = append(args, shellWords(v)...)
		}
		if v, ok := strings.CutPrefix(line, "Environment="); ok {
			// Environment="A=--x=1 --y=2" B=--z: each assignment is a
			// quoted word; its value holds any number of flags.
			for _, w := range shellWords(v) {
				if _, val, ok := strings.Cut(w, "="); ok {
					args = append(args, strings.Fields(val)...)
				}
			}
		}
	}
	return args
}

// unitProgram is the program a unit starts: the first word of its last
// non-empty ExecStart= (a drop-in's empty ExecStart= resets it), without
// systemd's prefixes (-, @, +, !, :).
func unitProgram(unit string) string {
	unit = strings.ReplaceAll(unit, "\\\n", " ")
	prog := ""
	for _, line := range strings.Split(unit, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "ExecStart=")
		if !ok {
			continue
		}
		prog = ""
		if w := shellWords(v); len(w) > 0 {
			prog = strings.TrimLeft(w[0], "-@+!:")
		}
	}
	return prog
}

// envArgs returns the words of every value of an EnvironmentFile.
func envArgs(env string) []string {
	var args []string
	for _, line := range strings.Split(env, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if _, v, ok := strings.Cut(line, "="); ok {
			for _, w := range shellWords(v) {
				args = append(args, strings.Fields(w)...)
			}
		}
	}
	return args
}

// shellWords splits on blanks outside quotes, dropping the quotes, as
// systemd and env files do.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	var quote rune
	in := false
	for _, c := range s {
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote == 0 && (c == '"' || c == '\''):
			quote, in = c, true
		case quote == 0 && (c == ' ' || c == '\t'):
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(c)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}
