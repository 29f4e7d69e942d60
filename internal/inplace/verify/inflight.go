package verify

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/record"
)

// InFlight is what a node's in-flight record carries of Node's inputs,
// taken before its kubelet is swapped: the version it moves from, the
// containers that ran and the pods.
func InFlight(from string, before map[string]nodeops.Container, pods map[types.UID]Pod) *record.InFlight {
	f := &record.InFlight{From: from, Containers: make(map[string]record.InFlightContainer, len(before)), Pods: make(map[types.UID]record.InFlightPod, len(pods))}
	for id, c := range before {
		f.Containers[id] = record.InFlightContainer{What: c.What, PID: c.PID}
	}
	for uid, p := range pods {
		f.Pods[uid] = record.InFlightPod{Name: p.Name, Phase: p.Phase, StaticUID: p.StaticUID, Owner: p.Owner}
	}
	return f
}

// FromInFlight is Node's inputs again, from a node's in-flight record
// (a resumed run verifies the node against what ran before the swap).
func FromInFlight(f *record.InFlight) (map[string]nodeops.Container, map[types.UID]Pod) {
	before := make(map[string]nodeops.Container, len(f.Containers))
	for id, c := range f.Containers {
		before[id] = nodeops.Container{What: c.What, PID: c.PID}
	}
	pods := make(map[types.UID]Pod, len(f.Pods))
	for uid, p := range f.Pods {
		pods[uid] = Pod{Name: p.Name, Phase: p.Phase, StaticUID: p.StaticUID, Owner: p.Owner}
	}
	return before, pods
}
