package coredns

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"

	"github.com/kubelift/kubelift/internal/waiter"
)

// DrainTime is how long an old CoreDNS pod goes on answering, at the
// least, after it left its Services, before its Deployment stops it:
// longer than the kernel keeps a UDP conntrack entry that still points at
// it and is not used (30 s, nf_conntrack_udp_timeout). Without it, a
// query whose source port matches such an entry goes to the old pod past
// its exit (its lameduck, 5 s in kubeadm's Corefile, ends it while
// kube-proxy still flushes those entries only once the pod is gone:
// kubernetes#129617): a lookup lost, that the client waits out. Entries
// that are used live on: quiet.go waits for them too.
const DrainTime = 40 * time.Second

// knobs are what a roll changes while it runs and puts back after: the
// Deployment's strategy and minReadySeconds, and the selector of every
// Service in front of its pods.
type knobs struct {
	Strategy        appsv1.DeploymentStrategy    `json:"strategy"`
	MinReadySeconds int32                        `json:"minReadySeconds"`
	Services        map[string]map[string]string `json:"services,omitempty"`
}

// knobsOf reads d's knobs and the Services whose selector picks its pods.
func (r Roller) knobsOf(ctx context.Context, d *appsv1.Deployment) (knobs, error) {
	k := knobs{Strategy: d.Spec.Strategy, MinReadySeconds: d.Spec.MinReadySeconds, Services: map[string]map[string]string{}}
	svcs, err := r.Client.CoreV1().Services(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return k, fmt.Errorf("services in %s: %w", Namespace, err)
	}
	for _, s := range svcs.Items {
		if len(s.Spec.Selector) > 0 && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
			k.Services[s.Name] = s.Spec.Selector
		}
	}
	return k, nil
}

// drainRoll writes next so that every new replica starts before any old
// one stops (maxSurge 100%, maxUnavailable 0), the old ones held
// (minReadySeconds past DrainTime and Hold); once every new replica is
// ready, the Services in front of the pods select the new ones only
// (their pod-template-hash), so that the old ones leave every node's
// rules while they still answer; once no node sends them queries any
// more (untilQuiet), the Deployment lets them go, and it waits until they
// are gone. The knobs are put back after (restore), whatever happened;
// the backup says a drain is under way meanwhile, so that a run killed in
// it puts them back first (settle).
func (r Roller) drainRoll(ctx context.Context, next *appsv1.Deployment, b *Backup) error {
	if err := r.markDraining(ctx, true); err != nil {
		return err
	}
	err := r.drain(ctx, next, b)
	if err := errors.Join(err, r.restoreNow(ctx, b)); err != nil {
		return err
	}
	return r.markDraining(ctx, false)
}

// restoreNow is restore, even when ctx is done (the run interrupted),
// within restoreTime.
func (r Roller) restoreNow(ctx context.Context, b *Backup) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), restoreTime)
	defer cancel()
	return r.restore(ctx, b)
}

// restoreTime bounds putting the knobs back after a run was interrupted.
const restoreTime = 30 * time.Second

// settle puts back the knobs of a drain a run left under way (killed in
// it), and says so in the backup.
func (r Roller) settle(ctx context.Context, b *Backup) error {
	if b == nil || !b.Draining {
		return nil
	}
	if err := r.restoreNow(ctx, b); err != nil {
		return fmt.Errorf("putting back what a stopped CoreDNS roll changed: %w", err)
	}
	b.Draining = false
	return r.markDraining(ctx, false)
}

// markDraining records in the backup that a drain is under way, or over.
func (r Roller) markDraining(ctx context.Context, on bool) error {
	v := ""
	if on {
		v = "true"
	}
	cms := r.Client.CoreV1().ConfigMaps(Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, BackupName, metav1.GetOptions{})
		if err != nil || cm.Data["draining"] == v {
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data["draining"] = v
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("configmap %s/%s: %w", Namespace, BackupName, err)
	}
	return nil
}

func (r Roller) drain(ctx context.Context, next *appsv1.Deployment, b *Backup) error {
	all, none := intstr.FromString("100%"), intstr.FromInt32(0)
	next.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &all, MaxUnavailable: &none}}
	// The Deployment holds the old pods (minReadySeconds past the hold)
	// until untilQuiet lets them go.
	next.Spec.MinReadySeconds = max(b.Knobs.MinReadySeconds, int32((r.drainTime()+Hold+time.Minute)/time.Second))
	if pds := next.Spec.ProgressDeadlineSeconds; pds != nil && *pds <= next.Spec.MinReadySeconds {
		// The API server takes no minReadySeconds of the deadline or
		// more: the hold is the deadline's, short of it.
		next.Spec.MinReadySeconds = max(b.Knobs.MinReadySeconds, *pds-1)
	}
	if err := r.updateDeployment(ctx, func(d *appsv1.Deployment) {
		d.Spec.Template, d.Spec.Strategy, d.Spec.MinReadySeconds = next.Spec.Template, next.Spec.Strategy, next.Spec.MinReadySeconds
	}); err != nil {
		return err
	}
	hash, err := r.waitNewReady(ctx, next.Name)
	if err != nil {
		return err
	}
	for name, sel := range b.Knobs.Services {
		only := maps.Clone(sel)
		only[appsv1.DefaultDeploymentUniqueLabelKey] = hash
		if err := r.setSelector(ctx, name, only); err != nil {
			return err
		}
	}
	// The old pods stop once no node sends them queries any more.
	switched := r.Wait.Now()
	old, err := r.oldPods(ctx, next, hash)
	if err != nil {
		return err
	}
	if err := r.untilQuiet(ctx, old, switched); err != nil {
		return err
	}
	if err := r.updateDeployment(ctx, func(d *appsv1.Deployment) { d.Spec.MinReadySeconds = b.Knobs.MinReadySeconds }); err != nil {
		return err
	}
	return r.waitRolledWithin(ctx, next.Name, r.Timeout+time.Duration(b.Knobs.MinReadySeconds)*time.Second)
}

