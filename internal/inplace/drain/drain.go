// Package drain cordons and drains a node for its upgrade as kubectl
// drain does (the Eviction API, so PodDisruptionBudgets hold), refuses
// to lose a pod no controller would recreate, and undoes only the cordons
// it made (marked on the Node), never one an operator made by hand.
package drain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	kubectldrain "k8s.io/kubectl/pkg/drain"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/cluster"
)

// AnnotationCordoned marks a Node this tool cordoned, so that only those
// are uncordoned (never one an operator cordoned by hand).
const AnnotationCordoned = "kubelift.dev/cordoned"

// Drainer cordons, drains and uncordons the nodes of one run, and
// remembers which it cordoned.
type Drainer struct {
	Client kubernetes.Interface
	Log    *slog.Logger
	// Timeout bounds how long an eviction a budget keeps refusing is
	// retried.
	Timeout time.Duration
	// Event records an Event on a Node (nil: none).
	Event func(ctx context.Context, node, reason, msg string)
	// Lost says why the run lost the upgrade lock for good (nil while it
	// holds it): the run that holds it then may have cordoned a node
	// itself, so nothing is uncordoned.
	Lost func() error
	// Cached reads a Node from the run's informer (nil, or an error: read
	// from the API).
	Cached func(name string) (*corev1.Node, error)
	// Dry: a dry run cordons nothing, so uncordons nothing.
	Dry bool

	cordoned sync.Map
}

func (d *Drainer) lost() error {
	if d.Lost == nil {
		return nil
	}
	return d.Lost()
}

// Mine says this run cordoned the node and has not uncordoned it.
func (d *Drainer) Mine(name string) bool {
	_, ok := d.cordoned.Load(name)
	return ok
}

// ErrDrainBlocked means a PodDisruptionBudget (or a pod nobody would
// recreate) keeps a node from being drained.
var ErrDrainBlocked = errors.New("drain blocked")

// Cordon marks the node unschedulable, remembering that it did; a node
// already unschedulable is left as the operator made it.
func (d *Drainer) Cordon(ctx context.Context, name string) error {
	// Conditional on the Node as read: a cordon made by hand between the
	// read and the patch is a conflict, read again (and then left alone),
	// never marked as kubelift's. A transient failure (an HA control
	// plane's etcd changing leaders) is read again and made again too.
	err := cluster.OnTransient(ctx, cluster.TransientRetry, apierrors.IsConflict, func() error {
		n, err := d.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Spec.Unschedulable {
			return nil
		}
		patch, err := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": true},
			"metadata": map[string]any{"resourceVersion": n.ResourceVersion, "annotations": map[string]any{AnnotationCordoned: "true"}}})
		if err != nil {
			return err
		}
		d.cordoned.Store(name, true) // before the patch: a failed one is undone too
		_, err = d.Client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsConflict(err) {
			d.cordoned.Delete(name) // not applied
		}
		if err == nil && d.Event != nil {
			d.Event(ctx, name, "Cordoned", "kubelift: cordoned to drain it")
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s: cordon: %w", name, err)
	}
	return nil
}

// Uncordon undoes Cordon, only where this tool cordoned. For a node this
// run did not cordon, the run's Node informer answers (a cordon by an
// earlier run was seen there long before), so it costs no request; one
// this run cordoned is always read from the API, which may be ahead of
// the informer.
func (d *Drainer) Uncordon(ctx context.Context, name string) error {
	if d.Dry {
		return nil // a dry run cordoned nothing
	}
	if lost := d.lost(); lost != nil {
		// The run that holds the lock now may have cordoned it itself.
		d.Log.Warn("not uncordoned: another run holds the upgrade lock now", "node", name, "err", lost)
		return nil
	}
	if _, mine := d.cordoned.Load(name); !mine && d.Cached != nil {
		if n, err := d.Cached(name); err == nil && n.Annotations[AnnotationCordoned] != "true" {
			return nil
		}
	}
	// Conditional on the Node as read, as cordon is.
	err := cluster.OnTransient(ctx, cluster.TransientRetry, apierrors.IsConflict, func() error {
		n, err := d.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Annotations[AnnotationCordoned] != "true" {
			return nil
		}
		patch, err := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": false},
			"metadata": map[string]any{"resourceVersion": n.ResourceVersion, "annotations": map[string]any{AnnotationCordoned: nil}}})
		if err != nil {
			return err
		}
		_, err = d.Client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s: uncordon: %w", name, err)
	}
	d.cordoned.Delete(name)
	return nil
}

// UncordonLeftovers uncordons every node this run cordoned and has not
// uncordoned yet, whatever ended the run (an error, a cancel, a lost
// lock): a run never leaves its own cordon behind. Nodes an operator
// cordoned were never this run's.
func (d *Drainer) UncordonLeftovers(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	d.cordoned.Range(func(k, _ any) bool {
		name := k.(string)
		if err := d.Uncordon(ctx, name); err != nil {
			d.Log.Error("cannot uncordon a node this run cordoned: uncordon it by hand (kubectl uncordon)", "node", name, "err", err)
		}
		return true
	})
}

