// Package coredns moves a binary-deployed cluster's CoreDNS to the
// release's: the Deployment's image to the one import pushed, its Corefile
// migrated by the library kubeadm uses (github.com/coredns/corefile-migration),
// rolled so that no lookup is lost (drain.go) and waited for, with what
// it replaced kept in a ConfigMap (Backup) so that Undo puts both back.
// kubeadm clusters are left to kubeadm, whose `upgrade apply` moves
// CoreDNS itself. The runbook says when (its "coredns" step and undo);
// this room says how.
package coredns

import (
	"context"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/coredns/corefile-migration/migration"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/kubeadm"
)

const (
	// Namespace and Name are the Deployment and ConfigMap kubeadm,
	// kubeasz and most binary installers give CoreDNS.
	Namespace = "kube-system"
	Name      = "coredns"
	// BackupName is the ConfigMap (in Namespace) that keeps what a move
	// replaced.
	BackupName = "kubelift-coredns-backup"
	// backupKey is the ConfigMap key the old Corefile is kept under while
	// the old pods read it (kubeadm's name for it).
	backupKey = "Corefile-backup"
)

// Found is the CoreDNS a cluster runs, as its Deployment says: the
// container named coredns (or the only one), its image and the version
// its tag names, and the ConfigMap key it reads its Corefile from.
type Found struct {
	Deployment *appsv1.Deployment
	Container  int
	Image      string
	// Version is the image tag's, without its "v" ("1.11.1").
	Version string
	// ConfigMap and Key hold the Corefile it runs (Corefile); File is
	// the name it has in the volume ("Corefile"), Keys every key of the
	// ConfigMap.
	ConfigMap, Key, File string
	Corefile             string
	Keys                 []string
	// Volume is the pod volume the Corefile is mounted from.
	Volume int
}

// Find reads the cluster's CoreDNS: nil when there is no Deployment
// kube-system/coredns. What does not parse is refused, naming the
// Deployment, the field and the value.
func Find(ctx context.Context, c kubernetes.Interface) (*Found, error) {
	d, err := c.AppsV1().Deployments(Namespace).Get(ctx, Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("deployment %s/%s: %w", Namespace, Name, err)
	}
	f, err := parse(d)
	if err != nil {
		return nil, fmt.Errorf("deployment %s/%s: %w", Namespace, Name, err)
	}
	cm, err := c.CoreV1().ConfigMaps(Namespace).Get(ctx, f.ConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("deployment %s/%s: its Corefile's configmap: %w", Namespace, Name, err)
	}
	cf, ok := cm.Data[f.Key]
	if !ok {
		return nil, fmt.Errorf("configmap %s/%s: no key %q (the Corefile deployment %s mounts)", Namespace, f.ConfigMap, f.Key, Name)
	}
	f.Corefile = cf
	f.Keys = slices.Sorted(maps.Keys(cm.Data))
	return f, nil
}

// tag is an image tag that names a CoreDNS release ("v1.11.1", "1.11.1").
var tag = regexp.MustCompile(`^v?([0-9]+\.[0-9]+\.[0-9]+)$`)

// VersionOf is the CoreDNS version an image's tag names ("1.11.1"), or
// an error naming the image.
func VersionOf(image string) (string, error) {
	ref, _, _ := strings.Cut(image, "@")
	t := kubeadm.ImageTag(ref)
	if t == "" {
		return "", fmt.Errorf("image %q has no tag that names a CoreDNS version", image)
	}
	m := tag.FindStringSubmatch(t)
	if m == nil {
		return "", fmt.Errorf("image %q: tag %q does not name a CoreDNS version (vX.Y.Z)", image, t)
	}
	return m[1], nil
}

