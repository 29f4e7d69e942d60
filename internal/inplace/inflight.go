package inplace

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"regexp"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
)

// AnnotationInFlight marks a Node whose kubelet a run swapped and has not
// yet verified and marked done: what verify compares (the containers and
// pods that ran before the swap), written before the swap and removed by
// markDone. The cluster itself says what was left, so a run that resumes
// one that died in the node's settle (the admin machine lost) finishes
// the node's steps (Ready, verify, post-hook, kube-proxy, uncordon) from
// it instead of taking the node for done.
const AnnotationInFlight = "kubelift.dev/in-flight"

// maxInFlight bounds the annotation read back (a Node's annotations are
// at most 256 KiB together).
const maxInFlight = 256 << 10

// inFlight is what verify needs of a node whose kubelet moved from From.
type inFlight struct {
	From       string                    `json:"from"`
	Containers map[string]inFlightCtr    `json:"containers"`
	Pods       map[types.UID]inFlightPod `json:"pods"`
}

type inFlightCtr struct {
	What string `json:"what"`
	PID  int    `json:"pid,omitempty"`
}

type inFlightPod struct {
	Name      string          `json:"name"`
	Phase     corev1.PodPhase `json:"phase"`
	StaticUID string          `json:"staticUID,omitempty"`
	Owner     string          `json:"owner,omitempty"`
}

func newInFlight(from string, before map[string]nodeops.Container, pods map[types.UID]podInfo) *inFlight {
	f := &inFlight{From: from, Containers: make(map[string]inFlightCtr, len(before)), Pods: make(map[types.UID]inFlightPod, len(pods))}
	for id, c := range before {
		f.Containers[id] = inFlightCtr{What: c.What, PID: c.PID}
	}
	for uid, p := range pods {
		f.Pods[uid] = inFlightPod{Name: p.name, Phase: p.phase, StaticUID: p.staticUID, Owner: p.owner}
	}
	return f
}

// before and pods are verify's inputs again.
func (f *inFlight) before() map[string]nodeops.Container {
	out := make(map[string]nodeops.Container, len(f.Containers))
	for id, c := range f.Containers {
		out[id] = nodeops.Container{What: c.What, PID: c.PID}
	}
	return out
}

func (f *inFlight) pods() map[types.UID]podInfo {
	out := make(map[types.UID]podInfo, len(f.Pods))
	for uid, p := range f.Pods {
		out[uid] = podInfo{name: p.Name, phase: p.Phase, staticUID: p.StaticUID, owner: p.Owner}
	}
	return out
}

// encode is the annotation's value: gzip'd JSON in base64 (container IDs
// and names repeat little, but compress to about half).
func (f *inFlight) encode() (string, error) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if err := json.NewEncoder(zw).Encode(f); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b.Bytes()), nil
}

var (
	containerIDRE = regexp.MustCompile(`^[0-9a-f]{1,128}$`)
	uidRE         = regexp.MustCompile(`^[0-9a-zA-Z-]{1,64}$`)
)

// decodeInFlight reads the annotation of node back. The Node is not
// trusted: what does not parse is refused naming node, annotation and
// what was wrong.
func decodeInFlight(node, value string) (*inFlight, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("node %s: annotation %s: %s", node, AnnotationInFlight, fmt.Sprintf(format, a...))
	}
	raw, err := base64.StdEncoding.DecodeString(value)
	if err != nil {
		return nil, bad("not base64: %v", err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, bad("not gzip: %v", err)
	}
	data, err := io.ReadAll(io.LimitReader(zr, maxInFlight+1))
	if err != nil {
		return nil, bad("not gzip: %v", err)
	}
	if len(data) > maxInFlight {
		return nil, bad("more than %d bytes", maxInFlight)
	}
	var f inFlight
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, bad("%v", err)
	}
	if v, err := catalog.ParseReported(f.From); err != nil || v.String() != f.From {
		return nil, bad("from %q is not a version", f.From)
	}
	for id, c := range f.Containers {
		if !containerIDRE.MatchString(id) || c.PID < 0 || len(c.What) > 512 {
			return nil, bad("container %q (%q, pid %d) does not parse", id, c.What, c.PID)
		}
	}
	for uid, p := range f.Pods {
		if !uidRE.MatchString(string(uid)) || len(p.Name) > 512 || len(p.Owner) > 512 || (p.StaticUID != "" && !uidRE.MatchString(p.StaticUID)) {
			return nil, bad("pod %q (%q) does not parse", uid, p.Name)
		}
	}
	return &f, nil
}

// markInFlight writes the annotation on node before its kubelet is
// swapped.
func (r *applyRun) markInFlight(ctx context.Context, node string, f *inFlight) error {
	value, err := f.encode()
	if err != nil {
		return err
	}
	patch, err := annotationsPatch(map[string]any{AnnotationInFlight: value})
	if err != nil {
		return err
	}
	if r.dry {
		r.would(node, fmt.Sprintf("annotate the node %s: the %d containers and %d pods verify compares after the swap", AnnotationInFlight, len(f.Containers), len(f.Pods)), "")
		return nil
	}
	if _, err := r.client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: record what runs before the swap: %w", node, err)
	}
	return nil
}

// clearInFlight removes the record from node: the node is left at the
// target as it is (a later run does not verify it again).
func (r *applyRun) clearInFlight(ctx context.Context, node string) error {
	patch, err := annotationsPatch(map[string]any{AnnotationInFlight: nil})
	if err != nil {
		return err
	}
	if _, err := r.client.CoreV1().Nodes().Patch(context.WithoutCancel(ctx), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: remove %s: %w", node, AnnotationInFlight, err)
	}
	return nil
}

// inFlightOf is the record a run left on node, as the plan read the Node
// (nil when there is none).
func (r *applyRun) inFlightOf(node string) (*inFlight, error) {
	n := r.view.Node(node)
	if n == nil {
		return nil, nil
	}
	v, ok := n.Annotations[AnnotationInFlight]
	if !ok {
		return nil, nil
	}
	return decodeInFlight(node, v)
}