// updateDeployment applies change to the Deployment as the API holds it
// now, again on a conflict (its controller writes it too: the revision).
func (r Roller) updateDeployment(ctx context.Context, change func(*appsv1.Deployment)) error {
	deps := r.Client.AppsV1().Deployments(Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := deps.Get(ctx, Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(d)
		_, err = deps.Update(ctx, d, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("deployment %s/%s: %w", Namespace, Name, err)
	}
	return nil
}

func (r Roller) drainTime() time.Duration {
	if r.Drain > 0 {
		return r.Drain
	}
	return DrainTime
}

// waitNewReady waits until the Deployment's newest ReplicaSet (the
// controller's revision) has every replica ready, and returns its
// pod-template-hash.
func (r Roller) waitNewReady(ctx context.Context, name string) (string, error) {
	var hash string
	err := r.Wait.Poll(ctx, time.Second, r.Timeout, func(ctx context.Context) error {
		d, err := r.Client.AppsV1().Deployments(Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ObservedGeneration < d.Generation {
			return errors.New("the controller has not seen the new template yet")
		}
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil {
			return waiter.Stop(fmt.Errorf("spec.selector: %w", err))
		}
		rss, err := r.Client.AppsV1().ReplicaSets(Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
		if err != nil {
			return err
		}
		// The controller's new ReplicaSet is the one whose template is
		// the Deployment's but for its hash label (one it had before,
		// when a roll goes back to an old template).
		for _, rs := range rss.Items {
			if !metav1.IsControlledBy(&rs, d) || !sameTemplate(rs.Spec.Template, d.Spec.Template) {
				continue
			}
			want := replicas(d)
			if rs.Spec.Replicas == nil || *rs.Spec.Replicas != want || rs.Status.ReadyReplicas != want {
				return fmt.Errorf("replicaset %s: %d of %d new replicas ready", rs.Name, rs.Status.ReadyReplicas, want)
			}
			if hash = rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey]; hash == "" {
				return waiter.Stop(fmt.Errorf("replicaset %s has no %s label", rs.Name, appsv1.DefaultDeploymentUniqueLabelKey))
			}
			return nil
		}
		return errors.New("no replicaset of the new template yet")
	})
	if err != nil {
		return "", fmt.Errorf("deployment %s/%s: new replicas: %w", Namespace, name, err)
	}
	return hash, nil
}

// sameTemplate: a ReplicaSet's template is a Deployment's, but for the
// hash label the controller adds.
func sameTemplate(rs, d corev1.PodTemplateSpec) bool {
	rs = *rs.DeepCopy()
	delete(rs.Labels, appsv1.DefaultDeploymentUniqueLabelKey)
	if len(rs.Labels) == 0 {
		rs.Labels = nil
	}
	if len(d.Labels) == 0 {
		d.Labels = nil
	}
	return apiequality.Semantic.DeepEqual(rs, d)
}

// restore puts the knobs back where they differ from b's: the
// Deployment's strategy and minReadySeconds (its template unchanged: no
// rollout), each Service's selector.
func (r Roller) restore(ctx context.Context, b *Backup) error {
	d, err := r.Client.AppsV1().Deployments(Namespace).Get(ctx, Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("deployment %s/%s: %w", Namespace, Name, err)
	}
	if !apiequality.Semantic.DeepEqual(d.Spec.Strategy, b.Knobs.Strategy) || d.Spec.MinReadySeconds != b.Knobs.MinReadySeconds {
		if err := r.updateDeployment(ctx, func(d *appsv1.Deployment) {
			d.Spec.Strategy, d.Spec.MinReadySeconds = b.Knobs.Strategy, b.Knobs.MinReadySeconds
		}); err != nil {
			return fmt.Errorf("put its strategy back: %w", err)
		}
	}
	for name, sel := range b.Knobs.Services {
		if err := r.setSelector(ctx, name, sel); err != nil {
			return err
		}
	}
	return nil
}

// setSelector sets Service name's selector, where it differs.
func (r Roller) setSelector(ctx context.Context, name string, sel map[string]string) error {
	svcs := r.Client.CoreV1().Services(Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := svcs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil // deleted since: nothing to select or put back
		}
		if err != nil || maps.Equal(s.Spec.Selector, sel) {
			return err
		}
		s.Spec.Selector = sel
		_, err = svcs.Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("service %s/%s: selector: %w", Namespace, name, err)
	}
	return nil
}

// replicas is d's desired replicas (1 when unset).
func replicas(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas != nil {
		return *d.Spec.Replicas
	}
	return 1
}