// parse finds the container, its version and where its Corefile comes
// from: the file -conf names (default /etc/coredns/Corefile), in a
// configMap volume mounted at that file's directory.
func parse(d *appsv1.Deployment) (*Found, error) {
	spec := &d.Spec.Template.Spec
	ci := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == "coredns" })
	if ci < 0 && len(spec.Containers) == 1 {
		ci = 0
	}
	if ci < 0 {
		return nil, fmt.Errorf("spec.template.spec.containers: no container named coredns among %d", len(spec.Containers))
	}
	ctr := &spec.Containers[ci]
	v, err := VersionOf(ctr.Image)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", ctr.Name, err)
	}
	conf := "/etc/coredns/Corefile"
	args := append(slices.Clone(ctr.Command), ctr.Args...)
	for i, a := range args {
		switch {
		case (a == "-conf" || a == "--conf") && i+1 < len(args):
			conf = args[i+1]
		case strings.HasPrefix(a, "-conf=") || strings.HasPrefix(a, "--conf="):
			_, conf, _ = strings.Cut(a, "=")
		}
	}
	dir, file := path.Split(conf)
	mi := slices.IndexFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool {
		return strings.TrimSuffix(m.MountPath, "/") == strings.TrimSuffix(dir, "/")
	})
	if mi < 0 {
		return nil, fmt.Errorf("container %s: no volume mounted at %s, where -conf %s is", ctr.Name, dir, conf)
	}
	vi := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == ctr.VolumeMounts[mi].Name })
	if vi < 0 {
		return nil, fmt.Errorf("container %s mounts volume %s at %s: spec.template.spec.volumes has no such volume", ctr.Name, ctr.VolumeMounts[mi].Name, dir)
	}
	src := spec.Volumes[vi].ConfigMap
	if src == nil {
		return nil, fmt.Errorf("volume %s (mounted at %s): not a configMap volume", ctr.VolumeMounts[mi].Name, dir)
	}
	key := file
	if len(src.Items) > 0 {
		i := slices.IndexFunc(src.Items, func(it corev1.KeyToPath) bool { return it.Path == file })
		if i < 0 {
			return nil, fmt.Errorf("volume %s: none of its items is the file %s, where -conf %s is", spec.Volumes[vi].Name, file, conf)
		}
		key = src.Items[i].Key
	}
	return &Found{Deployment: d, Container: ci, Image: ctr.Image, Version: v, ConfigMap: src.Name, Key: key, File: file, Volume: vi}, nil
}

// Move is what moving a cluster's CoreDNS to a release's changes.
type Move struct {
	From, To string
	// Image is the one the Deployment gets.
	Image string
	// Corefile is the migrated Corefile; equal to the one that runs when
	// the move leaves it as it is.
	Corefile string
	// Notices are the migration's, in words ("plugin X removed ...").
	Notices []string
}

// CorefileChanges: the move writes a migrated Corefile.
func (m *Move) CorefileChanges(f *Found) bool { return m.Corefile != f.Corefile }

// Plan is the move of f to image: nil when f runs image's version
// already. It is refused when image's version is older than f's, when
// the migration library knows either version not, or when the Corefile
// uses a plugin or option the new version no longer supports.
func Plan(f *Found, image string) (*Move, error) {
	to, err := VersionOf(image)
	if err != nil {
		return nil, err
	}
	if to == f.Version {
		return nil, nil
	}
	if !newer(to, f.Version) {
		return nil, fmt.Errorf("CoreDNS %s runs; the release's is %s, older: kubelift does not move CoreDNS back", f.Version, to)
	}
	valid := migration.ValidVersions()
	for _, v := range []string{f.Version, to} {
		if !slices.Contains(valid, v) {
			return nil, fmt.Errorf("CoreDNS %s: the Corefile migration library knows no such version (it knows %s to %s)", v, valid[0], valid[len(valid)-1])
		}
	}
	m := &Move{From: f.Version, To: to, Image: image, Corefile: f.Corefile}
	unsupported, err := migration.Unsupported(f.Version, to, f.Corefile)
	if err != nil {
		return nil, fmt.Errorf("configmap %s/%s key %s: %w", Namespace, f.ConfigMap, f.Key, err)
	}
	if len(unsupported) > 0 {
		var s []string
		for _, n := range unsupported {
			s = append(s, strings.TrimSpace(n.ToString()))
		}
		return nil, fmt.Errorf("configmap %s/%s key %s: CoreDNS %s does not support what the Corefile uses: %s", Namespace, f.ConfigMap, f.Key, to, strings.Join(s, "; "))
	}
	deprecated, err := migration.Deprecated(f.Version, to, f.Corefile)
	if err != nil {
		return nil, fmt.Errorf("configmap %s/%s key %s: %w", Namespace, f.ConfigMap, f.Key, err)
	}
	migrate := false
	for _, n := range deprecated {
		m.Notices = append(m.Notices, strings.TrimSpace(n.ToString()))
		// As kubeadm: what a version removed, ignores or made default is
		// migrated; what it only deprecated is left to the user (the
		// notice says it). The library rewrites the whole Corefile, so
		// one that needs nothing is not handed to it.
		migrate = migrate || n.Severity == migration.SevRemoved || n.Severity == migration.SevIgnored || n.Severity == migration.SevNewDefault
	}
	if !migrate {
		return m, nil
	}
	if m.Corefile, err = migration.Migrate(f.Version, to, f.Corefile, false); err != nil {
		return nil, fmt.Errorf("configmap %s/%s key %s: migrate the Corefile from %s to %s: %w", Namespace, f.ConfigMap, f.Key, f.Version, to, err)
	}
	return m, nil
}

// newer: version a is after b (both X.Y.Z, as VersionOf returns them).
func newer(a, b string) bool {
	var x, y [3]int
	fmt.Sscanf(a, "%d.%d.%d", &x[0], &x[1], &x[2])
	fmt.Sscanf(b, "%d.%d.%d", &y[0], &y[1], &y[2])
	return slices.Compare(x[:], y[:]) > 0
}
