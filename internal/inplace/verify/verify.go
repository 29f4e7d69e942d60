// Package verify holds a node to kubelift's promise after its kubelet
// moved: every container that ran before still runs (same ID and, where
// the runtime's tasks are read, the same process), every pod is still
// there and not failed, and the static pods a kubelet of another minor
// starts anew under new UIDs run again.
package verify

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/upgradelock"
	"github.com/kubelift/kubelift/internal/waiter"
)

// Checker verifies nodes.
type Checker struct {
	Client kubernetes.Interface
	// Wait is every wait's clock; Timeout bounds the wait for static
	// pods recreated, and for an API server that cannot answer.
	Wait    waiter.Waiter
	Timeout time.Duration
	// RestartsAllowed: containers gone are no failure (--allow-restarts,
	// --drain).
	RestartsAllowed bool
}

// Node: every container that ran before the swap still runs (same
// IDs and, where the runtime's tasks were read, the same processes), and
// every pod is still there and not failed. Static pods are the exception
// the plan announced: a kubelet of another minor gives them new UIDs and
// so starts them anew; each that ran before must run again, recreated
// (a mirror pod naming a new static UID, Running, with as many containers
// of new IDs running as before) within Timeout; Node returns those
// recreated (ns/name, in order), and the containers counted (also when
// some restarted).
func (c Checker) Node(ctx context.Context, o *nodeops.Ops, to catalog.Version, before map[string]nodeops.Container, podsBefore map[types.UID]Pod) (Result, error) {
	var res Result
	after, err := o.ContainersWaiting(ctx)
	if err != nil {
		return res, err
	}
	recreate := true
	if fv, err := catalog.ParseVersion(o.From); err == nil {
		recreate = kubeletcompat.StaticPodsRecreated(fv, to)
	}
	static := map[string]*staticPod{} // by ns/name
	for _, p := range podsBefore {
		if p.StaticUID != "" && recreate && !p.Ended() {
			static[p.Name] = &staticPod{uid: p.StaticUID, running: p.Phase == corev1.PodRunning}
		}
	}
	for _, b := range before {
		if sp := static[b.Pod()]; sp != nil {
			sp.containers++
		}
	}
	gone := Gone(before, after, func(c nodeops.Container) bool { return static[c.Pod()] != nil })
	res.Containers = count(before, gone, static)
	if len(gone) > 0 && !c.RestartsAllowed {
		return res, &RestartedError{Node: o.Name, Containers: gone}
	}
	podsAfter, err := c.PodsOn(ctx, o.Name)
	if err != nil {
		return res, err
	}
	for uid, p := range podsBefore {
		if static[p.Name] != nil || p.Ended() {
			continue
		}
		if q, ok := podsAfter[uid]; !ok {
			return res, fmt.Errorf("node %s: pod %s is gone (evicted?)", o.Name, p)
		} else if q.Phase == corev1.PodFailed {
			return res, fmt.Errorf("node %s: pod %s failed", o.Name, q)
		}
	}
	// Only a static pod that ran before must run again (one that was
	// Pending stays the kubelet's business).
	for name, sp := range static {
		if !sp.running {
			delete(static, name)
		}
	}
	if len(static) == 0 {
		return res, nil
	}
	if err := c.waitStatic(ctx, o, before, static); err != nil {
		return res, fmt.Errorf("node %s: static pods not recreated within %s: %w", o.Name, c.Timeout, err)
	}
	res.Recreated = slices.Sorted(maps.Keys(static))
	return res, nil
}

// Result is what Node found.
type Result struct {
	// Recreated are the static pods started anew (ns/name).
	Recreated []string
	// Containers counts the containers that ran before the swap (nil
	// when they could not be listed).
	Containers *record.Containers
}

// count is what became of the containers of before: gone restarted,
// those of static pods recreated, the others kept.
func count(before map[string]nodeops.Container, gone []string, static map[string]*staticPod) *record.Containers {
	n := &record.Containers{Before: len(before), Restarted: len(gone)}
	for _, b := range before {
		if static[b.Pod()] != nil {
			n.Recreated++
		}
	}
	n.Kept = n.Before - n.Restarted - n.Recreated
	return n
}

// Gone are the containers of before (but those skip says to pass over)
// that no longer run in after: the container, or its process (a
// container restarted in place keeps its ID but not its PID), in order.
func Gone(before, after map[string]nodeops.Container, skip func(nodeops.Container) bool) []string {
	var gone []string
	for id, b := range before {
		if skip != nil && skip(b) {
			continue
		}
		a, ok := after[id]
		switch {
		case !ok:
			gone = append(gone, b.What)
		case b.PID != 0 && a.PID != b.PID:
			gone = append(gone, fmt.Sprintf("%s (process %d, now %d)", b.What, b.PID, a.PID))
		}
	}
	sort.Strings(gone)
	return gone
}

