package inplace

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/upgradelock"
	"github.com/kubelift/kubelift/internal/waiter"
)

// kubeletsStep moves kubelets once every API server runs the target:
// control-plane nodes one at a time, then workers in their Window.
func (r *upgradeRun) kubeletsStep(ctx context.Context) error {
	to := r.target.Version.String()
	for _, n := range r.plan.Nodes {
		if n.Role != release.RoleControlPlane || r.dry { // a dry run moved no API server
			continue
		}
		if err := r.onNode(ctx, n.Name, func(ctx context.Context, o *nodeops.Ops) error {
			v, err := o.Running(ctx, "kube-apiserver")
			if err != nil {
				return err
			}
			if v != "" && v != to {
				return fmt.Errorf("node %s: kube-apiserver runs %s: kubelets move only after every API server runs %s", n.Name, v, to)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	if err := r.setState(ctx, record.StateUpgradingKubelets); err != nil {
		return err
	}
	if !r.dry {
		w, err := cluster.WatchNodes(ctx, r.client, r.wait)
		if err != nil {
			return err
		}
		defer w.Close()
		r.watch = w
		if !r.opts.Plan.NoWorkloadGate {
			ww, err := watchWorkloads(ctx, r.client)
			if err != nil {
				return err
			}
			defer ww.close()
			r.workloads = ww
		}
	}
	var cps, workers []string
	for _, n := range r.plan.Nodes {
		switch {
		case n.Role == release.RoleControlPlane:
			cps = append(cps, n.Name)
		case r.selected(n.Name):
			workers = append(workers, n.Name)
		}
	}
	for _, n := range cps {
		if err := r.upgradeKubeletRecovered(ctx, n); err != nil {
			return err
		}
	}
	window, err := preflight.NewWindow(r.opts.Plan.MaxUnavailable, r.opts.Plan.Canary, len(workers))
	if err != nil {
		return err
	}
	return r.window(ctx, workers, window)
}

// window upgrades workers as w says: at most w.Width(done) in flight, a
// slot freed as soon as a node is done. The first failure stops new
// nodes; those in flight finish.
func (r *upgradeRun) window(ctx context.Context, workers []string, w preflight.Window) error {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		inFlight int
		done     int
		firstErr error
		freed    = make(chan struct{}, len(workers))
	)
	for i := 0; i < len(workers); {
		mu.Lock()
		stop := firstErr != nil
		if !stop && inFlight < w.Width(done) {
			n := workers[i]
			i++
			inFlight++
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := r.upgradeKubeletRecovered(ctx, n)
				mu.Lock()
				inFlight--
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					done++
				}
				mu.Unlock()
				freed <- struct{}{}
			}()
			continue
		}
		mu.Unlock()
		if stop {
			break
		}
		select {
		case <-freed:
			if r.opts.Soak > 0 {
				_ = r.wait.Pause(ctx, r.opts.Soak) // a cancel is seen below
			}
		case <-ctx.Done():
			// No new node; those in flight end (undoing themselves), and
			// their errors say more than the cancel does.
			wg.Wait()
			if firstErr == nil {
				firstErr = ctx.Err()
			}
			return firstErr
		}
	}
	wg.Wait()
	return firstErr
}

// ErrPanic means a step panicked: a bug in kubelift, failing that node
// like any error (undone, recorded, the run stopped with its cordons
// undone and its lock released), with the stack in the log.
var ErrPanic = errors.New("panic (a bug in kubelift: please report it with the log)")

// recovered is the error of a panic p on node; the stack goes to the log.
func (r *upgradeRun) recovered(node string, p any) error {
	r.log.Error("panic", "node", node, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	return fmt.Errorf("node %s: %w: %v", node, ErrPanic, p)
}

// upgradeKubeletRecovered is upgradeKubelet in a worker goroutine: a
// panic that escapes it (from its own error path) is recorded as the
// node's failure instead of ending the process with the lock held and
// the node cordoned.
func (r *upgradeRun) upgradeKubeletRecovered(ctx context.Context, name string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = r.recovered(name, p)
			r.setNode(context.WithoutCancel(ctx), name, record.NodeFailed, "kubelet", err)
		}
	}()
	return r.upgradeKubelet(ctx, name)
}

