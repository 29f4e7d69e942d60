package kubeletcompat

import (
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubelift/kubelift/pkg/hashskip"
)

// PredictOptions say which kubelet the node is about to run.
type PredictOptions struct {
	Target *Hasher
	// InPlacePodVerticalScaling is the target kubelet's feature gate (1.27
	// to 1.30 compare hashWithoutResources too when it is on).
	InPlacePodVerticalScaling bool
	// Cache is the hash-skip file that will be on the node; nil: none.
	Cache *hashskip.File
	// RecreateStatic: the target gives static pods new UIDs (see
	// StaticPodsRecreated), so their containers are all started anew.
	RecreateStatic bool
}

// Prediction is what the target kubelet will do with one running container.
type Prediction struct {
	Node        string `json:"node"`
	Namespace   string `json:"namespace"`
	Pod         string `json:"pod"`
	Container   string `json:"container"`
	ContainerID string `json:"containerID"`
	Init        bool   `json:"init,omitempty"`
	Recorded    string `json:"recordedHash"`
	Expected    string `json:"expectedHash"`
	// Changed: the recorded hash differs from what the target computes.
	Changed bool `json:"changed"`
	// Protected: changed, but the hash-skip cache keeps it running.
	Protected bool `json:"protected"`
	// Restart: the target kubelet restarts it ("definition changed").
	Restart bool `json:"restart"`
	// Static: the container is a static pod's (matched through its mirror
	// pod); Recreated: the target kubelet kills it with its pod and starts
	// the pod anew under a new UID, whatever the hashes say.
	Static    bool `json:"static,omitempty"`
	Recreated bool `json:"recreated,omitempty"`
}

// Predict compares, for every running container the kubelet created, the
// hash its runtime recorded with what the target kubelet computes for the
// pod's current spec, and applies the hash-skip rule, exactly as
// computePodActions does. running maps node name to its runtime's
// containers; pods are matched by UID (a mirror pod by its static pod's
// UID) and containers by name.
func Predict(pods []corev1.Pod, running map[string][]RuntimeContainer, opts PredictOptions) ([]Prediction, error) {
	ptrs := make([]*corev1.Pod, len(pods))
	for i := range pods {
		ptrs[i] = &pods[i]
	}
	return PredictPods(ptrs, running, opts)
}

// PredictPods is Predict over pods held elsewhere (a plan's pods of one
// node, indexed without copying them).
func PredictPods(pods []*corev1.Pod, running map[string][]RuntimeContainer, opts PredictOptions) ([]Prediction, error) {
	byUID := ByRuntimeUID(pods)
	var out []Prediction
	for node, containers := range running {
		for _, rc := range containers {
			if !rc.Running {
				continue
			}
			pod := byUID[rc.PodUID]
			if pod == nil {
				continue // not in the API (gone, or a static pod with no mirror pod yet)
			}
			spec, init := findContainer(pod, rc.Name)
			if spec == nil {
				continue
			}
			expected, err := opts.Target.Hash(spec)
			if err != nil {
				return nil, err
			}
			p := Prediction{Node: node, Namespace: pod.Namespace, Pod: pod.Name, Container: rc.Name, ContainerID: rc.ID, Init: init,
				Recorded: rc.Hash, Expected: Label(expected)}
			p.Changed = ParseLabel(rc.Hash) != expected
			if p.Changed && opts.InPlacePodVerticalScaling {
				// 1.27-1.30: a change confined to resources does not restart.
				if wr, ok, err := opts.Target.HashWithoutResources(spec); err != nil {
					return nil, err
				} else if ok && ParseLabel(rc.HashWithoutResources) == wr {
					p.Changed = false
				}
			}
			_, p.Static = StaticUID(pod)
			if p.Static && opts.RecreateStatic {
				p.Recreated = true
				out = append(out, p)
				continue
			}
			// The dual-era rule: kept when the recorded hash is the old
			// kubelet's era's hash of the spec as it is now.
			p.Protected = p.Changed && opts.Cache.Keep(ParseLabel(rc.Hash), func(era string) (uint64, bool) {
				h, err := (&Hasher{Version: opts.Target.Version, Era: era}).Hash(spec)
				return h, err == nil
			})
			p.Restart = p.Changed && !p.Protected
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		if a.Namespace+"/"+a.Pod != b.Namespace+"/"+b.Pod {
			return a.Namespace+"/"+a.Pod < b.Namespace+"/"+b.Pod
		}
		return a.Container < b.Container
	})
	return out, nil
}

// findContainer returns the spec of a running container: a regular one,
// or an init container that keeps running (a sidecar, restartPolicy
// Always), which the kubelet compares by hash too.
func findContainer(pod *corev1.Pod, name string) (*corev1.Container, bool) {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i], false
		}
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if c.Name == name && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			return c, true
		}
	}
	return nil, false
}
