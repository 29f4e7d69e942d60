package kubeletcompat

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/dump"

	"github.com/kubelift/kubelift/internal/catalog"
)

func hasher(t *testing.T, v string) *Hasher {
	t.Helper()
	c, err := catalog.Default()
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHasher(c, v)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// The sample container of TestHashContainer in
// pkg/kubelet/container/helpers_test.go.
var sample = corev1.Container{
	Name:  "test_container",
	Image: "foo/image:v1",
	Args:  []string{"/bin/sh", "-c", "echo abc"},
	Ports: []corev1.ContainerPort{{ContainerPort: 8001}},
}

// Upstream's own vectors at the release tags (helpers_test.go).
func TestUpstreamVectors(t *testing.T) {
	for _, tc := range []struct {
		version string
		want    uint64
	}{
		{"v1.28.15", 0x3c42280f},
		{"v1.29.15", 0x3c42280f},
		{"v1.30.14", 0x3c42280f},
		{"v1.31.4", 0x8e45cbd0},
		{"v1.34.4", 0x8e45cbd0},
	} {
		got, err := hasher(t, tc.version).Hash(&sample)
		if err != nil || got != tc.want {
			t.Errorf("%s: Hash = %#x, %v; upstream test says %#x", tc.version, got, err, tc.want)
		}
	}
	// TestHashContainerWithoutResources at v1.30.14.
	cpu100m, cpu200m := resource.MustParse("100m"), resource.MustParse("200m")
	mem100M, mem200M := resource.MustParse("100Mi"), resource.MustParse("200Mi")
	cpuRestart := corev1.ContainerResizePolicy{ResourceName: corev1.ResourceCPU, RestartPolicy: corev1.RestartContainer}
	memNot := corev1.ContainerResizePolicy{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.NotRequired}
	cpuNot := corev1.ContainerResizePolicy{ResourceName: corev1.ResourceCPU, RestartPolicy: corev1.NotRequired}
	memRestart := corev1.ContainerResizePolicy{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.RestartContainer}
	burstable := corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceCPU: cpu200m, corev1.ResourceMemory: mem200M},
		Requests: corev1.ResourceList{corev1.ResourceCPU: cpu100m, corev1.ResourceMemory: mem100M},
	}
	for _, tc := range []struct {
		policy []corev1.ContainerResizePolicy
		want   uint64
	}{
		{[]corev1.ContainerResizePolicy{cpuRestart, memNot}, 0x5f62cb4c},
		{[]corev1.ContainerResizePolicy{cpuNot, memRestart}, 0xcdab9e00},
	} {
		c := &corev1.Container{Name: "foo", Image: "bar", Resources: burstable, ResizePolicy: tc.policy}
		got, ok, err := hasher(t, "v1.30.14").HashWithoutResources(c)
		if err != nil || !ok || got != tc.want {
			t.Errorf("HashWithoutResources = %#x, %v, %v; upstream says %#x", got, ok, err, tc.want)
		}
		if c.Resources.Limits == nil {
			t.Error("HashWithoutResources changed its argument")
		}
		if _, ok, _ := hasher(t, "v1.31.4").HashWithoutResources(c); ok {
			t.Error("1.31 has no hashWithoutResources")
		}
	}
}

// The formula in upgrade-facts.md: spew of a []byte is "([]uint8)[b1 b2 ...]",
// over encoding/json's output: keys sorted, <, > and & escaped.
func TestSpewFormula(t *testing.T) {
	b, _ := json.Marshal(map[string]string{"name": "<a&b>", "image": "é"})
	if string(b) != `{"image":"é","name":"\u003ca\u0026b\u003e"}` {
		t.Fatalf("json.Marshal = %s", b)
	}
	parts := make([]string, len(b))
	for i, x := range b {
		parts[i] = fmt.Sprint(x)
	}
	want := "([]uint8)[" + strings.Join(parts, " ") + "]"
	if got := dump.ForHash(b); got != want {
		t.Fatalf("dump.ForHash = %q\nformula     = %q", got, want)
	}
	h := fnv.New32a()
	h.Write([]byte(want))
	if got, _ := hashJSON(map[string]string{"name": "<a&b>", "image": "é"}); got != uint64(h.Sum32()) {
		t.Errorf("hashJSON %#x, formula %#x", got, h.Sum32())
	}
}

func TestUnsupportedEraAndLabels(t *testing.T) {
	c, _ := catalog.Default()
	if _, err := NewHasher(c, "v1.15.12"); !errors.Is(err, ErrUnsupportedEra) {
		t.Errorf("1.15: %v", err)
	}
	if _, err := NewHasher(c, "v1.5.0"); !errors.Is(err, catalog.ErrNoHashEra) {
		t.Errorf("1.5: %v", err)
	}
	if Label(0x3c42280f) != "3c42280f" || Label(0xa) != "a" || ParseLabel("3c42280f") != 0x3c42280f || ParseLabel("") != 0 || ParseLabel("zz") != 0 {
		t.Error("label format")
	}
}
