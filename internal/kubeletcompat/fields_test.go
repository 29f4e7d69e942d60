package kubeletcompat

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubelift/kubelift/internal/catalog"
)

// linkedFields is the field tree of the linked type t, by the generator's
// rules (encoding/json's): unexported and "-" fields skipped, an embedded
// struct without a json name promoted; core/v1 structs are followed through
// pointers and slices, everything else is a leaf.
func linkedFields(t reflect.Type) []field {
	out := []field{}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" || (!sf.IsExported() && !sf.Anonymous) {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := sf.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice || ft.Kind() == reflect.Array {
			if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Uint8 {
				break // []byte is a base64 string
			}
			ft = ft.Elem()
		}
		local := ft.Kind() == reflect.Struct && ft.PkgPath() == reflect.TypeFor[corev1.Container]().PkgPath()
		if sf.Anonymous && name == "" && local {
			out = append(out, linkedFields(ft)...)
			continue
		}
		if name == "" {
			name = sf.Name
		}
		f := field{Name: name}
		if local {
			f.Fields = linkedFields(ft)
		}
		out = append(out, f)
	}
	return out
}

// within reports where tree is not an ordered part of linked: every key
// present, in the same order, a struct where linked has a struct.
func within(tree, linked []field, path string) []string {
	var bad []string
	next := 0
	for _, f := range tree {
		i := next
		for i < len(linked) && linked[i].Name != f.Name {
			i++
		}
		if i == len(linked) {
			if find(linked, f.Name) != nil {
				bad = append(bad, path+f.Name+": out of order")
			} else {
				bad = append(bad, path+f.Name+": missing")
			}
			continue
		}
		next = i + 1
		switch l := linked[i]; {
		case (f.Fields == nil) != (l.Fields == nil):
			bad = append(bad, path+f.Name+": leaf in one, struct in the other")
		case f.Fields != nil:
			bad = append(bad, within(f.Fields, l.Fields, path+f.Name+".")...)
		}
	}
	return bad
}

// Pruning keeps only a release's fields: if the linked k8s.io/api ever
// renamed, removed or reordered one, a hash would silently change. And the
// newest tree must be the linked type's (containerfields.json regenerated
// after a bump): kubelift's hash-skip kubelets hash the old eras with their
// own type.
func TestFieldTreesWithinLinkedType(t *testing.T) {
	linked := linkedFields(reflect.TypeFor[corev1.Container]())
	trees, err := containerFields()
	if err != nil {
		t.Fatal(err)
	}
	for minor := 16; minor <= 30; minor++ {
		if _, ok := trees[fmt.Sprintf("v1.%d", minor)]; !ok {
			t.Errorf("no field tree for v1.%d", minor)
		}
	}
	for minor, tree := range trees {
		for _, bad := range within(tree, linked, "") {
			t.Errorf("%s: %s", minor, bad)
		}
	}
	newest := 0
	for minor := range trees {
		var n int
		fmt.Sscanf(minor, "v1.%d", &n)
		newest = max(newest, n)
	}
	if !reflect.DeepEqual(trees[fmt.Sprintf("v1.%d", newest)], linked) {
		t.Errorf("the newest tree, v1.%d's, is not the linked k8s.io/api's: go run hack/containerfields/main.go", newest)
	}
}

// Every catalog release can hash the JSON eras: predict's dual-era check
// hashes the old era at the target's version.
func TestFieldTreeForEveryCatalogRelease(t *testing.T) {
	c, err := catalog.Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range c.VersionList() {
		pv, _ := catalog.ParseVersion(v)
		if _, err := (&Hasher{Version: pv, Era: catalog.EraJSON}).Hash(&sample); err != nil {
			t.Errorf("%s: %v", v, err)
		}
	}
}

func TestNoFieldTree(t *testing.T) {
	for _, v := range []catalog.Version{{Major: 1, Minor: 15}, {Major: 1, Minor: 99}, {Major: 2, Minor: 20}} {
		h := &Hasher{Version: v, Era: catalog.EraJSONWithoutResources}
		if _, err := h.Hash(&sample); !errors.Is(err, ErrNoFieldTree) || !strings.Contains(err.Error(), v.String()) {
			t.Errorf("%s Hash: %v", v, err)
		}
		if _, ok, err := h.HashWithoutResources(&sample); ok || !errors.Is(err, ErrNoFieldTree) {
			t.Errorf("%s HashWithoutResources: %v %v", v, ok, err)
		}
	}
}

