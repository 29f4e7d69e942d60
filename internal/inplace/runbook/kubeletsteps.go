package runbook

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/verify"
)

// kubeletRun is one node's kubelet upgrade in flight: what its steps
// share.
type kubeletRun struct {
	o        *nodeops.Ops
	name, to string
	arch     string
	// before and pods are what ran on the node before the swap (recorded
	// by this run, or by the run this one resumes); gate the workloads of
	// those pods fully available then.
	before map[string]nodeops.Container
	pods   map[types.UID]verify.Pod
	gate   map[string]int64
	// began, swapped and ready time the node for the log.
	began, swapped, ready time.Time
	// resumed: the swap was a run's this one resumes.
	resumed bool
	// touched: the swap began; a panic from then on restores the old
	// kubelet.
	touched bool
	// runtimeMoved: this run moved the node's containerd; a rollback of
	// the node puts the old one back too.
	runtimeMoved bool
}

// nodeStep is one step of a node's procedure, named as the runbook names
// it. In a dry run a step with would says what it would do instead of
// doing it; the others run, their changes recorded as would-be by the
// node's operations.
type nodeStep struct {
	name string
	do   func(ctx context.Context, k *kubeletRun) error
	// rollsBack: the step's failure restores the old kubelet (the swap
	// was made).
	rollsBack bool
	would     func(k *kubeletRun) string
}

// kubeletSteps is one node's kubelet upgrade, in the runbook's order:
// before the swap, what the node must be held to after it; after it,
// whether it is.
func (r *upgradeRun) kubeletSteps() []nodeStep {
	return append(r.beforeSwapSteps(), r.afterSwapSteps()...)
}

func (r *upgradeRun) beforeSwapSteps() []nodeStep {
	return []nodeStep{
		{name: "pre-hook", do: r.hook("pre"), would: r.wouldHook("pre")},
		{name: "announce", do: r.announceKubelet},
		{name: "drain", do: r.drainNode, would: func(*kubeletRun) string {
			if !r.opts.Drain {
				return ""
			}
			return "cordon the node and evict its pods (PodDisruptionBudgets hold)"
		}},
		// kubeadm: `kubeadm upgrade node`, the kubelet's configuration
		// for the target.
		{name: "prepare", do: func(ctx context.Context, k *kubeletRun) error { return r.driver.BeforeKubelet(ctx, r.driverRun(), k.o) }},
		{name: "back up and record", do: r.backUpAndRecord},
		// On the Node: a run that resumes this one finishes the node
		// from it.
		{name: "record in flight", do: func(ctx context.Context, k *kubeletRun) error {
			return r.markInFlight(ctx, k.name, verify.InFlight(k.o.From, k.before, k.pods))
		}},
		{name: "hash-skip file", do: r.hashSkip},
		{name: "snapshot workloads", do: func(_ context.Context, k *kubeletRun) (err error) {
			k.gate, err = r.gateSnapshot(k.pods)
			return err
		}},
		// The CNI plugins and crictl to the bundle's, where it carries
		// the node stack: first, since they restart nothing and a failure
		// leaves the node as it was.
		{name: "tools", do: r.moveTools, would: func(k *kubeletRun) string { return r.stack().WouldTools(k.name, k.arch) }},
		// containerd (and runc) to the bundle's, where it carries a newer
		// one: before the kubelet, which may support only the new one.
		{name: "runtime", do: r.moveRuntime, would: func(k *kubeletRun) string { return r.stack().Would(k.name, k.arch) }},
		{name: "swap", do: r.swapKubelet},
	}
}

