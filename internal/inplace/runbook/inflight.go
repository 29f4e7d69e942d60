package runbook

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/inplace/record"
)

// markInFlight writes the annotation on node before its kubelet is
// swapped.
func (r *upgradeRun) markInFlight(ctx context.Context, node string, f *record.InFlight) error {
	value, err := f.Encode()
	if err != nil {
		return err
	}
	patch, err := annotationsPatch(map[string]any{record.AnnotationInFlight: value})
	if err != nil {
		return err
	}
	if r.dry {
		r.would(node, fmt.Sprintf("annotate the node %s: the %d containers and %d pods verify compares after the swap", record.AnnotationInFlight, len(f.Containers), len(f.Pods)), "")
		return nil
	}
	if _, err := r.client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: record what runs before the swap: %w", node, err)
	}
	return nil
}

// clearInFlight removes the record from node: the node is left at the
// target as it is (a later run does not verify it again).
func (r *upgradeRun) clearInFlight(ctx context.Context, node string) error {
	patch, err := annotationsPatch(map[string]any{record.AnnotationInFlight: nil})
	if err != nil {
		return err
	}
	if _, err := r.client.CoreV1().Nodes().Patch(context.WithoutCancel(ctx), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: remove %s: %w", node, record.AnnotationInFlight, err)
	}
	return nil
}

// inFlightOf is the record a run left on node, as the plan read the Node
// (nil when there is none).
func (r *upgradeRun) inFlightOf(node string) (*record.InFlight, error) {
	n := r.view.Node(node)
	if n == nil {
		return nil, nil
	}
	v, ok := n.Annotations[record.AnnotationInFlight]
	if !ok {
		return nil, nil
	}
	return record.DecodeInFlight(node, v)
}
