// Package kubeletcompat knows how each kubelet version hashes container
// specs (the io.kubernetes.container.hash annotation it compares to decide
// whether a running container's definition changed), predicts which
// containers a kubelet upgrade would restart, and manages the hash-skip
// cache that lets an upgraded kubelet keep them running.
package kubeletcompat

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/dump"

	"github.com/kubelift/kubelift/internal/catalog"
)

// Annotations the kubelet writes on every container (CRI annotations; on
// dockershim nodes, Docker labels prefixed with "annotation.").
const (
	HashAnnotation                 = "io.kubernetes.container.hash"
	HashWithoutResourcesAnnotation = "io.kubernetes.container.hashWithoutResources"
	DockerLabelPrefix              = "annotation."
)

// ErrUnsupportedEra is returned for kubelets older than 1.16, which hashed
// the go-spew dump of the whole struct: reproducing that needs that
// release's exact k8s.io/api types.
var ErrUnsupportedEra = errors.New("kubelet hash era not supported (kubelets before 1.16 hashed the go-spew dump of the struct)")

// Hasher computes container hashes as a given kubelet version does. In the
// JSON eras the hash covers the Container fields of Version's own
// k8s.io/api (containerfields.json); a Version of 1.31 on with an older Era
// is kubelift's hash-skip kubelet computing the old era's hash with its own
// type (the dual-era rule).
type Hasher struct {
	Version catalog.Version
	Era     string
}

// NewHasher returns the hasher of kubelet version v ("v1.30.14"), with the
// era taken from the catalog's era table.
func NewHasher(c *catalog.Catalog, v string) (*Hasher, error) {
	pv, err := catalog.ParseVersion(v)
	if err != nil {
		return nil, err
	}
	era, err := c.HashEraFor(pv)
	if err != nil {
		return nil, err
	}
	if era == catalog.EraSpew {
		return nil, fmt.Errorf("kubelet %s: %w", pv, ErrUnsupportedEra)
	}
	return &Hasher{Version: pv, Era: era}, nil
}

// Hash is what HashContainer (pkg/kubelet/container/helpers.go) of this
// kubelet returns for c.
func (h *Hasher) Hash(c *corev1.Container) (uint64, error) {
	switch h.Era {
	case catalog.EraJSON, catalog.EraJSONWithoutResources:
		return h.hashContainer(c)
	case catalog.EraNameImage:
		return hashJSON(map[string]string{"name": c.Name, "image": c.Image})
	}
	return 0, fmt.Errorf("kubelet %s: era %q: %w", h.Version, h.Era, ErrUnsupportedEra)
}

// HashWithoutResources is HashContainerWithoutResources: the hash with
// Resources zeroed, written only by 1.27 to 1.30 kubelets with the
// InPlacePodVerticalScaling gate on. ok is false for other eras.
func (h *Hasher) HashWithoutResources(c *corev1.Container) (hash uint64, ok bool, err error) {
	if h.Era != catalog.EraJSONWithoutResources {
		return 0, false, nil
	}
	cp := c.DeepCopy()
	cp.Resources = corev1.ResourceRequirements{}
	hash, err = h.hashContainer(cp)
	return hash, err == nil, err
}

// Label returns a hash as the kubelet writes it: lowercase hex, no prefix.
func Label(hash uint64) string { return strconv.FormatUint(hash, 16) }

// ParseLabel reads an annotation value as the kubelet does: a missing or
// malformed one is 0, which never matches a computed hash.
func ParseLabel(s string) uint64 {
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0
	}
	return v
}

// hashContainer is hashJSON(c) as this kubelet computes it: json.Marshal of
// its own k8s.io/api Container type, which dropped the fields its release
// did not know when it decoded the pod. The linked type's JSON, pruned to
// that release's field tree, is those bytes.
func (h *Hasher) hashContainer(c *corev1.Container) (uint64, error) {
	tree, err := fieldTree(h.Version)
	if err != nil {
		return 0, err
	}
	b, err := json.Marshal(c)
	if err != nil {
		return 0, err
	}
	if b, err = prune(b, tree); err != nil {
		return 0, fmt.Errorf("container %s: %w", c.Name, err)
	}
	return hashBytes(b), nil
}

// hashJSON is hashutil.DeepHashObject(fnv32a, json.Marshal(obj)), as the
// kubelet does it from 1.16 on.
func hashJSON(obj any) (uint64, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return 0, err
	}
	return hashBytes(b), nil
}

func hashBytes(b []byte) uint64 {
	h := fnv.New32a()
	fmt.Fprintf(h, "%v", dump.ForHash(b))
	return uint64(h.Sum32())
}
