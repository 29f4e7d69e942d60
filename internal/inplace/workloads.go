package inplace

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
)

// workloadsStep adds the missing not-ready/unreachable tolerations to
// running pods and, with RestoreLabels, the labels their nodeSelectors
// need; both only add.
func (r *upgradeRun) workloadsStep(ctx context.Context) error {
	if err := r.setState(ctx, record.StatePatchingWorkloads); err != nil {
		return err
	}
	if err := r.addTolerations(ctx); err != nil {
		return err
	}
	if !r.opts.RestoreLabels {
		return nil
	}
	want, err := r.labelsWanted()
	if err != nil {
		return err
	}
	return r.restoreLabels(ctx, want)
}

// addTolerations adds the missing not-ready and unreachable tolerations
// to every running pod but a DaemonSet's.
func (r *upgradeRun) addTolerations(ctx context.Context) error {
	for i := range r.view.Pods {
		pod := &r.view.Pods[i]
		if pod.Spec.NodeName == "" || preflight.IsDaemonSetPod(pod) {
			continue
		}
		patch, err := tolerationsPatch(pod.Spec.Tolerations)
		if err != nil {
			return err
		}
		if patch == nil {
			continue
		}
		if r.dry {
			r.would(pod.Spec.NodeName, "add tolerations to pod "+pod.Namespace+"/"+pod.Name, string(patch))
			r.res.Patched = append(r.res.Patched, pod.Namespace+"/"+pod.Name)
			continue
		}
		if _, err := r.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, patch, metav1.PatchOptions{}); apierrors.IsNotFound(err) {
			// Gone since the plan listed it (a rollout replaced it): its
			// replacement is the plan's next run's business.
			r.log.Info("pod gone before its tolerations were added", "pod", pod.Namespace+"/"+pod.Name)
			continue
		} else if err != nil {
			return fmt.Errorf("pod %s/%s: add tolerations: %w", pod.Namespace, pod.Name, err)
		}
		r.res.Patched = append(r.res.Patched, pod.Namespace+"/"+pod.Name)
	}
	if len(r.res.Patched) > 0 {
		r.log.Info("tolerations added", "pods", len(r.res.Patched))
	}
	return nil
}

// labelsWanted are, per node, the labels its pods' nodeSelectors need
// and it lacks; two pods needing one label with two values are refused.
func (r *upgradeRun) labelsWanted() (map[string]map[string]string, error) {
	nodes := map[string]*corev1.Node{}
	for i := range r.view.Nodes {
		nodes[r.view.Nodes[i].Name] = &r.view.Nodes[i]
	}
	want := map[string]map[string]string{}
	for i := range r.view.Pods {
		pod := &r.view.Pods[i]
		node := nodes[pod.Spec.NodeName]
		if node == nil {
			continue
		}
		for k, v := range pod.Spec.NodeSelector {
			if have, ok := node.Labels[k]; !ok || have != v {
				if want[node.Name] == nil {
					want[node.Name] = map[string]string{}
				}
				if prev, clash := want[node.Name][k]; clash && prev != v {
					return nil, fmt.Errorf("node %s: pods need label %s both as %q and %q", node.Name, k, prev, v)
				}
				want[node.Name][k] = v
			}
		}
	}
	return want, nil
}

// restoreLabels adds want's labels to each node, in name order.
func (r *upgradeRun) restoreLabels(ctx context.Context, want map[string]map[string]string) error {
	for _, n := range slices.Sorted(maps.Keys(want)) {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(want[n])) {
			kv = append(kv, k+"="+want[n][k])
			r.res.Labels = append(r.res.Labels, n+": "+k+"="+want[n][k])
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": want[n]}})
		if err != nil {
			return err
		}
		if r.dry {
			r.would(n, "restore labels "+strings.Join(kv, ", "), string(patch))
			continue
		}
		if _, err := r.client.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("node %s: restore labels: %w", n, err)
		}
		r.event(ctx, n, "LabelsRestored", "kubelift: labels restored for pods' nodeSelectors: "+strings.Join(kv, ", "))
	}
	return nil
}

// tolerationsPatch is the JSON patch that adds the not-ready and
// unreachable NoExecute tolerations (300 s, as DefaultTolerationSeconds
// gives) a pod lacks; nil when it lacks none. Patches only add: existing
// tolerations cannot be changed.
func tolerationsPatch(have []corev1.Toleration) ([]byte, error) {
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	var ops []op
	if have == nil {
		ops = append(ops, op{Op: "add", Path: "/spec/tolerations", Value: []corev1.Toleration{}})
	}
	seconds := int64(300)
	for _, key := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
		if !preflight.Tolerates(have, key) {
			ops = append(ops, op{Op: "add", Path: "/spec/tolerations/-", Value: corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists,
				Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &seconds}})
		}
	}
	if len(ops) == 0 {
		return nil, nil
	}
	return json.Marshal(ops)
}

// annotationsPatch is a merge patch setting (or, for nil, removing) a
// Node's annotations.
func annotationsPatch(a map[string]any) ([]byte, error) {
	return json.Marshal(map[string]any{"metadata": map[string]any{"annotations": a}})
}
