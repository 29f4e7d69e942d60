package kubeletcompat

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/kubelift/kubelift/internal/catalog"
)

// ErrNoFieldTree is returned when hashing in a JSON era for a kubelet minor
// whose k8s.io/api Container fields containerfields.json does not hold.
var ErrNoFieldTree = errors.New("containerfields.json has no Container field tree for this kubelet minor (hack/containerfields writes it)")

// containerfields.json holds, per minor, the JSON field tree of core/v1
// Container in that release's k8s.io/api; hack/containerfields writes it.
//
//go:embed containerfields.json
var containerFieldsJSON []byte

// field is one JSON key of a Container field tree: "name" in the file for a
// leaf (Fields nil), {"name": [...]} for a struct.
type field struct {
	Name   string
	Fields []field
}

func (f *field) UnmarshalJSON(b []byte) error {
	if json.Unmarshal(b, &f.Name) == nil {
		return nil
	}
	var m map[string][]field
	if err := json.Unmarshal(b, &m); err != nil || len(m) != 1 {
		return fmt.Errorf("field %s: want a name or {name: [fields]}", b)
	}
	for name, fields := range m {
		f.Name, f.Fields = name, fields
	}
	if f.Fields == nil {
		f.Fields = []field{}
	}
	return nil
}

// containerFields maps "v1.MINOR" to that minor's Container field tree.
var containerFields = sync.OnceValues(func() (map[string][]field, error) {
	var groups []struct {
		Minors    []string
		Container []field
	}
	if err := json.Unmarshal(containerFieldsJSON, &groups); err != nil {
		return nil, fmt.Errorf("containerfields.json: %w", err)
	}
	trees := map[string][]field{}
	for _, g := range groups {
		for _, m := range g.Minors {
			trees[m] = g.Container
		}
	}
	return trees, nil
})

// fieldTree returns the Container field tree of kubelet version v's API.
func fieldTree(v catalog.Version) ([]field, error) {
	trees, err := containerFields()
	if err != nil {
		return nil, err
	}
	tree, ok := trees[v.MinorString()]
	if !ok {
		return nil, fmt.Errorf("kubelet %s: %w", v, ErrNoFieldTree)
	}
	return tree, nil
}

// prune returns the JSON value b with only the object keys of fields, at
// every depth, keeping b's key order and b's bytes for every kept value: a
// kubelet marshals its own Container type, in struct order, and never sees
// the keys its API does not know.
func prune(b json.RawMessage, fields []field) (json.RawMessage, error) {
	switch {
	case len(b) > 0 && b[0] == '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(b, &elems); err != nil {
			return nil, err
		}
		out := []byte{'['}
		for i, e := range elems {
			e, err := prune(e, fields)
			if err != nil {
				return nil, err
			}
			if i > 0 {
				out = append(out, ',')
			}
			out = append(out, e...)
		}
		return append(out, ']'), nil
	case len(b) > 0 && b[0] == '{':
		dec := json.NewDecoder(bytes.NewReader(b))
		if _, err := dec.Token(); err != nil {
			return nil, err
		}
		out := []byte{'{'}
		for dec.More() {
			t, err := dec.Token()
			if err != nil {
				return nil, err
			}
			key, _ := t.(string)
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return nil, err
			}
			f := find(fields, key)
			if f == nil {
				continue
			}
			if f.Fields != nil {
				if v, err = prune(v, f.Fields); err != nil {
					return nil, err
				}
			}
			if len(out) > 1 {
				out = append(out, ',')
			}
			k, _ := json.Marshal(key)
			out = append(append(append(out, k...), ':'), v...)
		}
		return append(out, '}'), nil
	}
	return b, nil // a scalar or null: nothing to prune
}

func find(fields []field, name string) *field {
	for i := range fields {
		if fields[i].Name == name {
			return &fields[i]
		}
	}
	return nil
}
