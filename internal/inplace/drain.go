package inplace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/waiter"
)

// AnnotationCordoned marks a Node this tool cordoned, so that only those
// are uncordoned (never one an operator cordoned by hand).
const AnnotationCordoned = "kubelift.dev/cordoned"

// ErrDrainBlocked means a PodDisruptionBudget (or a pod nobody would
// recreate) keeps a node from being drained.
var ErrDrainBlocked = errors.New("drain blocked")

// cordon marks the node unschedulable, remembering that it did; a node
// already unschedulable is left as the operator made it.
func (r *applyRun) cordon(ctx context.Context, name string) error {
	n, err := r.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	if n.Spec.Unschedulable {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": true}, "metadata": map[string]any{"annotations": map[string]any{AnnotationCordoned: "true"}}})
	if err != nil {
		return err
	}
	r.cordoned.Store(name, true) // before the patch: a failed one is undone too
	if _, err := r.client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: cordon: %w", name, err)
	}
	r.event(ctx, name, "Cordoned", "kubelift: cordoned to drain it")
	return nil
}

// uncordon undoes cordon, only where this tool cordoned. For a node this
// run did not cordon, the run's Node informer answers (a cordon by an
// earlier run was seen there long before), so it costs no request; one
// this run cordoned is always read from the API, which may be ahead of
// the informer.
func (r *applyRun) uncordon(ctx context.Context, name string) error {
	if r.dry {
		return nil // a dry run cordoned nothing
	}
	if _, mine := r.cordoned.Load(name); !mine && r.watch != nil {
		if n, err := r.watch.lister(name); err == nil && n.Annotations[AnnotationCordoned] != "true" {
			return nil
		}
	}
	n, err := r.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	if n.Annotations[AnnotationCordoned] != "true" {
		r.cordoned.Delete(name)
		return nil
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": false}, "metadata": map[string]any{"annotations": map[string]any{AnnotationCordoned: nil}}})
	if err != nil {
		return err
	}
	if _, err := r.client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: uncordon: %w", name, err)
	}
	r.cordoned.Delete(name)
	return nil
}

// uncordonLeftovers uncordons every node this run cordoned and has not
// uncordoned yet, whatever ended the run (an error, a cancel, a lost
// lock): a run never leaves its own cordon behind. Nodes an operator
// cordoned were never this run's.
func (r *applyRun) uncordonLeftovers(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	r.cordoned.Range(func(k, _ any) bool {
		name := k.(string)
		if err := r.uncordon(ctx, name); err != nil {
			r.log.Error("cannot uncordon a node this run cordoned: uncordon it by hand (kubectl uncordon)", "node", name, "err", err)
		}
		return true
	})
}

// drain cordons the node and evicts its pods through the Eviction API, so
// PodDisruptionBudgets hold; DaemonSet and mirror pods stay. A pod no
// controller would recreate is not evicted: the drain is refused before it
// starts. An eviction a budget keeps refusing past DrainTimeout stops the
// drain, and the node is uncordoned: no half state.
func (r *applyRun) drain(ctx context.Context, name string) error {
	pods, err := r.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
	if err != nil {
		return fmt.Errorf("node %s: list pods: %w", name, err)
	}
	var evict []corev1.Pod
	var bare []string
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || isDaemonSetPod(&p) || p.Annotations[corev1.MirrorPodAnnotationKey] != "" {
			continue
		}
		if metav1.GetControllerOf(&p) == nil {
			bare = append(bare, p.Namespace+"/"+p.Name)
			continue
		}
		evict = append(evict, p)
	}
	if len(bare) > 0 {
		sort.Strings(bare)
		return fmt.Errorf("node %s: %w: pods no controller would recreate would be lost: %s (delete or move them, or upgrade without --drain)", name, ErrDrainBlocked, strings.Join(bare, ", "))
	}
	if err := r.cordon(ctx, name); err != nil {
		return err
	}
	fail := func(err error) error {
		if uerr := r.uncordon(context.WithoutCancel(ctx), name); uerr != nil {
			return fmt.Errorf("%w; %w", err, uerr)
		}
		return err
	}
	// One deadline for the whole drain: evictions, then the evicted pods
	// gone.
	began := r.wait.Now()
	left := func() time.Duration { return r.opts.DrainTimeout - r.wait.Since(began) }
	for _, p := range evict {
		err := r.wait.Poll(ctx, 2*time.Second, left(), func(ctx context.Context) error {
			err := r.client.CoreV1().Pods(p.Namespace).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
			switch {
			case err == nil || apierrors.IsNotFound(err):
				return nil
			case apierrors.IsTooManyRequests(err):
				return err // a PodDisruptionBudget says not now
			}
			return waiter.Stop(fmt.Errorf("node %s: evict pod %s/%s: %w", name, p.Namespace, p.Name, err))
		})
		if errors.Is(err, waiter.ErrTimeout) {
			err = fmt.Errorf("node %s: %w: evicting pod %s/%s is refused by its PodDisruptionBudget (%v) for %s; the node is uncordoned again", name, ErrDrainBlocked, p.Namespace, p.Name, err, r.opts.DrainTimeout)
		}
		if err != nil {
			return fail(err)
		}
	}
	// The evicted pods must be gone before the kubelet restarts.
	for _, p := range evict {
		err := r.wait.Poll(ctx, time.Second, left(), func(ctx context.Context) error {
			q, err := r.client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && q.UID != p.UID) {
				return nil
			}
			return fmt.Errorf("pod %s/%s still there", p.Namespace, p.Name)
		})
		if errors.Is(err, waiter.ErrTimeout) {
			err = fmt.Errorf("node %s: pod %s/%s still terminating after %s", name, p.Namespace, p.Name, r.opts.DrainTimeout)
		}
		if err != nil {
			return fail(err)
		}
	}
	r.log.Info("drained", "node", name, "evicted", len(evict))
	return nil
}
