package nodefacts

import (
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubelift/kubelift/internal/catalog"
)

// BadValue is a value a node or the API reported that does not parse:
// it is refused where it enters and never reaches a node script. The plan
// lists each as a blocking "values" finding; apply, rollback and cleanup
// refuse before touching any node while one stands.
type BadValue struct {
	Node  string `json:"node"`
	Field string `json:"field"`
	Value string `json:"value"`
	// Reason says what the value should have been.
	Reason string `json:"reason"`
}

func (b BadValue) Error() string {
	return fmt.Sprintf("node %s: %s %q refused: %s", b.Node, b.Field, b.Value, b.Reason)
}

// ErrBadValues means a node or the API reported values that do not parse.
var ErrBadValues = fmt.Errorf("refused values reported by the cluster")

// Refused lists them, each naming node, field and value.
func Refused(bad []BadValue) error {
	var b strings.Builder
	for _, v := range bad {
		b.WriteString("\n  ")
		b.WriteString(v.Error())
	}
	return fmt.Errorf("%w (nothing was changed on any node):%s", ErrBadValues, b.String())
}

// ParseVersion parses a reported version, or says why not.
func ParseVersion(node, field, s string) (catalog.Version, *BadValue) {
	v, err := catalog.ParseReported(s)
	if err != nil {
		return catalog.Version{}, &BadValue{Node: node, Field: field, Value: s, Reason: err.Error()}
	}
	return v, nil
}

// ParseVersionLine reads the version a binary's `--version` printed
// ("Kubernetes v1.31.4"): the line's last word, a strict version.
func ParseVersionLine(node, field, line string) (catalog.Version, *BadValue) {
	line = strings.TrimRight(line, "\n")
	fields := strings.Fields(line)
	if strings.Contains(line, "\n") || len(fields) == 0 {
		return catalog.Version{}, &BadValue{Node: node, Field: field, Value: line, Reason: "want one line ending in vMAJOR.MINOR.PATCH"}
	}
	v, bad := ParseVersion(node, field, fields[len(fields)-1])
	if bad != nil {
		bad.Value = line
	}
	return v, bad
}

// ParseEtcdVersion reads the version `etcd --version` printed on its
// first line ("etcd Version: 3.5.35"), as vMAJOR.MINOR.PATCH.
func ParseEtcdVersion(node, out string) (catalog.Version, *BadValue) {
	const field = "etcd --version"
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	num, ok := strings.CutPrefix(line, "etcd Version: ")
	if !ok {
		return catalog.Version{}, &BadValue{Node: node, Field: field, Value: line, Reason: "want etcd Version: MAJOR.MINOR.PATCH"}
	}
	v, bad := ParseVersion(node, field, "v"+strings.TrimSpace(num))
	if bad != nil {
		bad.Value = line
	}
	return v, bad
}

// CheckPath accepts an absolute, clean path (no .., no doubled slashes)
// of plain characters.
func CheckPath(node, field, p string) *BadValue {
	switch {
	case !strings.HasPrefix(p, "/") || path.Clean(p) != p:
		return &BadValue{Node: node, Field: field, Value: p, Reason: "want an absolute, clean path"}
	case strings.Trim(p, pathChars) != "":
		return &BadValue{Node: node, Field: field, Value: p, Reason: "holds characters other than letters, digits and " + pathChars[62:]}
	}
	return nil
}

// pathChars are the characters a path kubelift accepts from a node may
// hold: what install paths use, nothing a shell treats specially.
const pathChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._+@:=,-"

// CheckEndpoint accepts an http(s) URL with a host.
func CheckEndpoint(node, field, s string) *BadValue {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || strings.ContainsAny(s, " \t\n'\"$`;&|<>()\\") {
		return &BadValue{Node: node, Field: field, Value: s, Reason: "want an http(s) URL"}
	}
	return nil
}

// CheckNodeName accepts a Kubernetes node name (an RFC 1123 subdomain).
func CheckNodeName(name string) *BadValue {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return &BadValue{Node: name, Field: "metadata.name", Value: name, Reason: strings.Join(errs, "; ")}
	}
	return nil
}

// Under joins elem to root and says whether the result stays below root
// (a file name, not a path: no slash, not . or ..).
func Under(root, elem string) (string, bool) {
	if elem == "" || elem == "." || elem == ".." || strings.ContainsAny(elem, "/\x00\n") {
		return "", false
	}
	return path.Join(root, elem), true
}

// KubeletVersions reads each Node's status.nodeInfo.kubeletVersion and
// checks its name: the versions that parse, canonical, by node; the
// values that do not, refused.
func KubeletVersions(nodes []corev1.Node) (map[string]string, []BadValue) {
	out := map[string]string{}
	var bad []BadValue
	for i := range nodes {
		n := &nodes[i]
		if b := CheckNodeName(n.Name); b != nil {
			bad = append(bad, *b)
			continue
		}
		v, b := ParseVersion(n.Name, "status.nodeInfo.kubeletVersion", n.Status.NodeInfo.KubeletVersion)
		if b != nil {
			bad = append(bad, *b)
			continue
		}
		out[n.Name] = v.String()
	}
	return out, bad
}

// Runtime is a node's container runtime as its kubelet reports it
// (status.nodeInfo.containerRuntimeVersion, "containerd://2.1.4").
type Runtime struct {
	Name    string
	Version catalog.Version
}

func (r Runtime) String() string { return r.Name + " " + r.Version.String() }

// runtimeRE is NAME://VERSION: a runtime name, then MAJOR.MINOR.PATCH
// with or without its v, then what distributions append to a package's
// version ("~ds1", "-0ubuntu1", "+k3s1"), which is dropped.
var runtimeRE = regexp.MustCompile(`^([A-Za-z0-9][A-Za-z0-9._-]{0,62})://v?([0-9]{1,9})\.([0-9]{1,9})\.([0-9]{1,9})([-+~][0-9A-Za-z.+~_-]{0,64})?$`)

// ParseRuntime reads a node's status.nodeInfo.containerRuntimeVersion;
// an empty value (a kubelet that has not reached its runtime) is the
// zero Runtime.
func ParseRuntime(node, s string) (Runtime, *BadValue) {
	if s == "" {
		return Runtime{}, nil
	}
	m := runtimeRE.FindStringSubmatch(s)
	if m == nil {
		return Runtime{}, &BadValue{Node: node, Field: "status.nodeInfo.containerRuntimeVersion", Value: s, Reason: "want RUNTIME://MAJOR.MINOR.PATCH, as a kubelet reports containerd://2.1.4"}
	}
	var n [3]int
	for i := range n {
		n[i], _ = strconv.Atoi(m[2+i]) // nine digits at most: always fits
	}
	return Runtime{Name: m[1], Version: catalog.Version{Major: n[0], Minor: n[1], Patch: n[2]}}, nil
}

// MarshalText writes a Runtime as String does ("containerd v2.1.4").
func (r Runtime) MarshalText() ([]byte, error) { return []byte(r.String()), nil }
