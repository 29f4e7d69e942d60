package release

import (
	"context"
	"path"

	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/kubeadm"
)

// Where kubelift keeps its files on a node.
const (
	// DefaultStageDir holds VERSION/NAME, the binaries staged for an
	// upgrade; a swap is a rename from there.
	DefaultStageDir = "/var/lib/kubelift/staged"
	// DefaultBackupDir holds VERSION/NAME, the binaries an upgrade replaced.
	DefaultBackupDir = "/var/lib/kubelift/backup"
)

// StagePath is where a file of a version is staged below dir.
func StagePath(dir, version, file string) string { return path.Join(dir, version, file) }

// KubeProxy is kube-proxy's component: a unit on nodes that run it as
// one, moved right after the node's kubelet.
const KubeProxy = "kube-proxy"

// Roles of nodes, from node-role.kubernetes.io labels.
const (
	RoleControlPlane = "control-plane"
	RoleWorker       = "worker"
)

// nodeFiles are the binaries each node runs from /usr/local/bin and so
// gets staged: every node its kubelet, kube-proxy and kubectl, control-plane
// nodes the control plane too.
var nodeFiles = []string{"kubelet", "kube-proxy", "kubectl"}

// ControlPlaneFiles are the control plane's programs on a binary cluster.
var ControlPlaneFiles = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// Kinds of cluster: how the control plane is deployed, which says how it
// is upgraded (the control-plane driver) and what each node is staged.
const (
	// KindBinary: kube-apiserver, kube-controller-manager and
	// kube-scheduler are systemd units whose programs are swapped.
	KindBinary = "binary"
	// KindKubeadm: kubeadm built the cluster (the kubeadm-config
	// ConfigMap); the control plane and etcd are static pods that
	// `kubeadm upgrade` moves, kube-proxy and CoreDNS are its addons.
	KindKubeadm = "kubeadm"
)

// kubeadmFiles are what a node of a kubeadm cluster is staged: the
// target's kubeadm runs the upgrade, the kubelet is swapped as on any
// cluster (the control plane and kube-proxy come as images).
var kubeadmFiles = []string{"kubeadm", "kubelet", "kubectl"}

// FilesFor lists the binaries a node of role needs in a binary-deployed
// cluster.
func FilesFor(role string) []string { return FilesForKind(KindBinary, role) }

// FilesForKind lists the binaries a node of role needs in a cluster of
// kind.
func FilesForKind(kind, role string) []string {
	if kind == KindKubeadm {
		return append([]string{}, kubeadmFiles...)
	}
	if role == RoleControlPlane {
		return append(append([]string{}, ControlPlaneFiles...), nodeFiles...)
	}
	return append([]string{}, nodeFiles...)
}

// HopFilesForKind lists the binaries a node of role needs of a hop, a
// release the control plane passes through (bundle create --from): a
// control-plane node's programs, or kubeadm on a kubeadm cluster; other
// nodes need none (their kubelets go straight to the target).
func HopFilesForKind(kind, role string) []string {
	switch {
	case role != RoleControlPlane:
		return nil
	case kind == KindKubeadm:
		return []string{"kubeadm"}
	}
	return append([]string{}, ControlPlaneFiles...)
}

// ClusterKind says how the cluster's control plane is deployed:
// KindKubeadm when kube-system holds kubeadm's kubeadm-config ConfigMap
// (and it parses), else KindBinary.
func ClusterKind(ctx context.Context, c kubernetes.Interface) (string, error) {
	cfg, err := kubeadm.Read(ctx, c)
	if err != nil {
		return "", err
	}
	if cfg != nil {
		return KindKubeadm, nil
	}
	return KindBinary, nil
}

// ArchOr is a node's architecture, amd64 when it reports none.
func ArchOr(a string) string {
	if a == "" {
		return "amd64"
	}
	return a
}
