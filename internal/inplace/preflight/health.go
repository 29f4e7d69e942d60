package preflight

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/release"
)

// health: every node Ready, every API server ready, controller manager and
// scheduler leading (or running, without leader election). A cluster
// under load answers a probe badly now and then (an API server's
// /readyz says [-]etcd failed for a few seconds): each probe is judged
// over HealthWindow with backoff, as kubeadm's waiter does, and a
// finding says for how long it failed.
func (pc *planCheck) health(ctx context.Context) {
	for _, s := range pc.plan.Nodes {
		if !s.Ready {
			pc.add(Blocking, CheckHealth, "node/"+s.Name, "not Ready", "bring the node back, or remove it from the cluster, before upgrading")
		}
	}
	type result struct {
		object, msg, fix string
		sev              Severity
	}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		results = map[string]result{}
	)
	// The probes run side by side: an unhealthy cluster costs one window.
	probe := func(object string, sev Severity, fix string, check func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pc.probe(ctx, check); err != nil {
				mu.Lock()
				results[object] = result{object: object, msg: err.Error(), fix: fix, sev: sev}
				mu.Unlock()
			}
		}()
	}
	if pc.opts.REST != nil {
		for _, t := range pc.view.Addresses {
			if t.Role != release.RoleControlPlane {
				continue
			}
			addr := t.Address
			probe("apiserver/"+t.Name, Blocking, "", func(ctx context.Context) error {
				if err := cluster.Readyz(ctx, pc.opts.REST, addr); err != nil {
					return fmt.Errorf("/readyz: %w", err)
				}
				return nil
			})
		}
	}
	var mustRun []string
	for _, comp := range []string{"kube-controller-manager", "kube-scheduler"} {
		_, err := pc.opts.Client.CoordinationV1().Leases("kube-system").Get(ctx, comp, metav1.GetOptions{})
		switch {
		case err == nil:
			probe("lease/kube-system/"+comp, Blocking, "check the "+comp+" units on the control-plane nodes", func(ctx context.Context) error {
				return pc.liveLease(ctx, comp)
			})
		case apierrors.IsNotFound(err):
			mustRun = append(mustRun, comp)
		default:
			pc.add(Warning, CheckHealth, "lease/kube-system/"+comp, fmt.Sprintf("cannot read the lease: %v", err), "")
		}
	}
	wg.Wait()
	for _, o := range slices.Sorted(maps.Keys(results)) {
		r := results[o]
		pc.add(r.sev, CheckHealth, r.object, r.msg, r.fix)
	}
	// No leader election: it must run on the control-plane nodes.
	for _, comp := range mustRun {
		for _, s := range pc.plan.Nodes {
			if s.Role == release.RoleControlPlane && pc.view.Facts[s.Name] != nil && s.Components[comp] == "" {
				pc.add(Blocking, CheckHealth, "node/"+s.Name, comp+" is not running and holds no lease", "start the "+comp+" unit")
			}
		}
	}
}

// liveLease: comp's leader election Lease was renewed within twice its
// duration (as the plan's clock reads it).
func (pc *planCheck) liveLease(ctx context.Context, comp string) error {
	l, err := pc.opts.Client.CoordinationV1().Leases("kube-system").Get(ctx, comp, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("cannot read the lease: %w", err)
	}
	d := 15 * time.Second
	if l.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	if l.Spec.RenewTime == nil || pc.opts.Now().Sub(l.Spec.RenewTime.Time) > 2*d {
		return fmt.Errorf("%s holds no live lease (last renewed %v)", comp, l.Spec.RenewTime)
	}
	return nil
}

// probe runs check until it passes or HealthWindow has passed, backing
// off between tries (from HealthBackoff, doubling, at most
// HealthBackoffCap, the last wait cut to the window's end). It returns
// nil, or the last failure with how long and how many probes it failed
// for. (wait.Backoff's Cap ends the steps once reached: with it, the
// window was never used past 7.5 s.)
func (pc *planCheck) probe(ctx context.Context, check func(context.Context) error) error {
	began := time.Now()
	end := began.Add(pc.opts.HealthWindow)
	backoff := max(pc.opts.HealthBackoff, time.Millisecond)
	tries := 0
	for {
		tries++
		last := check(ctx) // the probe itself is not cut short by the window's end
		if last == nil {
			return nil
		}
		left := time.Until(end)
		if left <= 0 || ctx.Err() != nil {
			return fmt.Errorf("%w (failing for %s, %d probes)", last, time.Since(began).Round(100*time.Millisecond), tries)
		}
		t := time.NewTimer(min(backoff, left))
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		backoff = min(2*backoff, max(pc.opts.HealthBackoffCap, time.Millisecond))
	}
}
