package kubeletcompat

import (
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/pkg/hashskip"
)

func TestParseRuntimeOutput(t *testing.T) {
	read := func(name string) []byte {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	inspect, err := ParseCrictl(read("crictl-inspect.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(inspect) != 2 || !inspect[0].Running || inspect[1].Running || inspect[0].Hash != "3c42280f" ||
		inspect[0].HashWithoutResources != "3c42280f" || inspect[0].Pod != "web-0" || inspect[0].Namespace != "shop" ||
		inspect[0].PodUID != "6a1f3c2e-9b8d-4e7f-a6b5-c4d3e2f1a0b9" || inspect[0].Name != "test_container" ||
		!inspect[0].StartedAt.Equal(time.Date(2026, 11, 20, 9, 14, 3, 456789012, time.UTC)) {
		t.Errorf("crictl inspect: %+v", inspect)
	}
	ps, err := ParseCrictl(read("crictl-ps.json"))
	if err != nil {
		t.Fatal(err)
	}
	// The container without kubelet labels is left out; createdAt stands in for startedAt.
	if len(ps) != 1 || ps[0].Hash != "3c42280f" || !ps[0].StartedAt.Equal(time.Unix(0, 1795166043123456789)) {
		t.Errorf("crictl ps: %+v", ps)
	}
	docker, err := ParseDockerInspect(read("docker-inspect.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docker) != 1 || docker[0].Hash != "3c42280f" || docker[0].Name != "test_container" || !docker[0].Running {
		t.Errorf("docker inspect (sandbox left out): %+v", docker)
	}
	if _, err := ParseCrictl([]byte(`{"foo": 1}`)); err == nil {
		t.Error("accepted unrelated JSON")
	}
	if _, err := ParseCrictl([]byte(`{"status": {"id": "x", "labels": {"io.kubernetes.pod.uid": "u", "io.kubernetes.container.name": "c"}, "startedAt": "yesterday"}}`)); err == nil {
		t.Error("accepted a bad time")
	}
}

func TestPredict(t *testing.T) {
	old, target := hasher(t, "v1.30.14"), hasher(t, "v1.31.4")
	always := corev1.ContainerRestartPolicyAlways
	pod := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "shop", UID: types.UID("uid-1")},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "sidecar", Image: "proxy:1", RestartPolicy: &always}, {Name: "migrate", Image: "tool:1"}},
			Containers:     []corev1.Container{sample, {Name: "cache", Image: "redis:7"}},
		},
	}
	kubeletStart := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	before := kubeletStart.Add(-24 * time.Hour)
	rec := func(name string, h *Hasher, started time.Time) RuntimeContainer {
		spec, _ := findContainer(&pod, name)
		if spec == nil {
			spec = &corev1.Container{Name: name, Image: "tool:1"}
		}
		v, _ := h.Hash(spec)
		return RuntimeContainer{ID: "id-" + name, PodUID: "uid-1", Pod: "web-0", Namespace: "shop", Name: name, Running: true, StartedAt: started, Hash: Label(v)}
	}
	running := map[string][]RuntimeContainer{"worker-1": {
		rec("test_container", old, before),
		rec("cache", old, before),
		rec("sidecar", old, before),
		rec("cache", target, kubeletStart.Add(time.Minute)), // a second pod's container, created by the new kubelet below
	}}
	running["worker-1"][3].PodUID = "uid-2"
	pod2 := pod.DeepCopy()
	pod2.Name, pod2.UID = "web-1", "uid-2"
	pods := []corev1.Pod{pod, *pod2}

	// Without the cache: every container the 1.30 kubelet started restarts.
	got, err := Predict(pods, running, PredictOptions{Target: target})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("%d predictions: %+v", len(got), got)
	}
	restarts := 0
	for _, p := range got {
		if p.Restart {
			restarts++
		}
		if p.Container == "sidecar" && !p.Init {
			t.Error("sidecar not marked init")
		}
	}
	if restarts != 3 {
		t.Errorf("%d restarts without the cache, want 3: %+v", restarts, got)
	}
	// With the cache: none restarts; the container the new kubelet made was never changed.
	cache := &hashskip.File{OldKubeletVersion: "v1.30.14", OldHashEra: hashskip.EraJSONWithoutResources}
	got, _ = Predict(pods, running, PredictOptions{Target: target, Cache: cache})
	for _, p := range got {
		if p.Restart || p.Protected != p.Changed {
			t.Errorf("with cache: %+v", p)
		}
	}
	// A same-era upgrade (1.30.14 -> 1.30.15-like target in the same era) changes nothing.
	got, _ = Predict(pods, map[string][]RuntimeContainer{"worker-1": running["worker-1"][:3]}, PredictOptions{Target: old})
	for _, p := range got {
		if p.Changed {
			t.Errorf("same era: %+v", p)
		}
	}
	// A container whose spec really changed (new image) restarts even with the
	// cache when the new kubelet started it.
	changed := pod.DeepCopy()
	changed.Spec.Containers[1].Image = "redis:8"
	got, _ = Predict([]corev1.Pod{*changed}, map[string][]RuntimeContainer{"worker-1": {rec("cache", target, kubeletStart.Add(time.Minute))}},
		PredictOptions{Target: target, Cache: cache})
	if len(got) != 1 || !got[0].Restart {
		t.Errorf("new image on a container the new kubelet started: %+v", got)
	}
	// The dual-era rule has no blind spot: an image changed in place on a
	// container the OLD kubelet started restarts too, cache or not (its
	// recorded hash is not the old era's hash of the spec as it is now).
	got, _ = Predict([]corev1.Pod{*changed}, map[string][]RuntimeContainer{"worker-1": {rec("cache", old, before)}},
		PredictOptions{Target: target, Cache: cache})
	if len(got) != 1 || !got[0].Restart || got[0].Protected {
		t.Errorf("old container, changed image, cache present: %+v", got)
	}
	// Missing hash annotation reads as 0: changed.
	noHash := rec("cache", target, before)
	noHash.Hash = ""
	got, _ = Predict(pods, map[string][]RuntimeContainer{"w": {noHash}}, PredictOptions{Target: target})
	if len(got) != 1 || !got[0].Restart {
		t.Errorf("missing hash: %+v", got)
	}
}

