package kubeadm

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
)

// StaticPods are the static pods kubeadm writes on a control-plane node,
// in the order `kubeadm upgrade` moves them.
var StaticPods = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// Manifest is one static pod manifest read on a node: where it is, the
// component (its file's name) and the image of that component's
// container.
type Manifest struct {
	Path      string
	Component string
	Image     string
}

// Tag is the manifest's image tag ("" when it has none).
func (m Manifest) Tag() string { return ImageTag(m.Image) }

// ImageTag is the tag of an image reference ("" when it has none: a colon
// before the last slash is a registry's port).
func ImageTag(image string) string {
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		return ""
	}
	return image[i+1:]
}

// Version is the Kubernetes version a control-plane component's manifest
// runs (its image's tag); refused when the tag is not one.
func (m Manifest) Version() (catalog.Version, error) {
	v, err := catalog.ParseReported(m.Tag())
	if err != nil {
		return catalog.Version{}, fmt.Errorf("%s: image %q: %w", m.Path, m.Image, err)
	}
	return v, nil
}

// ParseManifest reads the static pod manifest at p (its content data):
// a Pod whose container named after the file (kube-apiserver.yaml runs
// container kube-apiserver) gives the image. What does not parse is
// refused, naming the file.
func ParseManifest(p string, data []byte) (Manifest, error) {
	comp := strings.TrimSuffix(path.Base(p), ".yaml")
	var pod corev1.Pod
	if err := yaml.Unmarshal(data, &pod); err != nil {
		return Manifest{}, fmt.Errorf("static pod manifest %s: %w", p, err)
	}
	if pod.Kind != "Pod" {
		return Manifest{}, fmt.Errorf("static pod manifest %s: kind %q, not a Pod", p, pod.Kind)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == comp {
			if c.Image == "" || strings.ContainsAny(c.Image, " \n\t\x00") {
				return Manifest{}, fmt.Errorf("static pod manifest %s: container %s image %q: not an image reference", p, comp, c.Image)
			}
			return Manifest{Path: p, Component: comp, Image: c.Image}, nil
		}
	}
	return Manifest{}, fmt.Errorf("static pod manifest %s: no container named %s", p, comp)
}

// backupDir matches the directories kubeadm keeps an upgrade's old
// manifests in (constants.CreateTimestampDirForKubeadm).
var backupDir = regexp.MustCompile(`^` + regexp.QuoteMeta(BackupManifestsPrefix) + `[0-9]{4}(-[0-9]{2}){5}$`)

// IsBackupDir says whether dir is one of kubeadm's manifest backups under
// TmpDir.
func IsBackupDir(dir string) bool {
	return path.Dir(dir) == TmpDir && backupDir.MatchString(path.Base(dir))
}

// EtcdMinor is the major.minor of an etcd image tag ("3.5.15-0" gives
// "3.5"); refused when the tag is not an etcd version.
func EtcdMinor(tag string) (string, error) {
	parts := strings.SplitN(strings.TrimPrefix(tag, "v"), ".", 3)
	if len(parts) < 3 {
		return "", fmt.Errorf("etcd image tag %q: not MAJOR.MINOR.PATCH", tag)
	}
	for _, p := range parts[:2] {
		if _, err := strconv.ParseUint(p, 10, 16); err != nil {
			return "", fmt.Errorf("etcd image tag %q: not MAJOR.MINOR.PATCH", tag)
		}
	}
	return parts[0] + "." + parts[1], nil
}

// SetVersion sets the ClusterConfiguration's kubernetesVersion in the
// kubeadm-config ConfigMap to v when it says from (a rollback puts back
// what `kubeadm upgrade apply` wrote); it says whether it changed it. A
// document that does not parse is refused. It reads and writes again
// through a conflict or a transient API failure (cluster.Transient).
func SetVersion(ctx context.Context, c kubernetes.Interface, from, v string) (bool, error) {
	changed, updated := false, false
	err := cluster.OnTransient(ctx, cluster.TransientRetry, apierrors.IsConflict, func() error {
		changed = false
		cm, err := c.CoreV1().ConfigMaps(ConfigNamespace).Get(ctx, ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		doc := map[string]any{}
		if err := yaml.Unmarshal([]byte(cm.Data[ClusterConfigKey]), &doc); err != nil {
			return fmt.Errorf("configmap %s/%s %s: %w", ConfigNamespace, ConfigMapName, ClusterConfigKey, err)
		}
		if doc["kubernetesVersion"] != from {
			// An update that failed transiently may have applied.
			changed = updated && doc["kubernetesVersion"] == v
			return nil
		}
		doc["kubernetesVersion"] = v
		out, err := yaml.Marshal(doc)
		if err != nil {
			return err
		}
		cm.Data[ClusterConfigKey] = string(out)
		updated = true
		if _, err := c.CoreV1().ConfigMaps(ConfigNamespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			return err
		}
		changed = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("set kubernetesVersion %s in configmap %s/%s: %w", v, ConfigNamespace, ConfigMapName, err)
	}
	return changed, nil
}

// KubeProxyName is kubeadm's kube-proxy DaemonSet, in ConfigNamespace.
const KubeProxyName = "kube-proxy"

// SetProxyTag sets the tag of the kube-proxy DaemonSet's kube-proxy
// container to tag when it is from (`kubeadm upgrade apply` sets it to the
// version); it says whether it changed it.
func SetProxyTag(ctx context.Context, c kubernetes.Interface, from, tag string) (bool, error) {
	var ds *appsv1.DaemonSet
	err := cluster.OnTransient(ctx, cluster.TransientRetry, nil, func() (err error) {
		ds, err = c.AppsV1().DaemonSets(ConfigNamespace).Get(ctx, KubeProxyName, metav1.GetOptions{})
		return err
	})
	if err != nil {
		return false, fmt.Errorf("daemonset %s/kube-proxy: %w", ConfigNamespace, err)
	}
	for _, ct := range ds.Spec.Template.Spec.Containers {
		if ct.Name != "kube-proxy" {
			continue
		}
		if ImageTag(ct.Image) != from {
			return false, nil
		}
		image := strings.TrimSuffix(ct.Image, from) + tag
		patch, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"containers": []map[string]string{{"name": "kube-proxy", "image": image}}}}}})
		if err != nil {
			return false, err
		}
		// A patch of the image: the same however often it applies.
		err = cluster.OnTransient(ctx, cluster.TransientRetry, nil, func() error {
			_, err := c.AppsV1().DaemonSets(ConfigNamespace).Patch(ctx, KubeProxyName, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
			return err
		})
		if err != nil {
			return false, fmt.Errorf("daemonset %s/kube-proxy: set image %s: %w", ConfigNamespace, image, err)
		}
		return true, nil
	}
	return false, fmt.Errorf("daemonset %s/kube-proxy has no container kube-proxy", ConfigNamespace)
}
