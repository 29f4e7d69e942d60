package record

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
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
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

// InFlight is what verify needs of a node whose kubelet moved from From:
// the containers that ran (by ID) and the pods (by UID) before the swap.
type InFlight struct {
	From       string                       `json:"from"`
	Containers map[string]InFlightContainer `json:"containers"`
	Pods       map[types.UID]InFlightPod    `json:"pods"`
}

// InFlightContainer is a container as the runtime listed it.
type InFlightContainer struct {
	What string `json:"what"`
	PID  int    `json:"pid,omitempty"`
}

// InFlightPod is a pod as the API listed it: its controller is Owner
// (KIND/NS/NAME), StaticUID a static pod's.
type InFlightPod struct {
	Name      string          `json:"name"`
	Phase     corev1.PodPhase `json:"phase"`
	StaticUID string          `json:"staticUID,omitempty"`
	Owner     string          `json:"owner,omitempty"`
}

// Encode is the annotation's value: gzip'd JSON in base64 (container IDs
// and names repeat little, but compress to about half).
func (f *InFlight) Encode() (string, error) {
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

// DecodeInFlight reads the annotation of node back. The Node is not
// trusted: what does not parse is refused naming node, annotation and
// what was wrong.
func DecodeInFlight(node, value string) (*InFlight, error) {
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
	var f InFlight
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

// MarkInFlight writes f on node before its kubelet is swapped.
func MarkInFlight(ctx context.Context, c kubernetes.Interface, node string, f *InFlight) error {
	value, err := f.Encode()
	if err != nil {
		return err
	}
	if err := annotate(ctx, c, node, map[string]any{AnnotationInFlight: value}); err != nil {
		return fmt.Errorf("node %s: record what runs before the swap: %w", node, err)
	}
	return nil
}

// ClearInFlight removes the record from node: the node is left at the
// target as it is (a later run does not verify it again).
func ClearInFlight(ctx context.Context, c kubernetes.Interface, node string) error {
	if err := annotate(ctx, c, node, map[string]any{AnnotationInFlight: nil}); err != nil {
		return fmt.Errorf("node %s: remove %s: %w", node, AnnotationInFlight, err)
	}
	return nil
}

// InFlightOn is the record a run left on n (nil when there is none).
func InFlightOn(n *corev1.Node) (*InFlight, error) {
	v, ok := n.Annotations[AnnotationInFlight]
	if !ok {
		return nil, nil
	}
	return DecodeInFlight(n.Name, v)
}

// Annotations a run leaves on a Node it upgraded: the cluster itself
// says what is done (as system-upgrade-controller's label does).
const (
	AnnotationUpgradedTo = "kubelift.dev/upgraded-to"
	AnnotationBundle     = "kubelift.dev/bundle"
)

// DonePatch marks a Node upgraded to version from bundle (its in-flight
// record removed): a merge patch, which a dry run shows.
func DonePatch(version, bundle string) ([]byte, error) {
	return AnnotationsPatch(map[string]any{AnnotationUpgradedTo: version, AnnotationBundle: bundle, AnnotationInFlight: nil})
}

// Unmark removes every annotation a run left on node: its kubelet was
// rolled back.
func Unmark(ctx context.Context, c kubernetes.Interface, node string) error {
	return annotate(ctx, c, node, map[string]any{AnnotationUpgradedTo: nil, AnnotationBundle: nil, AnnotationInFlight: nil})
}

// AnnotationsPatch is a merge patch setting (or, for nil, removing) a
// Node's annotations.
func AnnotationsPatch(a map[string]any) ([]byte, error) {
	return json.Marshal(map[string]any{"metadata": map[string]any{"annotations": a}})
}

// PatchNode applies a merge patch to node, again while the API server
// answers with a transient error (cluster.Transient): a merge patch of
// annotations leaves the same Node however often it applies.
func PatchNode(ctx context.Context, c kubernetes.Interface, node string, patch []byte) error {
	return cluster.OnTransient(ctx, cluster.TransientRetry, nil, func() error {
		_, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
}

// annotate sets node's annotations a (nil removes one).
func annotate(ctx context.Context, c kubernetes.Interface, node string, a map[string]any) error {
	patch, err := AnnotationsPatch(a)
	if err != nil {
		return err
	}
	return PatchNode(ctx, c, node, patch)
}
