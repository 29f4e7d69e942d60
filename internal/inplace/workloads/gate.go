package workloads

import (
	"context"
	"errors"
	"fmt"
	"maps"
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
// node, every Deployment, StatefulSet and DaemonSet with a pod on the
// node that was fully available before the node's swap must be fully
// available again within --health-window, or the run stops there and
// rolls the node back, naming them (StarlingX waits for its apps "fully
// applied"; Rook asks each daemon ok-to-stop). Only the node's own
// workloads: another node in flight, or a rollout, does not fail this
// one; a workload whose spec changed since (its generation) is passed
// over.

// ErrUnavailable means workloads fully available before a node's swap
// were not again within --health-window after it.
var ErrUnavailable = errors.New("workloads not fully available again")

// Watch serves the gate from one informer per kind.
type Watch struct {
	Lists
	// rsOwner maps a ReplicaSet (NS/NAME) to its Deployment's name.
	rsOwner func(ns, name string) string
	stop    context.CancelFunc
}

// WatchWorkloads starts the gate's informers, for as long as ctx.
func WatchWorkloads(ctx context.Context, c kubernetes.Interface) (*Watch, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := informers.NewSharedInformerFactory(c, 0)
	d, s, ds, rs := f.Apps().V1().Deployments(), f.Apps().V1().StatefulSets(), f.Apps().V1().DaemonSets(), f.Apps().V1().ReplicaSets()
	synced := []cache.InformerSynced{d.Informer().HasSynced, s.Informer().HasSynced, ds.Informer().HasSynced, rs.Informer().HasSynced}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		cancel()
		return nil, fmt.Errorf("watch workloads: %w", ctx.Err())
	}
	all := labels.Everything()
	return &Watch{stop: cancel,
		rsOwner: func(ns, name string) string {
			r, err := rs.Lister().ReplicaSets(ns).Get(name)
			if err != nil {
				return ""
			}
			if ref := metav1.GetControllerOf(r); ref != nil && ref.Kind == "Deployment" {
				return ref.Name
			}
			return ""
		},
		Lists: Lists{
			Deployments:  func() ([]*appsv1.Deployment, error) { return d.Lister().List(all) },
			StatefulSets: func() ([]*appsv1.StatefulSet, error) { return s.Lister().List(all) },
			DaemonSets:   func() ([]*appsv1.DaemonSet, error) { return ds.Lister().List(all) },
		},
	}, nil
}

// Close stops the informers.
func (w *Watch) Close() { w.stop() }

// workloadOf is the workload a pod's controller (KIND/NS/NAME) belongs
// to, as Available names it ("" for none the gate watches).
func (w *Watch) workloadOf(owner string) string {
	kind, rest, _ := strings.Cut(owner, "/")
	ns, name, _ := strings.Cut(rest, "/")
	switch kind {
	case "ReplicaSet":
		if d := w.rsOwner(ns, name); d != "" {
			return "deployment/" + ns + "/" + d
		}
	case "StatefulSet":
		return "statefulset/" + ns + "/" + name
	case "DaemonSet":
		return "daemonset/" + ns + "/" + name
	}
	return ""
}

// FullyAvailable maps the workloads of the running pods whose
// controllers are owners (KIND/NS/NAME; a node's) fully available now to
// their generations: what the gate holds the node to.
func (w *Watch) FullyAvailable(owners []string) (map[string]int64, error) {
	all, err := w.Available()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, owner := range owners {
		k := w.workloadOf(owner)
		if st, ok := all[k]; ok && k != "" && st.Short == "" {
			out[k] = st.Generation
		}
	}
	return out, nil
}

// Again waits, at most window on wt's clock, until every workload of
// before that still exists (at the same generation) is fully available
// again; the error names node and the workloads short.
func (w *Watch) Again(ctx context.Context, wt waiter.Waiter, window time.Duration, node string, before map[string]int64) error {
	err := wt.Poll(ctx, time.Second, window, func(context.Context) error {
		now, err := w.Available()
		if err != nil {
			return err
		}
		var short []string
		for _, k := range slices.Sorted(maps.Keys(before)) {
			if st, ok := now[k]; ok && st.Short != "" && st.Generation == before[k] {
				short = append(short, k+" ("+st.Short+")")
			}
		}
		if len(short) > 0 {
			return errors.New(strings.Join(short, ", "))
		}
		return nil
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("node %s: %w within %s (--health-window; --no-workload-gate turns the gate off): %w", node, ErrUnavailable, window, err)
	}
	return err
}