// staticPod is a static pod as it ran before the swap: its static UID,
// whether it was Running, and how many of its containers ran.
type staticPod struct {
	uid        string
	running    bool
	containers int
}

// waitStatic waits until every static pod (by ns/name) is recreated: its
// mirror pod names a static UID other than before and is Running, and at
// least as many of its containers run as before, none of them one that
// ran before.
func (c Checker) waitStatic(ctx context.Context, o *nodeops.Ops, before map[string]nodeops.Container, static map[string]*staticPod) error {
	return c.Wait.Poll(ctx, time.Second, c.Timeout, func(ctx context.Context) error {
		pods, err := c.PodsOn(ctx, o.Name)
		if err != nil {
			return err
		}
		now := map[string]Pod{}
		for _, p := range pods {
			now[p.Name] = p
		}
		cs, err := o.Containers(ctx)
		if err != nil {
			return err
		}
		fresh := map[string]int{}
		for id, c := range cs {
			if _, old := before[id]; !old {
				fresh[c.Pod()]++
			}
		}
		var waiting []string
		for _, name := range slices.Sorted(maps.Keys(static)) {
			sp, p := static[name], now[name]
			switch {
			case p.StaticUID == "" || p.StaticUID == sp.uid:
				waiting = append(waiting, name+" (no mirror pod of a new UID yet)")
			case p.Phase != corev1.PodRunning:
				waiting = append(waiting, fmt.Sprintf("%s (mirror pod %s)", name, p.Phase))
			case fresh[name] < sp.containers:
				waiting = append(waiting, fmt.Sprintf("%s (%d of %d new containers running)", name, fresh[name], sp.containers))
			}
		}
		if len(waiting) > 0 {
			return errors.New(strings.Join(waiting, ", "))
		}
		return nil
	})
}

// RestartedError: containers that ran before the swap do not any more.
type RestartedError struct {
	Node       string
	Containers []string
}

func (e *RestartedError) Error() string {
	return fmt.Sprintf("node %s: %d containers restarted: %s", e.Node, len(e.Containers), strings.Join(e.Containers, ", "))
}

// Pod is a pod on a node as Node compares it: "ns/name", its phase,
// and, for a static pod's mirror, the static pod's UID.
type Pod struct {
	Name      string
	Phase     corev1.PodPhase
	StaticUID string
	// Owner is its controller, KIND/NS/NAME (ReplicaSet, StatefulSet,
	// DaemonSet ...), "" for none: the workload gate's scope.
	Owner string
}

func (p Pod) String() string { return p.Name + " " + string(p.Phase) }

// Ended: the pod had finished, so nothing of it runs to be kept.
func (p Pod) Ended() bool { return p.Phase == corev1.PodFailed || p.Phase == corev1.PodSucceeded }

// PodsOn maps the UIDs of a node's pods to what verify compares. The list
// is served from the API server's watch cache (resourceVersion 0),
// indexed by node: a consistent list from an API server before 1.31 reads
// every pod of the cluster from etcd to keep one node's, twice per node
// (the scale benchmark's 5000 nodes saturated the API server so). The
// cache trails etcd by the watch's latency, milliseconds, far less than
// the --settle pause before the list that verifies.
//
// An API server that cannot be reached or answer for a while (one
// restarting: on a kubeadm control-plane node, the node's own) is waited
// for, up to Timeout; an answer that refuses is an error at once.
func (c Checker) PodsOn(ctx context.Context, node string) (map[types.UID]Pod, error) {
	var l *corev1.PodList
	err := c.Wait.Poll(ctx, time.Second, c.Timeout, func(ctx context.Context) error {
		var err error
		l, err = c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node, ResourceVersion: "0"})
		if err != nil && !upgradelock.Unavailable(err) {
			return waiter.Stop(err)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list pods on %s: %w", node, err)
	}
	out := map[types.UID]Pod{}
	for i := range l.Items {
		p := &l.Items[i]
		if p.Namespace == agent.Namespace {
			continue // agent mode's agent: the run's own, made again where it goes
		}
		staticUID, _ := kubeletcompat.StaticUID(p)
		owner := ""
		if ref := metav1.GetControllerOf(p); ref != nil {
			owner = ref.Kind + "/" + p.Namespace + "/" + ref.Name
		}
		out[p.UID] = Pod{Name: p.Namespace + "/" + p.Name, Phase: p.Status.Phase, StaticUID: staticUID, Owner: owner}
	}
	return out, nil
}
