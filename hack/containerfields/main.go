//go:build ignore

// Command containerfields writes internal/kubeletcompat/containerfields.json:
// for each minor from 1.16 on, the JSON field tree of core/v1 Container in
// that release's k8s.io/api. A kubelet of the JSON hash eras hashes the
// container as its own API type re-marshals it, so fields its release did
// not know are not in its hash; kubeletcompat prunes the linked type's JSON
// to these trees. Minors 1.16 to 1.30 are the kubelets themselves; 1.31 on
// are kubelift's hash-skip kubelets, which compute the old eras' hash with
// their own type. Run from the repository root after bumping k8s.io/api
// (add the new minor to defaultVersions):
//
//	go run hack/containerfields/main.go [-o FILE] [k8s.io/api VERSION...]
//
// It downloads each k8s.io/api version with `go mod download` outside any
// module (module cache only; kubelift's go.mod and go.sum do not change)
// and reads core/v1/types.go with go/ast, from struct Container through the
// struct types of that file behind pointers, slices and embedded fields;
// other packages' types (resource.Quantity, intstr.IntOrString, metav1) and
// maps are leaves. Consecutive minors with the same tree share one entry.
// It also says on stderr where a field's Go type or json tag options differ
// from the previous version's: pruning assumes a kept field marshals to the
// same bytes in every release.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
)

// The newest patch of each minor the module proxy serves. Up to 0.30,
// `go list -m -versions k8s.io/api` lists only some releases (none of
// 0.16, 0.18, 0.19), but the proxy serves each minor's final patch, except
// v0.18.20; from 0.31 on, the newest listed. A patch release does not
// change the API types (checked for 0.31 to 0.36: the catalog's patches
// give the same trees as these).
var defaultVersions = []string{
	"v0.16.15", "v0.17.17", "v0.18.19", "v0.19.16", "v0.20.15",
	"v0.21.14", "v0.22.17", "v0.23.17", "v0.24.17", "v0.25.16",
	"v0.26.15", "v0.27.16", "v0.28.15", "v0.29.15", "v0.30.14",
	"v0.31.14", "v0.32.13", "v0.33.13", "v0.34.13", "v0.35.10",
	"v0.36.6", "v0.37.2",
}

// field is a JSON key of the tree; Fields is nil for a leaf. It is written
// as "name" for a leaf and {"name":[...]} for a struct.
type field struct {
	Name   string
	Fields []field
}

func (f field) MarshalJSON() ([]byte, error) {
	if f.Fields == nil {
		return json.Marshal(f.Name)
	}
	return json.Marshal(map[string][]field{f.Name: f.Fields})
}

type group struct {
	Minors    []string `json:"minors"`
	API       []string `json:"api"`
	Container []field  `json:"container"`
}

func main() {
	out := flag.String("o", "internal/kubeletcompat/containerfields.json", "output file")
	flag.Parse()
	versions := flag.Args()
	if len(versions) == 0 {
		versions = defaultVersions
	}
	if err := run(*out, versions); err != nil {
		fmt.Fprintln(os.Stderr, "containerfields:", err)
		os.Exit(1)
	}
}