// Drain cordons the node and evicts its pods as `kubectl drain
// --ignore-daemonsets --delete-emptydir-data` does (k8s.io/kubectl's
// kubectldrain.Helper: the Eviction API, so PodDisruptionBudgets hold; DaemonSet
// and mirror pods stay; the evicted pods waited for until gone). On top of
// it, kubelift's own rules: a pod no controller would recreate is not
// evicted, the drain is refused before the node is cordoned; the cordon is
// kubelift's, marked so that only it is undone; and an eviction a budget
// keeps refusing past DrainTimeout stops the drain with the node
// uncordoned: no half state.
func (d *Drainer) Drain(ctx context.Context, name string) error {
	h := &kubectldrain.Helper{
		Ctx:                  ctx,
		Client:               d.Client,
		Force:                true, // unreplicated pods are refused by kubelift's filter below, with its message
		GracePeriodSeconds:   -1,   // each pod's own terminationGracePeriodSeconds
		IgnoreAllDaemonSets:  true,
		DeleteEmptyDirData:   true,
		Timeout:              d.Timeout,
		EvictErrorRetryDelay: 2 * time.Second,
		AdditionalFilters:    []kubectldrain.PodFilter{refuseUnreplicated},
		Out:                  logWriter{d.Log, name},
		ErrOut:               logWriter{d.Log, name},
	}
	list, errs := h.GetPodsForDeletion(name)
	if list == nil {
		return fmt.Errorf("node %s: list its pods: %w", name, errors.Join(errs...))
	}
	if len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, err := range errs {
			msgs[i] = err.Error()
		}
		sort.Strings(msgs)
		return fmt.Errorf("node %s: %w: %s", name, ErrDrainBlocked, strings.Join(msgs, "; "))
	}
	if w := list.Warnings(); w != "" {
		d.Log.Info("drain: "+w, "node", name)
	}
	if err := d.Cordon(ctx, name); err != nil {
		return err
	}
	pods := list.Pods()
	if err := h.DeleteOrEvictPods(pods); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("node %s: drain: %w", name, context.Cause(ctx))
		} else {
			err = fmt.Errorf("node %s: %w; the node is uncordoned again", name, d.drainLeft(ctx, pods, err))
		}
		if uerr := d.Uncordon(context.WithoutCancel(ctx), name); uerr != nil {
			return fmt.Errorf("%w; %w", err, uerr)
		}
		return err
	}
	d.Log.Info("drained", "node", name, "evicted", len(pods))
	return nil
}

// drainLeft says why a drain that failed with err did not empty the node,
// from what is left of pods: those still there, not being deleted, were
// refused (a PodDisruptionBudget: ErrDrainBlocked); those being deleted
// are still terminating.
func (d *Drainer) drainLeft(ctx context.Context, pods []corev1.Pod, err error) error {
	var refused, terminating []string
	for _, p := range pods {
		q, gerr := d.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		switch {
		case gerr != nil || q.UID != p.UID:
			continue // gone (or not known: kubectl's error says it)
		case q.DeletionTimestamp != nil:
			terminating = append(terminating, p.Namespace+"/"+p.Name)
		default:
			refused = append(refused, p.Namespace+"/"+p.Name)
		}
	}
	sort.Strings(refused)
	sort.Strings(terminating)
	switch {
	case len(refused) > 0:
		return fmt.Errorf("%w: evicting %s is refused by a PodDisruptionBudget for %s (%w)", ErrDrainBlocked, strings.Join(refused, ", "), d.Timeout, err)
	case len(terminating) > 0:
		return fmt.Errorf("pods %s still terminating after %s (%w)", strings.Join(terminating, ", "), d.Timeout, err)
	}
	return err
}

// refuseUnreplicated is kubelift's drain rule on top of kubectl's: a
// running pod that no controller would recreate would be lost, so the
// drain is refused (kubectl drain without --force refuses it too, but
// says to use --force).
func refuseUnreplicated(p corev1.Pod) kubectldrain.PodDeleteStatus {
	if p.Namespace == agent.Namespace {
		// Agent mode's agent: the run's own, which runs the node's steps
		// and goes at the run's end; never evicted.
		return kubectldrain.MakePodDeleteStatusSkip()
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return kubectldrain.MakePodDeleteStatusOkay()
	}
	switch c := metav1.GetControllerOf(&p); {
	case c == nil:
		return kubectldrain.MakePodDeleteStatusWithError("pods no controller would recreate (they would be lost: delete or move them, or upgrade without --drain)")
	case c.Kind == "DaemonSet":
		// kubectl lets through (under Force) only the pods of a DaemonSet
		// that is gone: nothing would recreate them either.
		return kubectldrain.MakePodDeleteStatusWithError("pods of a DaemonSet that is gone, which no controller would recreate (delete them, or upgrade without --drain)")
	}
	return kubectldrain.MakePodDeleteStatusOkay()
}

// logWriter turns what kubectl's drain helper writes (one line per
// eviction, per refusal and retry) into log lines of the node.
type logWriter struct {
	log  *slog.Logger
	node string
}

func (w logWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimSpace(string(p)), "\n") {
		if line != "" {
			w.log.Info("drain: "+line, "node", w.node)
		}
	}
	return len(p), nil
}
