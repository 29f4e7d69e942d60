package kubeadm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/waiter"
)

// staticVersions are the versions the node's control-plane static pods
// run, read from their mirror pods (component=NAME, the image's tag), for
// those Running and Ready only; a tag that does not parse is refused.
// etcdReady says the node's etcd static pod is Running and Ready.
func staticVersions(ctx context.Context, r *driver.Run, node string) (at map[string]string, etcdReady bool, err error) {
	pods, err := controlPlanePods(ctx, r, node)
	if err != nil {
		return nil, false, err
	}
	at = map[string]string{}
	for i := range pods {
		p := &pods[i]
		comp, v, err := preflight.StaticComponent(p)
		if err != nil {
			return nil, false, fmt.Errorf("node %s: %w", node, err)
		}
		if comp != "" && cluster.PodReady(p) {
			at[comp] = v
		}
		if _, mirror := p.Annotations[kubeletcompat.MirrorAnnotation]; mirror && p.Labels["component"] == "etcd" && cluster.PodReady(p) {
			etcdReady = true
		}
	}
	return at, etcdReady, nil
}

// controlPlanePods lists the mirror pods of node's static control plane.
func controlPlanePods(ctx context.Context, r *driver.Run, node string) ([]corev1.Pod, error) {
	pods, err := r.Client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node, LabelSelector: "tier=control-plane"})
	if err != nil {
		return nil, fmt.Errorf("node %s: list its control-plane pods: %w", node, err)
	}
	return pods.Items, nil
}

func allAt(at map[string]string, to string) bool {
	for _, c := range release.ControlPlaneFiles {
		if at[c] != to {
			return false
		}
	}
	return true
}

// waitStaticAt waits until the node's control-plane static pods run the
// target and are Ready, its etcd member's too when etcd is local (kubeadm
// restarts it when its manifest changes, and puts it back when its move
// fails: the API server can answer through the other members while this
// one is down), and its API server answers /readyz.
func (d Driver) waitStaticAt(ctx context.Context, r *driver.Run, o *nodeops.Ops, to string) error {
	defer r.Fx.Timed()()
	err := r.Wait.Poll(ctx, time.Second, r.ReadyTimeout, func(ctx context.Context) error {
		at, etcdReady, err := staticVersions(ctx, r, o.Name)
		if err != nil {
			return err
		}
		for _, c := range release.ControlPlaneFiles {
			if at[c] != to {
				return fmt.Errorf("%s runs %q (or is not Ready), want %s", c, at[c], to)
			}
		}
		if d.cfg != nil && d.cfg.LocalEtcd && !etcdReady {
			return errors.New("etcd is not Ready")
		}
		if r.REST != nil {
			return cluster.Readyz(ctx, r.REST, r.Addresses[o.Name].Address)
		}
		return nil
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("node %s: the control plane is not Ready at %s within %s: %w", o.Name, to, r.ReadyTimeout, err)
	}
	return err
}

// waitAddons waits until kubeadm's addons have rolled out: the kube-proxy
// DaemonSet's pods all updated and available, and so CoreDNS's
// Deployment; before that, a kubelet swap would see kube-proxy's
// containers replaced by the rollout and take it for a restart.
func waitAddons(ctx context.Context, r *driver.Run) error {
	if r.Dry {
		r.Fx.Would("", "wait for kubeadm's addons (kube-proxy, CoreDNS) to roll out", "")
		return nil
	}
	defer r.Fx.Timed()()
	err := r.Wait.Poll(ctx, time.Second, r.ReadyTimeout, func(ctx context.Context) error {
		ds, err := r.Client.AppsV1().DaemonSets(metav1.NamespaceSystem).Get(ctx, "kube-proxy", metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return err
		default:
			if why := daemonSetRolling(ds); why != "" {
				return errors.New(why)
			}
		}
		dep, err := r.Client.AppsV1().Deployments(metav1.NamespaceSystem).Get(ctx, "coredns", metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return err
		default:
			if why := deploymentRolling(dep); why != "" {
				return errors.New(why)
			}
		}
		return nil
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("kubeadm's addons did not roll out within %s: %w", r.ReadyTimeout, err)
	}
	return err
}

func daemonSetRolling(ds *appsv1.DaemonSet) string {
	s := ds.Status
	if s.ObservedGeneration < ds.Generation || s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberAvailable != s.DesiredNumberScheduled {
		return fmt.Sprintf("daemonset %s/%s rolling out: %d of %d updated, %d available", ds.Namespace, ds.Name, s.UpdatedNumberScheduled, s.DesiredNumberScheduled, s.NumberAvailable)
	}
	return ""
}

func deploymentRolling(d *appsv1.Deployment) string {
	s := d.Status
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	if s.ObservedGeneration < d.Generation || s.UpdatedReplicas != want || s.AvailableReplicas != want || s.Replicas != want {
		return fmt.Sprintf("deployment %s/%s rolling out: %d of %d updated, %d available", d.Namespace, d.Name, s.UpdatedReplicas, want, s.AvailableReplicas)
	}
	return ""
}

// waitLeaders waits until the controller manager and the scheduler lead
// from processes that run now: each one's leader lease renewed after the
// holder's static pod started, and that pod Ready. kubeadm's first health
// check runs a Job that must complete within 15 seconds; right after a
// control plane was put back (a failed kubeadm run), a lease renewed by
// the process that was replaced still looks live while the new one waits
// for it to expire.
func waitLeaders(ctx context.Context, r *driver.Run) error {
	if r.Dry {
		r.Fx.Would("", "wait for the controller manager and scheduler to lead from the processes that run now", "")
		return nil
	}
	defer r.Fx.Timed()()
	err := r.Wait.Poll(ctx, time.Second, r.ReadyTimeout, func(ctx context.Context) error {
		for _, comp := range []string{"kube-controller-manager", "kube-scheduler"} {
			if why := leadsNow(ctx, r, comp); why != "" {
				return errors.New(why)
			}
		}
		return nil
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("the control plane has no live leaders within %s: %w", r.ReadyTimeout, err)
	}
	return err
}

// leadsNow says why comp does not lead from a process that runs now, or
// "" when it does. Its lease's holder is NODE_ID (the static pod's host
// name); a holder of another form is taken at its lease's word.
func leadsNow(ctx context.Context, r *driver.Run, comp string) string {
	l, err := r.Client.CoordinationV1().Leases(metav1.NamespaceSystem).Get(ctx, comp, metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("lease kube-system/%s: %v", comp, err)
	}
	if l.Spec.HolderIdentity == nil || l.Spec.RenewTime == nil || *l.Spec.HolderIdentity == "" {
		return fmt.Sprintf("lease kube-system/%s has no holder", comp)
	}
	renewed := l.Spec.RenewTime.Time
	node, _, ok := strings.Cut(*l.Spec.HolderIdentity, "_")
	if !ok {
		return ""
	}
	p, err := r.Client.CoreV1().Pods(metav1.NamespaceSystem).Get(ctx, comp+"-"+node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "" // not a static pod of this name: the lease's word
	}
	if err != nil {
		return fmt.Sprintf("pod kube-system/%s-%s: %v", comp, node, err)
	}
	if !cluster.PodReady(p) {
		return fmt.Sprintf("%s on %s is not Ready", comp, node)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running != nil && !renewed.After(cs.State.Running.StartedAt.Time) {
			return fmt.Sprintf("%s's lease was last renewed (%s) before its process on %s started (%s): no leader yet", comp, renewed.Format(time.RFC3339), node, cs.State.Running.StartedAt.Format(time.RFC3339))
		}
	}
	return ""
}