func run(out string, versions []string) error {
	var groups []group
	var prev map[string]string
	for _, v := range versions {
		minor, ok := strings.CutPrefix(v, "v0.")
		minor, _, ok2 := strings.Cut(minor, ".")
		if !ok || !ok2 {
			return fmt.Errorf("%s: want v0.MINOR.PATCH", v)
		}
		dir, err := download(v)
		if err != nil {
			return err
		}
		p, err := parse(filepath.Join(dir, "core", "v1", "types.go"))
		if err != nil {
			return fmt.Errorf("k8s.io/api@%s: %w", v, err)
		}
		sigs := map[string]string{}
		tree, err := p.fields("Container", "", sigs, nil)
		if err != nil {
			return fmt.Errorf("k8s.io/api@%s: %w", v, err)
		}
		for _, path := range slices.Sorted(maps.Keys(sigs)) {
			if old, ok := prev[path]; ok && old != sigs[path] {
				fmt.Fprintf(os.Stderr, "k8s.io/api@%s: %s: %s, was %s\n", v, path, sigs[path], old)
			}
		}
		prev = sigs
		if n := len(groups); n > 0 && reflect.DeepEqual(groups[n-1].Container, tree) {
			groups[n-1].Minors = append(groups[n-1].Minors, "v1."+minor)
			groups[n-1].API = append(groups[n-1].API, v)
			continue
		}
		groups = append(groups, group{Minors: []string{"v1." + minor}, API: []string{v}, Container: tree})
	}
	// One group a line: small, and a diff shows which minors changed.
	var b bytes.Buffer
	b.WriteString("[\n")
	for i, g := range groups {
		line, err := json.Marshal(g)
		if err != nil {
			return err
		}
		b.Write(line)
		if i < len(groups)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("]\n")
	return os.WriteFile(out, b.Bytes(), 0o644)
}

// download returns the module cache directory of k8s.io/api@v. It runs
// outside any module so that no go.mod or go.sum changes.
func download(v string) (string, error) {
	tmp, err := os.MkdirTemp("", "containerfields")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("go", "mod", "download", "-json", "k8s.io/api@"+v)
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, runErr := cmd.Output()
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(b, &info); err != nil || info.Error != "" || info.Dir == "" {
		return "", fmt.Errorf("go mod download k8s.io/api@%s: %s %v %s", v, info.Error, runErr, stderr.Bytes())
	}
	return info.Dir, nil
}

type pkg struct{ types map[string]ast.Expr }

func parse(file string) (*pkg, error) {
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	p := &pkg{types: map[string]ast.Expr{}}
	for _, d := range f.Decls {
		if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.TYPE {
			for _, s := range gd.Specs {
				ts := s.(*ast.TypeSpec)
				p.types[ts.Name.Name] = ts.Type
			}
		}
	}
	return p, nil
}

var builtin = map[string]bool{"string": true, "bool": true, "byte": true, "int": true, "int32": true, "int64": true, "uint32": true, "uint64": true, "float64": true}

// fields returns the JSON fields of the struct type name, following
// encoding/json's rules: unexported and "-" fields skipped, an embedded
// struct without a json name promoted into its parent. sigs records each
// path's Go type and tag options.
func (p *pkg) fields(name, path string, sigs map[string]string, seen []string) ([]field, error) {
	if slices.Contains(seen, name) {
		return nil, fmt.Errorf("%s: recursive type %s", path, name)
	}
	st, ok := p.types[name].(*ast.StructType)
	if !ok {
		return nil, fmt.Errorf("%s: %s is not a struct in types.go", path, name)
	}
	seen = append(seen, name)
	out := []field{}
	for _, f := range st.Fields.List {
		tag := ""
		if f.Tag != nil {
			tag = reflect.StructTag(strings.Trim(f.Tag.Value, "`")).Get("json")
		}
		if tag == "-" {
			continue
		}
		jsonName, opts, _ := strings.Cut(tag, ",")
		if len(f.Names) == 0 { // embedded
			if jsonName == "" {
				inner, err := p.embedded(f.Type, path, sigs, seen)
				if err != nil {
					return nil, err
				}
				out = append(out, inner...)
				continue
			}
			f.Names = []*ast.Ident{ast.NewIdent(types.ExprString(f.Type))}
		}
		for _, n := range f.Names {
			if !n.IsExported() {
				continue
			}
			key := jsonName
			if key == "" {
				key = n.Name
			}
			sigs[path+"."+key] = types.ExprString(f.Type) + " `" + opts + "`"
			sub, err := p.subfields(f.Type, path+"."+key, sigs, seen)
			if err != nil {
				return nil, err
			}
			out = append(out, field{Name: key, Fields: sub})
		}
	}
	return out, nil
}

func (p *pkg) embedded(t ast.Expr, path string, sigs map[string]string, seen []string) ([]field, error) {
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	id, ok := t.(*ast.Ident)
	if !ok {
		return nil, fmt.Errorf("%s: embedded %s from another package", path, types.ExprString(t))
	}
	return p.fields(id.Name, path, sigs, seen)
}

// subfields returns the fields under a field of type t, or nil for a leaf.
func (p *pkg) subfields(t ast.Expr, path string, sigs map[string]string, seen []string) ([]field, error) {
	switch t := t.(type) {
	case *ast.StarExpr:
		return p.subfields(t.X, path, sigs, seen)
	case *ast.ArrayType:
		if id, ok := t.Elt.(*ast.Ident); ok && id.Name == "byte" {
			return nil, nil // base64 string
		}
		return p.subfields(t.Elt, path, sigs, seen)
	case *ast.MapType, *ast.SelectorExpr:
		return nil, nil
	case *ast.Ident:
		if builtin[t.Name] {
			return nil, nil
		}
		def, ok := p.types[t.Name]
		if !ok {
			return nil, fmt.Errorf("%s: type %s not in types.go", path, t.Name)
		}
		if _, ok := def.(*ast.StructType); ok {
			return p.fields(t.Name, path, sigs, seen)
		}
		return p.subfields(def, path, sigs, seen)
	}
	return nil, fmt.Errorf("%s: unexpected type %s", path, types.ExprString(t))
}
