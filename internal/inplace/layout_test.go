package inplace

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// rooms are the engine's packages below internal/inplace and the rooms
// each may import (docs/development.md, "The engine's rooms"): only
// downward, never the facade. A room not listed here fails the test, so
// a new one says where it stands.
var rooms = map[string][]string{
	"release":                 nil,
	"record":                  {"release"},
	"drain":                   nil,
	"nodeops":                 {"release"},
	"stage":                   {"release"},
	"preflight":               {"coredns", "etcd", "record", "release", "removedapis", "stage", "window", "workloads"},
	"preflight/preflighttest": {"preflight", "release"},
	"compat":                  {"preflight", "release"},
	"versions":                nil,
	"workloads":               nil,
	"window":                  nil,
	"nodestack":               {"nodeops", "preflight", "release", "verify"},
	"coredns":                 nil,
	"etcd":                    {"nodeops", "release"},
	"removedapis":             nil,
	"resolve":                 {"preflight", "record"},
	"verify":                  {"nodeops", "record"},
	"runbook":                 {"coredns", "drain", "driver", "driver/binary", "driver/kubeadm", "etcd", "nodeops", "nodestack", "preflight", "record", "release", "resolve", "stage", "verify", "window", "workloads"},
	"driver":                  {"nodeops", "preflight", "record", "release"},
	"driver/drivertest":       {"driver", "nodeops"},
	"driver/binary":           {"driver", "nodeops", "preflight", "record", "release"},
	"driver/kubeadm":          {"driver", "nodeops", "preflight", "record", "release"},
}

const module = "github.com/kubelift/kubelift/internal/inplace"

// The rooms import only downward, no room holds more than 2,000 lines of
// non-test Go, no engine file outgrows 500 lines, and no function 80.
func TestRoomsImportOnlyDownward(t *testing.T) {
	var dirs []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && p != "." {
			dirs = append(dirs, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, dir := range dirs {
		allowed, ok := rooms[dir]
		if !ok {
			t.Errorf("internal/inplace/%s is not among the rooms this test knows: add it with what it may import", dir)
			continue
		}
		seen++
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range parsed.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				switch room, below := strings.CutPrefix(p, module+"/"); {
				case p == module:
					t.Errorf("%s imports the facade, internal/inplace", f)
				case below && !slices.Contains(allowed, room):
					t.Errorf("%s imports internal/inplace/%s; room %s may import only %v", f, room, dir, allowed)
				}
			}
		}
	}
	if seen != len(rooms) {
		t.Errorf("found %d of the %d rooms", seen, len(rooms))
	}
	var files []string
	for _, dir := range append(dirs, ".") {
		more, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, more...)
	}
	perRoom := map[string]int{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n := strings.Count(string(b), "\n")
		if n > 500 {
			t.Errorf("%s has %d lines: split it (at most 500)", f, n)
		}
		perRoom[filepath.Dir(f)] += n
		fset := token.NewFileSet()
		parsed, err := parser.ParseFile(fset, f, b, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range parsed.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok {
				if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > 80 {
					t.Errorf("%s: func %s has %d lines: name its steps (at most 80)", f, fd.Name.Name, n)
				}
			}
		}
	}
	for room, n := range perRoom {
		if n > 2000 {
			t.Errorf("room %s holds %d lines of non-test Go: give a concern of it a room of its own (at most 2,000)", room, n)
		}
	}
}
