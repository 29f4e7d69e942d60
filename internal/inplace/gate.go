package inplace

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubelift/kubelift/internal/waiter"
)

// The workload gate: a kubelet that keeps every container and then fails
// their readiness probes, or a kube-proxy that no longer routes, passes
// the per-node checks (same containers, same processes). After each
// node, every Deployment, StatefulSet and DaemonSet that was fully
// available before the node's swap must be fully available again within
// --health-window, or the run stops there and rolls the node back,
// naming them (StarlingX waits for its apps "fully applied"; Rook asks
// each daemon ok-to-stop).

// workloadWatch serves the gate from one informer per kind.
type workloadWatch struct {
	deps func() ([]*appsv1.Deployment, error)
	sts  func() ([]*appsv1.StatefulSet, error)
	dss  func() ([]*appsv1.DaemonSet, error)
	stop context.CancelFunc
}

func watchWorkloads(ctx context.Context, c kubernetes.Interface) (*workloadWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := informers.NewSharedInformerFactory(c, 0)
	d, s, ds := f.Apps().V1().Deployments(), f.Apps().V1().StatefulSets(), f.Apps().V1().DaemonSets()
	synced := []cache.InformerSynced{d.Informer().HasSynced, s.Informer().HasSynced, ds.Informer().HasSynced}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		cancel()
		return nil, fmt.Errorf("watch workloads: %w", ctx.Err())
	}
	all := labels.Everything()
	return &workloadWatch{stop: cancel,
		deps: func() ([]*appsv1.Deployment, error) { return d.Lister().List(all) },
		sts:  func() ([]*appsv1.StatefulSet, error) { return s.Lister().List(all) },
		dss:  func() ([]*appsv1.DaemonSet, error) { return ds.Lister().List(all) },
	}, nil
}

func (w *workloadWatch) close() { w.stop() }

// available maps each workload ("deployment/NS/NAME") to why it is not
// fully available ("" when it is).
func (w *workloadWatch) available() (map[string]string, error) {
	out := map[string]string{}
	deps, err := w.deps()
	if err != nil {
		return nil, err
	}
	for _, d := range deps {
		out["deployment/"+d.Namespace+"/"+d.Name] = deploymentShort(d)
	}
	sts, err := w.sts()
	if err != nil {
		return nil, err
	}
	for _, s := range sts {
		out["statefulset/"+s.Namespace+"/"+s.Name] = statefulSetShort(s)
	}
	dss, err := w.dss()
	if err != nil {
		return nil, err
	}
	for _, d := range dss {
		out["daemonset/"+d.Namespace+"/"+d.Name] = daemonSetShort(d)
	}
	return out, nil
}

func replicas(p *int32) int32 {
	if p == nil {
		return 1
	}
	return *p
}

func deploymentShort(d *appsv1.Deployment) string {
	want := replicas(d.Spec.Replicas)
	if s := d.Status; s.AvailableReplicas < want || s.UnavailableReplicas > 0 {
		return fmt.Sprintf("%d of %d replicas available", s.AvailableReplicas, want)
	}
	return ""
}

func statefulSetShort(s *appsv1.StatefulSet) string {
	want := replicas(s.Spec.Replicas)
	if s.Status.ReadyReplicas < want || s.Status.AvailableReplicas < want {
		return fmt.Sprintf("%d of %d replicas available", s.Status.AvailableReplicas, want)
	}
	return ""
}

func daemonSetShort(d *appsv1.DaemonSet) string {
	if s := d.Status; s.NumberAvailable < s.DesiredNumberScheduled || s.NumberUnavailable > 0 {
		return fmt.Sprintf("%d of %d pods available", s.NumberAvailable, s.DesiredNumberScheduled)
	}
	return ""
}

// fullyAvailable lists the workloads fully available now: what the gate
// holds the next node to.
func (w *workloadWatch) fullyAvailable() ([]string, error) {
	all, err := w.available()
	if err != nil {
		return nil, err
	}
	var out []string
	for k, why := range all {
		if why == "" {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out, nil
}

// ErrWorkloadsUnavailable means workloads fully available before a node's
// swap were not again within --health-window after it.
var ErrWorkloadsUnavailable = errors.New("workloads not fully available again")

// gateSnapshot is the workloads fully available now (none without the
// gate).
func (r *applyRun) gateSnapshot() ([]string, error) {
	if r.workloads == nil {
		return nil, nil
	}
	return r.workloads.fullyAvailable()
}

// gate waits, at most the health window, until every workload of before
// that still exists is fully available again.
func (r *applyRun) gate(ctx context.Context, node string, before []string) error {
	if r.workloads == nil || len(before) == 0 {
		return nil
	}
	window := r.opts.Plan.HealthWindow
	defer r.timed(&r.res.Waiting)()
	err := r.wait.Poll(ctx, time.Second, window, func(context.Context) error {
		now, err := r.workloads.available()
		if err != nil {
			return err
		}
		var short []string
		for _, k := range before {
			if why, ok := now[k]; ok && why != "" {
				short = append(short, k+" ("+why+")")
			}
		}
		if len(short) > 0 {
			return errors.New(strings.Join(short, ", "))
		}
		return nil
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("node %s: %w within %s (--health-window; --no-workload-gate turns the gate off): %w", node, ErrWorkloadsUnavailable, window, err)
	}
	return err
}

// planGate lists, for the plan, the workloads the gate would hold each
// node to now: those fully available.
func planGate(ctx context.Context, c kubernetes.Interface) ([]string, error) {
	var out []string
	deps, err := c.AppsV1().Deployments("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list deployments: %w", err)
	}
	for i := range deps.Items {
		if deploymentShort(&deps.Items[i]) == "" {
			out = append(out, "deployment/"+deps.Items[i].Namespace+"/"+deps.Items[i].Name)
		}
	}
	sts, err := c.AppsV1().StatefulSets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list statefulsets: %w", err)
	}
	for i := range sts.Items {
		if statefulSetShort(&sts.Items[i]) == "" {
			out = append(out, "statefulset/"+sts.Items[i].Namespace+"/"+sts.Items[i].Name)
		}
	}
	dss, err := c.AppsV1().DaemonSets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list daemonsets: %w", err)
	}
	for i := range dss.Items {
		if daemonSetShort(&dss.Items[i]) == "" {
			out = append(out, "daemonset/"+dss.Items[i].Namespace+"/"+dss.Items[i].Name)
		}
	}
	slices.Sort(out)
	return out, nil
}