func (r *upgradeRun) afterSwapSteps() []nodeStep {
	return []nodeStep{
		{name: "wait Ready", do: r.waitKubeletReady, rollsBack: true, would: func(k *kubeletRun) string {
			return fmt.Sprintf("wait for the node Ready at %s, settle %s, verify the same containers run and no pod is lost, and (unless --no-workload-gate) the workloads fully available before are again within %s; roll back on failure", k.to, r.opts.Settle, r.opts.Plan.HealthWindow)
		}},
		{name: "settle", do: r.settleKubelet, would: silent},
		{name: "verify", do: r.verifyKubelet, would: silent},
		{name: "post-hook", do: r.hook("post"), rollsBack: true, would: r.wouldHook("post")},
		{name: "kube-proxy", do: func(ctx context.Context, k *kubeletRun) error { return driver.MoveProxy(ctx, r.driverRun(), k.o) }},
		// Only what this run cordoned.
		{name: "uncordon", do: func(ctx context.Context, k *kubeletRun) error { return r.uncordon(ctx, k.name) }, would: silent},
		{name: "workload gate", do: func(ctx context.Context, k *kubeletRun) error { return r.gate(ctx, k.name, k.gate) }, rollsBack: true, would: silent},
		{name: "mark done", do: r.markKubeletDone},
	}
}

// silent: a step a dry run passes over (the step before said it).
func silent(*kubeletRun) string { return "" }

// walk runs steps in order on k's node: in a dry run, a step with would
// records what it would do instead.
func (r *upgradeRun) walk(ctx context.Context, k *kubeletRun, steps []nodeStep) error {
	for _, s := range steps {
		if r.dry && s.would != nil {
			if what := s.would(k); what != "" {
				r.would(k.name, what, "")
			}
			continue
		}
		r.span(k.name, s.name)
		if err := s.do(ctx, k); err != nil {
			if s.rollsBack {
				return r.rollbackNode(ctx, k, err)
			}
			return err
		}
	}
	return nil
}

// upgradeKubelet is one node's kubelet (kubeletSteps). A node whose
// kubelet runs the target already is finished: from its Ready wait on,
// with what a run that swapped it and died recorded on the Node, else
// only waited for, its kube-proxy moved, uncordoned and marked done.
func (r *upgradeRun) upgradeKubelet(ctx context.Context, name string) error {
	k := &kubeletRun{name: name, to: r.target.Version.String(), began: r.wait.Now()}
	err := r.onNode(ctx, name, func(ctx context.Context, o *nodeops.Ops) (err error) {
		k.o = o
		defer func() {
			if p := recover(); p != nil {
				err = r.recovered(name, p)
				if k.touched && !r.dry {
					err = r.rollbackNode(ctx, k, err)
				}
			}
		}()
		k.arch = r.nodeState(name).Arch
		v, err := o.Running(ctx, "kubelet")
		if err != nil {
			return err
		}
		switch {
		case v != k.to:
			return r.walk(ctx, k, r.kubeletSteps())
		case r.dry:
			r.would(name, "kubelet runs "+k.to+" already: wait for the node Ready and mark it done", "")
			return driver.MoveProxy(ctx, r.driverRun(), o)
		}
		rec, err := r.inFlightOf(name)
		if err != nil {
			return err
		}
		if rec == nil {
			return r.walk(ctx, k, r.alreadyThereSteps())
		}
		// A run that died after the swap left what verify needs.
		r.log.Info("finishing a node a run left after its kubelet swap: Ready, verify, hooks, kube-proxy, uncordon", "node", name, "from", rec.From)
		r.setNode(ctx, name, record.NodeUpgrading, "kubelet", nil)
		o.From, k.touched, k.resumed = rec.From, true, true
		k.before, k.pods = verify.FromInFlight(rec)
		if k.gate, err = r.gateSnapshot(k.pods); err != nil {
			return err
		}
		k.swapped = k.began
		return r.walk(ctx, k, r.afterSwapSteps())
	})
	if err != nil {
		// Whatever failed, a cordon of this run's is undone now, not at
		// the run's end.
		if r.nodes().Mine(name) {
			if uerr := r.uncordon(context.WithoutCancel(ctx), name); uerr != nil {
				err = fmt.Errorf("%w; %w", err, uerr)
			}
		}
		r.setNode(ctx, name, failedStatus(err), "kubelet", err)
		return err
	}
	return nil
}

