package inplace

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/upgradelock"
	"github.com/kubelift/kubelift/internal/waiter"
)

// settleControlPlane is asked after every control-plane node's step,
// forward (each hop, and the target) and backward (rollback): the run
// goes on only when the controller manager's and scheduler's leases are
// renewed again by a live holder, every part on the node runs version
// (read from the running process; a part that is down is started and
// waited for), and each is still the same process a health window
// later. An API server's restart makes the controller manager and
// scheduler that lead lose their leases and exit; without this, a step
// could end (and rollback say "rolled back") before their units started
// them again, or for good where a unit has no Restart=.
//
// At a hop (atLeast), a part past version (a run resumed past the hop) is
// as good as one at it.
//
// moved are the parts the step swapped or restored: with those the node
// ran before, they are the parts that must run (a unit the operator keeps
// stopped is left so).
func (r *applyRun) settleControlPlane(ctx context.Context, node, version string, atLeast bool, moved map[string]bool) error {
	window := r.opts.Plan.HealthWindow
	if r.dry {
		r.would(node, fmt.Sprintf("wait for every control-plane part to run %s (starting one that is down), the controller manager's and scheduler's leases renewed, and each part the same process %s later", version, window), "")
		return nil
	}
	defer r.timed(&r.res.Waiting)()
	if r.driver.Kind() == release.KindKubeadm {
		if err := r.waitLeasesRenewed(ctx); err != nil {
			return fmt.Errorf("node %s: %w", node, err)
		}
		return r.settleStaticPods(ctx, node, version, window)
	}
	return r.settleUnits(ctx, node, version, atLeast, window, moved)
}

// settleUnits: each part's unit on node runs version, and the same main
// process a window later; a part whose process changes meanwhile is
// waited for again, for at most ReadyTimeout and two windows in all.
func (r *applyRun) settleUnits(ctx context.Context, node, version string, atLeast bool, window time.Duration, moved map[string]bool) error {
	ns := r.nodeState(node)
	var parts []string
	for _, c := range r.driver.Components(ns) {
		if ns.Components[c] != "" || moved[c] {
			parts = append(parts, c)
		}
	}
	if len(parts) == 0 {
		return nil
	}
	want, err := catalog.ParseVersion(version)
	if err != nil {
		return err
	}
	good := func(v string) bool {
		if v == version {
			return true
		}
		pv, err := catalog.ParseReported(v)
		return atLeast && err == nil && pv.Compare(want) > 0
	}
	return r.onNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error {
		deadline := r.wait.Now().Add(r.opts.ReadyTimeout + 2*window)
		started := map[string]bool{}
		for {
			pids := map[string]int{}
			for _, comp := range parts {
				err := r.wait.Poll(ctx, time.Second, r.opts.ReadyTimeout, func(ctx context.Context) error {
					v, pid, err := o.Process(ctx, comp)
					switch {
					case err != nil:
						return err
					case pid == 0 && !started[comp]:
						started[comp] = true
						r.log.Warn("does not run: starting its unit", "node", node, "component", comp)
						if err := o.Start(ctx, comp); err != nil {
							return waiter.Stop(err)
						}
						return fmt.Errorf("%s does not run (its unit was started)", comp)
					case pid == 0:
						return fmt.Errorf("%s does not run", comp)
					case !good(v):
						return fmt.Errorf("%s runs %s, want %s", comp, v, version)
					}
					pids[comp] = pid
					return nil
				})
				if err != nil {
					return fmt.Errorf("node %s: %s is not running %s within %s: %w", node, comp, version, r.opts.ReadyTimeout, err)
				}
			}
			// Every part runs (one that was down started): the leaders
			// lead again.
			if err := r.waitLeasesRenewed(ctx); err != nil {
				return fmt.Errorf("node %s: %w", node, err)
			}
			if err := r.wait.Pause(ctx, window); err != nil {
				return err
			}
			var moved []string
			for _, comp := range parts {
				v, pid, err := o.Process(ctx, comp)
				if err != nil {
					return err
				}
				if pid != pids[comp] || !good(v) {
					moved = append(moved, fmt.Sprintf("%s (process %d, now %d)", comp, pids[comp], pid))
				}
			}
			if len(moved) == 0 {
				return nil
			}
			if r.wait.Now().After(deadline) {
				return fmt.Errorf("node %s: %s restarted within the health window (%s), again and again for %s", node, strings.Join(moved, ", "), window, r.opts.ReadyTimeout+2*window)
			}
			r.log.Warn("restarted within the health window: waiting for a steady one", "node", node, "parts", moved, "window", window)
		}
	})
}