func TestPredictInPlaceResizeGate(t *testing.T) {
	h := hasher(t, "v1.30.14")
	c := corev1.Container{Name: "app", Image: "app:1"}
	pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "n", UID: "u"}, Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}
	recorded, _ := h.Hash(&c)
	wr, _, _ := h.HashWithoutResources(&c)
	// Resources change after the container started.
	pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: mustQuantity("200m")}
	rc := RuntimeContainer{ID: "c", PodUID: "u", Name: "app", Running: true, StartedAt: time.Now(), Hash: Label(recorded), HashWithoutResources: Label(wr)}
	off, _ := Predict([]corev1.Pod{pod}, map[string][]RuntimeContainer{"n": {rc}}, PredictOptions{Target: h})
	on, _ := Predict([]corev1.Pod{pod}, map[string][]RuntimeContainer{"n": {rc}}, PredictOptions{Target: h, InPlacePodVerticalScaling: true})
	if !off[0].Restart || on[0].Restart {
		t.Errorf("gate off restart=%v (want true), gate on restart=%v (want false)", off[0].Restart, on[0].Restart)
	}
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }

// A static pod's containers carry the static pod's UID, which the API
// knows only as its mirror pod's annotation: they are matched through it,
// and a target of another minor recreates them, cache or not.
func TestPredictStaticPods(t *testing.T) {
	old, target := hasher(t, "v1.30.14"), hasher(t, "v1.31.4")
	mirror := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "edge-worker-1", Namespace: "kube-system", UID: "api-uid",
			Annotations: map[string]string{MirrorAnnotation: "static-uid", "kubernetes.io/config.source": "file"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{sample}},
	}
	v, _ := old.Hash(&mirror.Spec.Containers[0])
	running := map[string][]RuntimeContainer{"worker-1": {{ID: "c1", PodUID: "static-uid", Pod: mirror.Name, Namespace: mirror.Namespace,
		Name: sample.Name, Running: true, StartedAt: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), Hash: Label(v)}}}
	cache := &hashskip.File{OldKubeletVersion: "v1.30.14", OldHashEra: hashskip.EraJSONWithoutResources}

	got, err := Predict([]corev1.Pod{mirror}, running, PredictOptions{Target: target, Cache: cache, RecreateStatic: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !got[0].Static || !got[0].Recreated || got[0].Protected || got[0].Restart {
		t.Fatalf("static pod, new minor: %+v", got)
	}
	// A patch upgrade keeps the UID: the hash rules apply as to any pod.
	got, _ = Predict([]corev1.Pod{mirror}, running, PredictOptions{Target: old})
	if len(got) != 1 || !got[0].Static || got[0].Recreated || got[0].Changed {
		t.Fatalf("static pod, same minor: %+v", got)
	}
	// Matched by the annotation only: the mirror pod's own UID is not the runtime's.
	running["worker-1"][0].PodUID = "api-uid"
	if got, _ = Predict([]corev1.Pod{mirror}, running, PredictOptions{Target: old}); len(got) != 0 {
		t.Errorf("matched by the mirror pod's API UID: %+v", got)
	}
}

func TestStaticPodsRecreated(t *testing.T) {
	v := func(s string) catalog.Version { x, _ := catalog.ParseVersion(s); return x }
	for _, c := range []struct {
		from, to string
		want     bool
	}{{"v1.30.14", "v1.31.4", true}, {"v1.31.1", "v1.31.4", false}, {"v1.31.4", "v1.30.14", true}, {"v1.30.1", "v1.32.0", true}} {
		if got := StaticPodsRecreated(v(c.from), v(c.to)); got != c.want {
			t.Errorf("%s -> %s: %v, want %v", c.from, c.to, got, c.want)
		}
	}
}