// alreadyThereSteps finish a node whose kubelet runs the target with no
// run's record of its swap: nothing to verify it against.
func (r *upgradeRun) alreadyThereSteps() []nodeStep {
	return []nodeStep{
		{name: "wait Ready", do: func(ctx context.Context, k *kubeletRun) error {
			if err := r.watch.Until(ctx, k.name, r.opts.ReadyTimeout, cluster.ReadyAt(k.to)); err != nil {
				return fmt.Errorf("node %s: kubelet %s already, but not Ready: %w", k.name, k.to, err)
			}
			return nil
		}},
		{name: "kube-proxy", do: func(ctx context.Context, k *kubeletRun) error { return driver.MoveProxy(ctx, r.driverRun(), k.o) }},
		{name: "uncordon", do: func(ctx context.Context, k *kubeletRun) error { return r.uncordon(ctx, k.name) }},
		{name: "mark done", do: func(ctx context.Context, k *kubeletRun) error { return r.markDone(ctx, k.name) }},
	}
}

// wouldHook says, in a dry run, that the hook of when would run.
func (r *upgradeRun) wouldHook(when string) func(*kubeletRun) string {
	return func(*kubeletRun) string {
		if r.opts.Hook == nil {
			return ""
		}
		return "run the " + when + "-hook"
	}
}

// hook runs a node's pre- or post-hook (when), if there is one.
func (r *upgradeRun) hook(when string) func(context.Context, *kubeletRun) error {
	return func(ctx context.Context, k *kubeletRun) error {
		if r.opts.Hook == nil {
			return nil
		}
		if err := r.opts.Hook(ctx, when, k.name, k.o.From, k.to); err != nil {
			return fmt.Errorf("node %s: %s-hook: %w", k.name, when, err)
		}
		return nil
	}
}

// announceKubelet records the node upgrading, and says so in an Event.
func (r *upgradeRun) announceKubelet(ctx context.Context, k *kubeletRun) error {
	r.setNode(ctx, k.name, record.NodeUpgrading, "kubelet", nil)
	r.event(ctx, k.name, "UpgradingKubelet", fmt.Sprintf("kubelift: kubelet %s -> %s", k.o.From, k.to))
	return nil
}

func (r *upgradeRun) drainNode(ctx context.Context, k *kubeletRun) error {
	if !r.opts.Drain {
		return nil
	}
	return r.drain(ctx, k.name)
}

// backUpAndRecord backs the kubelet up and, meanwhile, records the
// node's containers (over a second SSH session) and pods (from the API).
func (r *upgradeRun) backUpAndRecord(ctx context.Context, k *kubeletRun) error {
	type podsResult struct {
		pods map[types.UID]verify.Pod
		err  error
	}
	podsCh := make(chan podsResult, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				podsCh <- podsResult{nil, r.recovered(k.name, p)}
			}
		}()
		p, err := r.checker().PodsOn(ctx, k.name)
		podsCh <- podsResult{p, err}
	}()
	type containersResult struct {
		containers map[string]nodeops.Container
		err        error
	}
	containersCh := make(chan containersResult, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				containersCh <- containersResult{nil, r.recovered(k.name, p)}
			}
		}()
		c, err := k.o.ContainersWaiting(ctx)
		containersCh <- containersResult{c, err}
	}()
	if err := k.o.Backup(ctx, "kubelet"); err != nil {
		return err
	}
	cr := <-containersCh
	if cr.err != nil {
		return cr.err
	}
	pr := <-podsCh
	if pr.err != nil {
		return pr.err
	}
	k.before, k.pods = cr.containers, pr.pods
	return nil
}

