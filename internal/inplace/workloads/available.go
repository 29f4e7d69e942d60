package workloads

import (
	"context"
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Lists lists the workloads the workload gate judges, of each kind
// (from the API, or from a run's informers).
type Lists struct {
	Deployments  func() ([]*appsv1.Deployment, error)
	StatefulSets func() ([]*appsv1.StatefulSet, error)
	DaemonSets   func() ([]*appsv1.DaemonSet, error)
}

// State is a workload as the gate reads it: why it is not fully
// available ("" when it is), and its spec's generation.
type State struct {
	Short      string
	Generation int64
}

// Available maps each workload ("deployment/NS/NAME") to its state.
func (w Lists) Available() (map[string]State, error) {
	out := map[string]State{}
	deps, err := w.Deployments()
	if err != nil {
		return nil, err
	}
	for _, d := range deps {
		out["deployment/"+d.Namespace+"/"+d.Name] = State{deploymentShort(d), d.Generation}
	}
	sts, err := w.StatefulSets()
	if err != nil {
		return nil, err
	}
	for _, s := range sts {
		out["statefulset/"+s.Namespace+"/"+s.Name] = State{statefulSetShort(s), s.Generation}
	}
	dss, err := w.DaemonSets()
	if err != nil {
		return nil, err
	}
	for _, d := range dss {
		out["daemonset/"+d.Namespace+"/"+d.Name] = State{daemonSetShort(d), d.Generation}
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

// FullyAvailable lists, for the plan, the workloads the gate would hold
// each node to now: those fully available.
func FullyAvailable(ctx context.Context, c kubernetes.Interface) ([]string, error) {
	// The workloads as the API lists them now, judged as the gate judges
	// them (available).
	w := Lists{
		Deployments: func() ([]*appsv1.Deployment, error) {
			l, err := c.AppsV1().Deployments("").List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, fmt.Errorf("list deployments: %w", err)
			}
			return pointers(l.Items), nil
		},
		StatefulSets: func() ([]*appsv1.StatefulSet, error) {
			l, err := c.AppsV1().StatefulSets("").List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, fmt.Errorf("list statefulsets: %w", err)
			}
			return pointers(l.Items), nil
		},
		DaemonSets: func() ([]*appsv1.DaemonSet, error) {
			l, err := c.AppsV1().DaemonSets("").List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, fmt.Errorf("list daemonsets: %w", err)
			}
			return pointers(l.Items), nil
		},
	}
	states, err := w.Available()
	if err != nil {
		return nil, err
	}
	var out []string
	for name, st := range states {
		if st.Short == "" {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// pointers points at each of items.
func pointers[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

// IsDaemonSetPod: a DaemonSet owns p.
func IsDaemonSetPod(p *corev1.Pod) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}

// Tolerates reports whether tolerations cover key:NoExecute for good (or
// for a while: tolerationSeconds is what DefaultTolerationSeconds gives).
func Tolerates(ts []corev1.Toleration, key string) bool {
	for _, t := range ts {
		if t.Effect != "" && t.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if t.Key == key || (t.Key == "" && t.Operator == corev1.TolerationOpExists) {
			return true
		}
	}
	return false
}
