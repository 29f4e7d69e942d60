package runbook

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/verify"
	"github.com/kubelift/kubelift/internal/inplace/window"
	"github.com/kubelift/kubelift/internal/inplace/workloads"
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
			ww, err := workloads.WatchWorkloads(ctx, r.client)
			if err != nil {
				return err
			}
			defer ww.Close()
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
	w, err := window.New(r.opts.Plan.MaxUnavailable, r.opts.Plan.Canary, len(workers))
	if err != nil {
		return err
	}
	var soak func(context.Context)
	if r.opts.Soak > 0 {
		soak = func(ctx context.Context) { _ = r.wait.Pause(ctx, r.opts.Soak) }
	}
	return w.Run(ctx, workers, soak, r.upgradeKubeletRecovered)
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

// verify holds the node to the promise (verify.Checker.Node) and says
// which static pods were recreated, as the plan announced.
func (r *upgradeRun) verify(ctx context.Context, o *nodeops.Ops, before map[string]nodeops.Container, podsBefore map[types.UID]verify.Pod) error {
	res, err := r.checker().Node(ctx, o, r.target.Version, before, podsBefore)
	if res.Containers != nil { // what the report counts
		r.mu.Lock()
		r.state.Node(o.Name, r.tgts[o.Name].Role).Containers = res.Containers
		r.mu.Unlock()
	}
	names := res.Recreated
	if err != nil || len(names) == 0 {
		return err
	}
	r.log.Info("static pods started anew under new UIDs, as the plan said", "node", o.Name, "pods", names)
	r.event(ctx, o.Name, "StaticPodsRecreated", fmt.Sprintf("kubelift: static pods %s recreated by kubelet %s (new UIDs; kubernetes#116080)", strings.Join(names, ", "), r.target.Version))
	return nil
}

// checker verifies this run's nodes.
func (r *upgradeRun) checker() verify.Checker {
	return verify.Checker{Client: r.client, Wait: r.wait, Timeout: r.opts.ReadyTimeout, RestartsAllowed: r.opts.Plan.AllowRestarts || r.opts.Drain}
}

// markDone annotates the Node with the version and bundle it was upgraded
// to, and records it done.
func (r *upgradeRun) markDone(ctx context.Context, name string, attrs ...any) error {
	to := r.target.Version.String()
	patch, err := record.DonePatch(to, r.target.Record.BundleDigest)
	if err != nil {
		return err
	}
	if r.dry {
		r.would(name, "annotate the node upgraded", string(patch))
		return nil
	}
	if err := record.PatchNode(ctx, r.client, name, patch); err != nil {
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