// hashSkip writes the hash-skip file when the hash era changes and the
// bundled kubelet reads it.
func (r *upgradeRun) hashSkip(ctx context.Context, k *kubeletRun) error {
	if !r.target.Manifest.KubeletHashSkip(release.ArchOr(k.arch)) {
		return nil
	}
	era, err := r.eraOf(k.o.From)
	if err != nil {
		return fmt.Errorf("node %s: the hash era of kubelet %s, which the hash-skip file must name: %w", k.name, k.o.From, err)
	}
	if era == r.target.Catalog.KubeletHashEra {
		return nil
	}
	return k.o.WriteHashSkip(ctx, era, r.opts.Plan.Now())
}

// swapKubelet puts the staged kubelet in place and restarts it, once the
// run still holds the lock; a failed swap is rolled back.
func (r *upgradeRun) swapKubelet(ctx context.Context, k *kubeletRun) error {
	if err := r.fence(ctx); err != nil {
		return fmt.Errorf("node %s: kubelet not swapped: %w", k.name, err)
	}
	k.touched = true
	if err := k.o.Swap(ctx, "kubelet", r.target.SHA256("kubelet", k.arch)); err != nil {
		return r.rollbackNode(ctx, k, err)
	}
	k.swapped = r.wait.Now()
	return nil
}

func (r *upgradeRun) waitKubeletReady(ctx context.Context, k *kubeletRun) error {
	stopWait := r.timed(&r.res.Waiting)
	err := r.watch.Until(ctx, k.name, r.opts.ReadyTimeout, cluster.ReadyAt(k.to))
	stopWait()
	k.ready = r.wait.Now()
	if err != nil {
		return fmt.Errorf("node %s not Ready at %s within %s: %w", k.name, k.to, r.opts.ReadyTimeout, err)
	}
	return nil
}

// settleKubelet gives the kubelet time to act on every pod.
func (r *upgradeRun) settleKubelet(ctx context.Context, _ *kubeletRun) error {
	stopSettle := r.timed(&r.res.Settling)
	defer stopSettle()
	return r.wait.Pause(ctx, r.opts.Settle)
}

// verifyKubelet: the same containers run and no pod went (verify). A
// failure rolls the kubelet back, but for containers restarted (a
// rollback would restart them again) and a resumed node (verified
// against what ran before the swap of the run this one resumes: much may
// have changed since), where the kubelet stays and the record is cleared.
func (r *upgradeRun) verifyKubelet(ctx context.Context, k *kubeletRun) error {
	err := r.verify(ctx, k.o, k.before, k.pods)
	if err == nil {
		return nil
	}
	var restarted *verify.RestartedError
	if errors.As(err, &restarted) {
		r.log.Error("containers restarted: the kubelet stays at the target, since rolling it back would restart them again", "node", k.name, "version", k.to, "containers", restarted.Containers)
		r.event(ctx, k.name, "ContainersRestarted", fmt.Sprintf("kubelift: %v; kubelet left at %s (a rollback would restart them again)", err, k.to))
		return errors.Join(fmt.Errorf("%w; the kubelet stays at %s: rolling it back would restart them a second time", err, k.to), r.clearInFlight(ctx, k.name))
	}
	if k.resumed {
		return errors.Join(fmt.Errorf("node %s: verified against what ran before the swap of the run this one resumes: %w; the kubelet stays at %s (much may have changed since that run: check the node's pods)", k.name, err, k.to), r.clearInFlight(ctx, k.name))
	}
	return r.rollbackNode(ctx, k, err)
}

// markKubeletDone marks the node done, saying where its time went.
func (r *upgradeRun) markKubeletDone(ctx context.Context, k *kubeletRun) error {
	if r.dry {
		return r.markDone(ctx, k.name)
	}
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	return r.markDone(ctx, k.name, "took", ms(r.wait.Since(k.began)),
		"before-restart", ms(k.swapped.Sub(k.began)), "until-ready", ms(k.ready.Sub(k.swapped)), "after-ready", ms(r.wait.Since(k.ready)))
}
