package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/catalog"
)

// Namespace holds kubelift's records.
const Namespace = "kube-system"

// Labels on every available-version record.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelKind      = "kubelift.dev/record"
	LabelVersion   = "kubelift.dev/kubernetes-version"
	LabelBundle    = "kubelift.dev/bundle-digest"
	kindAvailable  = "available-version"
)

// Available records that a version's images are in the private registry
// and its binaries are known: what the engine may upgrade to.
type Available struct {
	KubernetesVersion string `json:"kubernetesVersion"`
	// BundleDigest is the sha256 of the signed bundle.json.
	BundleDigest string         `json:"bundleDigest"`
	Registry     string         `json:"registry"`
	Images       []ImageRecord  `json:"images"`
	Files        []BinaryRecord `json:"files"`
	// Manifest and Signature are the signed bundle.json and its signature,
	// so the record can be checked against the operator's key again.
	Manifest  []byte `json:"-"`
	Signature []byte `json:"-"`
}

// ImageRecord is an image as pushed: target reference and digest.
type ImageRecord struct {
	Ref    string `json:"ref"`
	Target string `json:"target"`
	Digest string `json:"digest"`
}

// BinaryRecord is a binary of the version.
type BinaryRecord struct {
	Name   string `json:"name"`
	Arch   string `json:"arch,omitempty"`
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	// Artifact is the OCI artifact holding the file in the private
	// registry (REPOSITORY@sha256:MANIFEST; its one layer is the file, by
	// SHA256); empty when the binaries were not pushed.
	Artifact string `json:"artifact,omitempty"`
}

// ErrRecordConflict means a record of that name exists with other content.
var ErrRecordConflict = errors.New("an immutable record with this name holds different content")

// RecordName names the ConfigMap of a version and bundle: one per pair.
func RecordName(version, bundleDigest string) string {
	d := strings.TrimPrefix(bundleDigest, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return "kubelift-available-" + strings.ToLower(version) + "-" + d
}

// RecordAvailable writes a as an immutable ConfigMap. Writing the same
// record again succeeds without change; a different one under the same name
// is refused.
func RecordAvailable(ctx context.Context, c kubernetes.Interface, a *Available) (*corev1.ConfigMap, error) {
	cm, err := a.configMap()
	if err != nil {
		return nil, err
	}
	// Made again through a transient failure (the create may have
	// applied: the next one then finds the record, and compares it).
	var created *corev1.ConfigMap
	err = OnTransient(ctx, TransientRetry, nil, func() (err error) {
		created, err = c.CoreV1().ConfigMaps(Namespace).Create(ctx, cm, metav1.CreateOptions{})
		return err
	})
	if err == nil {
		return created, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("configmap %s/%s: %w", Namespace, cm.Name, err)
	}
	var existing *corev1.ConfigMap
	err = OnTransient(ctx, TransientRetry, nil, func() (err error) {
		existing, err = c.CoreV1().ConfigMaps(Namespace).Get(ctx, cm.Name, metav1.GetOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("configmap %s/%s: %w", Namespace, cm.Name, err)
	}
	if !maps.Equal(existing.Data, cm.Data) || !mapsEqualBytes(existing.BinaryData, cm.BinaryData) {
		return nil, fmt.Errorf("configmap %s/%s: %w", Namespace, cm.Name, ErrRecordConflict)
	}
	return existing, nil
}

// Recorder writes records through a clientset.
type Recorder struct{ Client kubernetes.Interface }

// RecordAvailable writes a and returns the ConfigMap's name.
func (r Recorder) RecordAvailable(ctx context.Context, a *Available) (string, error) {
	cm, err := RecordAvailable(ctx, r.Client, a)
	if err != nil {
		return "", err
	}
	return cm.Name, nil
}

// ListAvailable returns every available-version record, oldest version
// first.
func ListAvailable(ctx context.Context, c kubernetes.Interface) ([]*Available, error) {
	list, err := c.CoreV1().ConfigMaps(Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelKind + "=" + kindAvailable})
	if err != nil {
		return nil, fmt.Errorf("list configmaps in %s: %w", Namespace, err)
	}
	var out []*Available
	for i := range list.Items {
		a, err := parseAvailable(&list.Items[i])
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	sort.SliceStable(out, func(i, j int) bool { return versionLess(out[i].KubernetesVersion, out[j].KubernetesVersion) })
	return out, nil
}

// versionLess orders release versions numerically (v1.31.4 before
// v1.31.10); a version that does not parse sorts after those that do.
func versionLess(a, b string) bool {
	va, erra := catalog.ParseVersion(a)
	vb, errb := catalog.ParseVersion(b)
	switch {
	case erra != nil && errb != nil:
		return a < b
	case erra != nil || errb != nil:
		return errb != nil
	}
	return va.Compare(vb) < 0
}

func (a *Available) configMap() (*corev1.ConfigMap, error) {
	rec, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return nil, err
	}
	immutable := true
	name := RecordName(a.KubernetesVersion, a.BundleDigest)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: map[string]string{
			LabelManagedBy: "kubelift",
			LabelKind:      kindAvailable,
			LabelVersion:   a.KubernetesVersion,
			LabelBundle:    name[strings.LastIndex(name, "-")+1:],
		}},
		Immutable:  &immutable,
		Data:       map[string]string{"record.json": string(rec), "bundle.json": string(a.Manifest)},
		BinaryData: map[string][]byte{},
	}
	if a.Signature != nil {
		cm.BinaryData["bundle.json.sig"] = a.Signature
	}
	return cm, nil
}

func parseAvailable(cm *corev1.ConfigMap) (*Available, error) {
	var a Available
	if err := json.Unmarshal([]byte(cm.Data["record.json"]), &a); err != nil {
		return nil, fmt.Errorf("configmap %s/%s: record.json: %w", cm.Namespace, cm.Name, err)
	}
	a.Manifest = []byte(cm.Data["bundle.json"])
	a.Signature = cm.BinaryData["bundle.json.sig"]
	return &a, nil
}

func mapsEqualBytes(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if string(b[k]) != string(v) {
			return false
		}
	}
	return true
}