// Keys go out in the marshalled order (never sorted), and kept values keep
// their exact bytes (HTML escapes, numbers).
func TestPrune(t *testing.T) {
	in := `{"b":1.50,"a":{"y":[1,2],"x":"\u003c\u0026\u003e","z":3},"c":[{"k":1,"j":{"q":2}},{"j":null}],"d":{}}`
	tree := []field{{Name: "a", Fields: []field{{Name: "x"}, {Name: "y"}}}, {Name: "b"}, {Name: "c", Fields: []field{{Name: "j"}}}}
	want := `{"b":1.50,"a":{"y":[1,2],"x":"\u003c\u0026\u003e"},"c":[{"j":{"q":2}},{"j":null}]}`
	got, err := prune([]byte(in), tree)
	if err != nil || string(got) != want {
		t.Errorf("prune = %s, %v\nwant   %s", got, err, want)
	}
}

// A kubelet hashes only the fields its release knows: fields newer than
// it change nothing, and the same fields change the hash of a kubelet that
// knows them.
func TestHashIgnoresNewerFields(t *testing.T) {
	sig, mode, proto := corev1.Signal("SIGUSR1"), corev1.GRPCProbeMode("Serving"), corev1.HTTPProtocol("HTTP2")
	// without is what a 1.30 kubelet decodes from with: the same container
	// with the newer fields gone (their parents stay, maybe empty).
	without := corev1.Container{
		Name: "app", Image: "app:1",
		Env:            []corev1.EnvVar{{Name: "A", Value: "<a&b>"}, {Name: "F", ValueFrom: &corev1.EnvVarSource{}}},
		Resources:      corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0.5")}, Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
		VolumeMounts:   []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
		LivenessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 9000}}, PeriodSeconds: 5},
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8080)}}},
		Lifecycle:      &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"stop"}}}},
	}
	with := without.DeepCopy()
	with.Env[1].ValueFrom.FileKeyRef = &corev1.FileKeySelector{VolumeName: "cfg", Path: "env", Key: "F"}
	with.Resources.Claims[0].Request = "r0"
	with.VolumeMounts[0].BindMountOptions = []string{"noexec"}
	with.LivenessProbe.GRPC.Mode = &mode
	with.ReadinessProbe.HTTPGet.Protocol = &proto
	with.Lifecycle.StopSignal = &sig
	with.RestartPolicyRules = []corev1.ContainerRestartRule{{Action: "Restart", ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: "In", Values: []int32{42}}}}
	for _, v := range []string{"v1.28.15", "v1.30.14"} {
		h := hasher(t, v)
		a, err1 := h.Hash(&without)
		b, err2 := h.Hash(with)
		if err1 != nil || err2 != nil || a != b {
			t.Errorf("%s: Hash %s without the newer fields, %s with them (%v, %v)", v, Label(a), Label(b), err1, err2)
		}
		a, _, err1 = h.HashWithoutResources(&without)
		b, _, err2 = h.HashWithoutResources(with)
		if err1 != nil || err2 != nil || a != b {
			t.Errorf("%s: HashWithoutResources %s without, %s with (%v, %v)", v, Label(a), Label(b), err1, err2)
		}
	}
	// The hash-skip kubelet of the linked minor knows them all: each one
	// counts in its old-era hash.
	latest := &Hasher{Version: catalog.Version{Major: 1, Minor: 37}, Era: catalog.EraJSON}
	if a, _ := latest.Hash(&without); a == mustHash(t, latest, with) {
		t.Error("v1.37: the newer fields do not change the hash")
	}

	// resizePolicy and restartPolicy came in 1.27 and 1.28.
	always := corev1.ContainerRestartPolicyAlways
	resized := without.DeepCopy()
	resized.ResizePolicy = []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceCPU, RestartPolicy: corev1.NotRequired}}
	sidecar := without.DeepCopy()
	sidecar.RestartPolicy = &always
	for _, tc := range []struct {
		version, field string
		c              *corev1.Container
		same           bool
	}{
		{"v1.26.15", "resizePolicy", resized, true},
		{"v1.27.16", "resizePolicy", resized, false},
		{"v1.28.15", "resizePolicy", resized, false},
		{"v1.27.16", "restartPolicy", sidecar, true},
		{"v1.28.15", "restartPolicy", sidecar, false},
	} {
		h := hasher(t, tc.version)
		if same := mustHash(t, h, &without) == mustHash(t, h, tc.c); same != tc.same {
			t.Errorf("%s: hash unchanged by %s = %v, want %v", tc.version, tc.field, same, tc.same)
		}
	}
}

func mustHash(t *testing.T, h *Hasher, c *corev1.Container) uint64 {
	t.Helper()
	got, err := h.Hash(c)
	if err != nil {
		t.Fatal(err)
	}
	return got
}
