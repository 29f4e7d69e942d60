package upgradeapi

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/kubelift/kubelift/manifests"
)

func TestCheck(t *testing.T) {
	d, err := (&Spec{Version: "v1.31.4"}).Check()
	if err != nil || d.Settle != 15*time.Second || d.ReadyTimeout != 5*time.Minute || d.DrainTimeout != 2*time.Minute {
		t.Fatalf("defaults: %+v, %v", d, err)
	}
	d, err = (&Spec{Version: "v1.31.4", Settle: "0s", ReadyTimeout: "90s"}).Check()
	if err != nil || d.Settle != 0 || d.ReadyTimeout != 90*time.Second {
		t.Fatalf("durations: %+v, %v", d, err)
	}
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{Version: "1.31"}, `spec.version "1.31"`},
		{Spec{Version: "v1.31.4", Bundle: "sha256:abc"}, `spec.bundle "sha256:abc"`},
		{Spec{Version: "v1.31.4", MaxUnavailable: "ten"}, "spec.maxUnavailable"},
		{Spec{Version: "v1.31.4", Nodes: []string{"a"}, Selector: "pool=blue"}, "exclude each other"},
		{Spec{Version: "v1.31.4", Nodes: []string{"Bad_Node"}}, `spec.nodes: "Bad_Node"`},
		{Spec{Version: "v1.31.4", Selector: "pool in (("}, `spec.selector "pool in (("`},
		{Spec{Version: "v1.31.4", ReadyTimeout: "0s"}, `spec.readyTimeout "0s"`},
		{Spec{Version: "v1.31.4", Settle: "-1s"}, `spec.settle "-1s"`},
		{Spec{Version: "v1.31.4", DrainTimeout: "soon"}, `spec.drainTimeout "soon"`},
		{Spec{Version: "v1.31.4", Window: &MaintenanceWindow{Start: "22:00", End: "25:00"}}, `spec.window: end: "25:00"`},
		{Spec{Version: "v1.31.4", Window: &MaintenanceWindow{Start: "22:00", End: "22:00"}}, "empty window"},
		{Spec{Version: "v1.31.4", Window: &MaintenanceWindow{Days: []string{"Monday"}, Start: "22:00", End: "04:00"}}, `days: "Monday"`},
	} {
		if _, err := tc.spec.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error saying %q", tc.spec, err, tc.want)
		}
	}
}

func TestWindowOpen(t *testing.T) {
	// 2026-12-05 is a Saturday.
	at := func(day int, hm string) time.Time {
		c, _ := time.Parse("15:04", hm)
		return time.Date(2026, 12, day, c.Hour(), c.Minute(), 0, 0, time.UTC)
	}
	night := &MaintenanceWindow{Days: []string{"Sat"}, Start: "22:00", End: "04:00"}
	day := &MaintenanceWindow{Start: "09:00", End: "17:00"}
	for _, tc := range []struct {
		w    *MaintenanceWindow
		t    time.Time
		open bool
	}{
		{nil, at(5, "12:00"), true},
		{day, at(5, "09:00"), true},
		{day, at(5, "16:59"), true},
		{day, at(5, "17:00"), false},
		{day, at(5, "08:59"), false},
		{night, at(5, "22:00"), true},  // Saturday night
		{night, at(6, "03:59"), true},  // Sunday morning: Saturday's window
		{night, at(6, "04:00"), false}, // closed
		{night, at(6, "22:30"), false}, // Sunday night: not a window day
		{night, at(5, "03:00"), false}, // Saturday morning: Friday's window
		{night, at(5, "21:59").In(time.FixedZone("CET", 3600)), false},
	} {
		if got := tc.w.Open(tc.t); got != tc.open {
			t.Errorf("%v at %s: open %v, want %v", tc.w, tc.t, got, tc.open)
		}
	}
}

func TestDone(t *testing.T) {
	u := &Upgrade{ObjectMeta: metav1.ObjectMeta{Generation: 2}}
	for _, tc := range []struct {
		phase    string
		observed int64
		done     bool
	}{{"", 0, false}, {Running, 2, false}, {Complete, 1, true}, {Failed, 2, true}, {Failed, 1, false}} {
		u.Status.Phase, u.Status.ObservedGeneration = tc.phase, tc.observed
		if u.Done() != tc.done {
			t.Errorf("phase %q observed %d of 2: done %v, want %v", tc.phase, tc.observed, u.Done(), tc.done)
		}
	}
}

// An Upgrade the API returns that does not fit the types is refused,
// naming it.
func TestFromUnstructuredRefuses(t *testing.T) {
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kubelift.dev/v1alpha1", "kind": "Upgrade",
		"metadata": map[string]any{"name": "v1.31.4"}, "spec": map[string]any{"version": 131}}}
	if _, err := FromUnstructured(obj); err == nil || !strings.Contains(err.Error(), "upgrade v1.31.4") {
		t.Fatalf("a number for spec.version: %v", err)
	}
}

// The CRD's schema declares every field of the types, and no other:
// the API server prunes what it does not declare.
func TestCRDSchemaMatchesTypes(t *testing.T) {
	var crd struct {
		Spec struct {
			Group    string
			Versions []struct {
				Name    string
				Columns []map[string]any `json:"additionalPrinterColumns"`
				Schema  struct {
					OpenAPIV3Schema schemaProps `json:"openAPIV3Schema"`
				}
			}
		}
	}
	if err := yaml.Unmarshal(manifests.UpgradeCRD, &crd); err != nil {
		t.Fatal(err)
	}
	if crd.Spec.Group != Group || len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != Version {
		t.Fatalf("group %s versions %+v", crd.Spec.Group, crd.Spec.Versions)
	}
	v := crd.Spec.Versions[0]
	root := v.Schema.OpenAPIV3Schema.Properties
	for name, typ := range map[string]reflect.Type{"spec": reflect.TypeOf(Spec{}), "status": reflect.TypeOf(Status{})} {
		checkProps(t, name, root[name], typ)
	}
	for _, c := range v.Columns {
		for k := range c {
			if !slices.Contains([]string{"name", "type", "jsonPath", "description", "priority", "format"}, k) {
				t.Errorf("printer column %v: %q is no field of a column", c, k)
			}
		}
		if c["name"] == nil || c["jsonPath"] == nil || c["type"] == nil {
			t.Errorf("printer column %v: name, type and jsonPath are needed", c)
		}
	}
}

type schemaProps struct {
	Type       string
	Properties map[string]schemaProps
	Items      *schemaProps
}

// checkProps compares a schema's properties with a struct's JSON fields,
// down through structs, pointers and slices of structs.
func checkProps(t *testing.T, path string, s schemaProps, typ reflect.Type) {
	t.Helper()
	for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
		if typ.Kind() == reflect.Slice {
			if s.Items == nil {
				t.Errorf("%s: an array in Go, no items in the schema", path)
				return
			}
			s = *s.Items
		}
		typ = typ.Elem()
	}
	if typ.Kind() != reflect.Struct || typ == reflect.TypeOf(metav1.Time{}) {
		return
	}
	fields := map[string]bool{}
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		fields[name] = true
		p, ok := s.Properties[name]
		if !ok {
			t.Errorf("%s.%s: in the Go type, not in the schema", path, name)
			continue
		}
		checkProps(t, path+"."+name, p, typ.Field(i).Type)
	}
	for name := range s.Properties {
		if !fields[name] {
			t.Errorf("%s.%s: in the schema, not in the Go type", path, name)
		}
	}
}
