// Package workloads is what an upgrade does for the cluster's running
// workloads and how it watches them: the not-ready/unreachable
// tolerations a pod lacks added, the labels pods' nodeSelectors need
// restored on their nodes (both only add), and the workload gate: which
// workloads are fully available (available.go, read from the API for the
// plan), and the watch (gate.go) that holds a node's workloads to being
// fully available again after its kubelet moved.
package workloads

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/cluster"
)

// Patcher adds to pods and nodes what the upgrade needs.
type Patcher struct {
	Client kubernetes.Interface
	Log    *slog.Logger
	// Would, when set, makes a dry run: each change is said, not made.
	Would func(node, what, command string)
	// Event posts an Event on a node.
	Event func(ctx context.Context, node, reason, msg string)
}

// AddTolerations adds the missing not-ready and unreachable tolerations
// to every running pod of pods but a DaemonSet's, and returns those
// patched (NS/NAME).
func (p Patcher) AddTolerations(ctx context.Context, pods []corev1.Pod) ([]string, error) {
	var patched []string
	for i := range pods {
		pod := &pods[i]
		if pod.Spec.NodeName == "" || IsDaemonSetPod(pod) {
			continue
		}
		patch, err := TolerationsPatch(pod.Spec.Tolerations)
		if err != nil {
			return patched, err
		}
		if patch == nil {
			continue
		}
		if p.Would != nil {
			p.Would(pod.Spec.NodeName, "add tolerations to pod "+pod.Namespace+"/"+pod.Name, string(patch))
			patched = append(patched, pod.Namespace+"/"+pod.Name)
			continue
		}
		if err := p.addTolerations(ctx, pod, patch); apierrors.IsNotFound(err) {
			// Gone since the plan listed it (a rollout replaced it): its
			// replacement is the plan's next run's business.
			p.Log.Info("pod gone before its tolerations were added", "pod", pod.Namespace+"/"+pod.Name)
			continue
		} else if err != nil {
			return patched, fmt.Errorf("pod %s/%s: add tolerations: %w", pod.Namespace, pod.Name, err)
		}
		patched = append(patched, pod.Namespace+"/"+pod.Name)
	}
	if len(patched) > 0 {
		p.Log.Info("tolerations added", "pods", len(patched))
	}
	return patched, nil
}

// addTolerations applies patch, TolerationsPatch's for pod. Through a
// transient API failure (cluster.Transient) it reads the pod again and
// adds what it still lacks: the failed patch may have applied, and one
// that appends is not the same made twice.
func (p Patcher) addTolerations(ctx context.Context, pod *corev1.Pod, patch []byte) error {
	pods := p.Client.CoreV1().Pods(pod.Namespace)
	again := false
	return cluster.OnTransient(ctx, cluster.TransientRetry, nil, func() error {
		if again {
			fresh, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if patch, err = TolerationsPatch(fresh.Spec.Tolerations); err != nil || patch == nil {
				return err
			}
		}
		again = true
		_, err := pods.Patch(ctx, pod.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
		return err
	})
}

// LabelsWanted are, per node, the labels its pods' nodeSelectors need
// and it lacks; two pods needing one label with two values are refused.
func LabelsWanted(nodes []corev1.Node, pods []corev1.Pod) (map[string]map[string]string, error) {
	byName := map[string]*corev1.Node{}
	for i := range nodes {
		byName[nodes[i].Name] = &nodes[i]
	}
	want := map[string]map[string]string{}
	for i := range pods {
		pod := &pods[i]
		node := byName[pod.Spec.NodeName]
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

// RestoreLabels adds want's labels to each node, in name order, and
// returns them as "NODE: KEY=VALUE".
func (p Patcher) RestoreLabels(ctx context.Context, want map[string]map[string]string) ([]string, error) {
	var restored []string
	for _, n := range slices.Sorted(maps.Keys(want)) {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(want[n])) {
			kv = append(kv, k+"="+want[n][k])
			restored = append(restored, n+": "+k+"="+want[n][k])
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": want[n]}})
		if err != nil {
			return restored, err
		}
		if p.Would != nil {
			p.Would(n, "restore labels "+strings.Join(kv, ", "), string(patch))
			continue
		}
		// A merge patch of labels: the same however often it applies.
		err = cluster.OnTransient(ctx, cluster.TransientRetry, nil, func() error {
			_, err := p.Client.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		})
		if err != nil {
			return restored, fmt.Errorf("node %s: restore labels: %w", n, err)
		}
		p.Event(ctx, n, "LabelsRestored", "kubelift: labels restored for pods' nodeSelectors: "+strings.Join(kv, ", "))
	}
	return restored, nil
}

// TolerationsPatch is the JSON patch that adds the not-ready and
// unreachable NoExecute tolerations (300 s, as DefaultTolerationSeconds
// gives) a pod lacks; nil when it lacks none. Patches only add: existing
// tolerations cannot be changed.
func TolerationsPatch(have []corev1.Toleration) ([]byte, error) {
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
		if !Tolerates(have, key) {
			ops = append(ops, op{Op: "add", Path: "/spec/tolerations/-", Value: corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists,
				Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &seconds}})
		}
	}
	if len(ops) == 0 {
		return nil, nil
	}
	return json.Marshal(ops)
}