// failedStatus is the status of a node whose step failed with err.
var failedStatus = driver.FailedStatus

// timed adds the time until the returned func is called to *sum.
func (r *upgradeRun) timed(sum *float64) func() {
	began := r.wait.Now()
	return func() {
		r.mu.Lock()
		*sum += r.wait.Since(began).Seconds()
		r.mu.Unlock()
	}
}

func (r *upgradeRun) eraOf(v string) (string, error) {
	pv, err := catalog.ParseVersion(v)
	if err != nil {
		return "", err
	}
	return r.opts.Plan.Catalog.HashEraFor(pv)
}

// verify: every container that ran before the swap still runs (same
// IDs and, where the runtime's tasks were read, the same processes), and
// every pod is still there and not failed. Static pods are the exception
// the plan announced: a kubelet of another minor gives them new UIDs and
// so starts them anew; each that ran before must run again, recreated
// (a mirror pod naming a new static UID, Running, with as many containers
// of new IDs running as before) within the Ready timeout.
func (r *upgradeRun) verify(ctx context.Context, o *nodeops.Ops, before map[string]nodeops.Container, podsBefore map[types.UID]podInfo) error {
	after, err := o.Containers(ctx)
	if err != nil {
		return err
	}
	recreate := true
	if fv, err := catalog.ParseVersion(o.From); err == nil {
		recreate = kubeletcompat.StaticPodsRecreated(fv, r.target.Version)
	}
	static := map[string]*staticPod{} // by ns/name
	for _, p := range podsBefore {
		if p.staticUID != "" && recreate && !p.ended() {
			static[p.name] = &staticPod{uid: p.staticUID, running: p.phase == corev1.PodRunning}
		}
	}
	// Gone: the container, or its process (a container restarted in
	// place keeps its ID but not its PID).
	var gone []string
	for id, b := range before {
		if sp := static[b.Pod()]; sp != nil {
			sp.containers++
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
	if len(gone) > 0 && !r.opts.Plan.AllowRestarts && !r.opts.Drain {
		return &restartedError{node: o.Name, containers: gone}
	}
	podsAfter, err := r.podsOn(ctx, o.Name)
	if err != nil {
		return err
	}
	for uid, p := range podsBefore {
		if static[p.name] != nil || p.ended() {
			continue
		}
		if q, ok := podsAfter[uid]; !ok {
			return fmt.Errorf("node %s: pod %s is gone (evicted?)", o.Name, p)
		} else if q.phase == corev1.PodFailed {
			return fmt.Errorf("node %s: pod %s failed", o.Name, q)
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
		return nil
	}
	if err := r.waitStatic(ctx, o, before, static); err != nil {
		return fmt.Errorf("node %s: static pods not recreated within %s: %w", o.Name, r.opts.ReadyTimeout, err)
	}
	names := slices.Sorted(maps.Keys(static))
	r.log.Info("static pods started anew under new UIDs, as the plan said", "node", o.Name, "pods", names)
	r.event(ctx, o.Name, "StaticPodsRecreated", fmt.Sprintf("kubelift: static pods %s recreated by kubelet %s (new UIDs; kubernetes#116080)", strings.Join(names, ", "), r.target.Version))
	return nil
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
func (r *upgradeRun) waitStatic(ctx context.Context, o *nodeops.Ops, before map[string]nodeops.Container, static map[string]*staticPod) error {
	return r.wait.Poll(ctx, time.Second, r.opts.ReadyTimeout, func(ctx context.Context) error {
		pods, err := r.podsOn(ctx, o.Name)
		if err != nil {
			return err
		}
		now := map[string]podInfo{}
		for _, p := range pods {
			now[p.name] = p
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
			case p.staticUID == "" || p.staticUID == sp.uid:
				waiting = append(waiting, name+" (no mirror pod of a new UID yet)")
			case p.phase != corev1.PodRunning:
				waiting = append(waiting, fmt.Sprintf("%s (mirror pod %s)", name, p.phase))
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

// restartedError: containers that ran before the swap do not any more.
type restartedError struct {
	node       string
	containers []string
}

func (e *restartedError) Error() string {
	return fmt.Sprintf("node %s: %d containers restarted: %s", e.node, len(e.containers), strings.Join(e.containers, ", "))
}

// podInfo is a pod on a node as verify compares it: "ns/name", its phase,
// and, for a static pod's mirror, the static pod's UID.
type podInfo struct {
	name      string
	phase     corev1.PodPhase
	staticUID string
	// owner is its controller, KIND/NS/NAME (ReplicaSet, StatefulSet,
	// DaemonSet ...), "" for none: the workload gate's scope.
	owner string
}

func (p podInfo) String() string { return p.name + " " + string(p.phase) }

// ended: the pod had finished, so nothing of it runs to be kept.
func (p podInfo) ended() bool { return p.phase == corev1.PodFailed || p.phase == corev1.PodSucceeded }

// podsOn maps the UIDs of a node's pods to what verify compares. The list
// is served from the API server's watch cache (resourceVersion 0),
// indexed by node: a consistent list from an API server before 1.31 reads
// every pod of the cluster from etcd to keep one node's, twice per node
// (the scale benchmark's 5000 nodes saturated the API server so). The
// cache trails etcd by the watch's latency, milliseconds, far less than
// the --settle pause before the list that verifies.
//
// An API server that cannot be reached or answer for a while (one
// restarting: on a kubeadm control-plane node, the node's own) is waited
// for, up to ReadyTimeout; an answer that refuses is an error at once.
func (r *upgradeRun) podsOn(ctx context.Context, node string) (map[types.UID]podInfo, error) {
	var l *corev1.PodList
	err := r.wait.Poll(ctx, time.Second, r.opts.ReadyTimeout, func(ctx context.Context) error {
		var err error
		l, err = r.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node, ResourceVersion: "0"})
		if err != nil && !upgradelock.Unavailable(err) {
			return waiter.Stop(err)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list pods on %s: %w", node, err)
	}
	out := map[types.UID]podInfo{}
	for i := range l.Items {
		p := &l.Items[i]
		staticUID, _ := kubeletcompat.StaticUID(p)
		owner := ""
		if ref := metav1.GetControllerOf(p); ref != nil {
			owner = ref.Kind + "/" + p.Namespace + "/" + ref.Name
		}
		out[p.UID] = podInfo{name: p.Namespace + "/" + p.Name, phase: p.Status.Phase, staticUID: staticUID, owner: owner}
	}
	return out, nil
}

// markDone annotates the Node with the version and bundle it was upgraded
// to, and records it done.
func (r *upgradeRun) markDone(ctx context.Context, name string, attrs ...any) error {
	to := r.target.Version.String()
	patch, err := annotationsPatch(map[string]any{AnnotationUpgradedTo: to, AnnotationBundle: r.target.Record.BundleDigest, record.AnnotationInFlight: nil})
	if err != nil {
		return err
	}
	if r.dry {
		r.would(name, "annotate the node upgraded", string(patch))
		return nil
	}
	if _, err := r.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: mark done: %w", name, err)
	}
	r.setNode(ctx, name, record.NodeDone, "", nil)
	r.event(ctx, name, "Upgraded", "kubelift: upgraded to "+to)
	r.log.Info("upgraded", append([]any{"node", name, "version", to}, attrs...)...)
	return nil
}

func (r *upgradeRun) completeStep(ctx context.Context) error {
	for _, n := range r.plan.Nodes {
		if !r.selected(n.Name) && n.Kubelet != r.target.Version.String() {
			r.log.Info("left for a later apply", "node", n.Name)
			return r.setState(ctx, record.StateUpgradingKubelets) // manual mode: some remain
		}
	}
	return r.setState(ctx, record.StateComplete)
}