// settleStaticPods: on a kubeadm node, the control-plane static pods run
// version and are Ready (waitStaticAt), lead from processes that run now
// (waitLeaders), and keep the same containers, none restarted, a window
// later.
func (r *applyRun) settleStaticPods(ctx context.Context, node, version string, window time.Duration) error {
	return r.onNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error {
		deadline := r.wait.Now().Add(r.opts.ReadyTimeout + 2*window)
		for {
			if err := r.waitStaticAt(ctx, o, version); err != nil {
				return err
			}
			if err := r.waitLeaders(ctx); err != nil {
				return err
			}
			before, err := r.staticContainers(ctx, node)
			if err != nil {
				return err
			}
			if err := r.wait.Pause(ctx, window); err != nil {
				return err
			}
			after, err := r.staticContainers(ctx, node)
			if err != nil {
				return err
			}
			var moved []string
			for comp, id := range before {
				if after[comp] != id {
					moved = append(moved, fmt.Sprintf("%s (container %s, now %s)", comp, id, after[comp]))
				}
			}
			slices.Sort(moved)
			if len(moved) == 0 {
				return nil
			}
			if r.wait.Now().After(deadline) {
				return fmt.Errorf("node %s: %s restarted within the health window (%s), again and again for %s", node, strings.Join(moved, ", "), window, r.opts.ReadyTimeout+2*window)
			}
			r.log.Warn("restarted within the health window: waiting for a steady one", "node", node, "parts", moved, "window", window)
		}
	})
}

// staticContainers maps each control-plane static pod on node to its
// container's ID and restart count, as the API says them.
func (r *applyRun) staticContainers(ctx context.Context, node string) (map[string]string, error) {
	pods, err := r.controlPlanePods(ctx, node)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for i := range pods {
		p := &pods[i]
		comp, _, err := preflight.StaticComponent(p)
		if err != nil || comp == "" {
			continue
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == comp {
				out[comp] = fmt.Sprintf("%s#%d", cs.ContainerID, cs.RestartCount)
			}
		}
	}
	return out, nil
}

// leaderComponents are the parts that lead through a Lease in
// kube-system, and exit when they lose it.
var leaderComponents = []string{"kube-controller-manager", "kube-scheduler"}

// waitLeasesRenewed waits until the controller manager's and scheduler's
// leases are renewed while this run watches (their holder or renew time
// changes): a live holder, judged without comparing this machine's clock
// to the cluster's. A component without a lease (no leader election) is
// left to the per-node check; an API server that cannot answer for a
// while is waited for.
func (r *applyRun) waitLeasesRenewed(ctx context.Context) error {
	leases := r.client.CoordinationV1().Leases(metav1.NamespaceSystem)
	for _, comp := range leaderComponents {
		var first *coordinationv1.Lease
		none := false
		err := r.wait.Poll(ctx, time.Second, r.opts.ReadyTimeout, func(ctx context.Context) error {
			l, err := leases.Get(ctx, comp, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err) && first == nil:
				none = true
				return nil
			case err != nil && !upgradelock.Unavailable(err):
				return waiter.Stop(err)
			case err != nil:
				return err
			case first == nil:
				first = l
				return fmt.Errorf("lease kube-system/%s: waiting for a renewal", comp)
			case leaseRenewed(first, l):
				return nil
			}
			return fmt.Errorf("lease kube-system/%s not renewed since this run first read it (holder %s)", comp, deref(l.Spec.HolderIdentity))
		})
		if errors.Is(err, waiter.ErrTimeout) {
			return fmt.Errorf("%s holds no live lease within %s: %w", comp, r.opts.ReadyTimeout, err)
		}
		if err != nil {
			return err
		}
		if none {
			r.log.Debug("no lease: not leader-elected", "component", comp)
		}
	}
	return nil
}

// leaseRenewed: b is a later reading of lease a, renewed since (its
// holder or renew time changed).
func leaseRenewed(a, b *coordinationv1.Lease) bool {
	if deref(a.Spec.HolderIdentity) != deref(b.Spec.HolderIdentity) {
		return deref(b.Spec.HolderIdentity) != ""
	}
	if a.Spec.RenewTime == nil || b.Spec.RenewTime == nil {
		return b.Spec.RenewTime != nil
	}
	return !a.Spec.RenewTime.Equal(b.Spec.RenewTime)
}

// markMoved records that part comp on node was swapped or restored in
// this run ("" for the node's control plane as a whole, kubeadm's): the
// node is settled after its step.
func (r *applyRun) markMoved(node, comp string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.moved == nil {
		r.moved = map[string]map[string]bool{}
	}
	if r.moved[node] == nil {
		r.moved[node] = map[string]bool{}
	}
	r.moved[node][comp] = true
}

// takeMoved is what moved on node since the last call (nil: nothing).
func (r *applyRun) takeMoved(node string) map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.moved[node]
	delete(r.moved, node)
	return m
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
