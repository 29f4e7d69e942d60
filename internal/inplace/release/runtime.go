package release

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// The node-stack files a bundle carries for the nodes' container runtime
// (bundle create --node-stack), named as the catalog's parts:
// containerd's release archive and runc's binary.
const (
	FileContainerd = catalog.StackContainerd
	FileRunc       = catalog.StackRunc
	// FileEtcd is etcd's release archive, for a binary cluster's members.
	FileEtcd = catalog.StackEtcd
)

// RuntimeMove is the move of a node's containerd that the bundle makes:
// from the version the node runs to the bundle's, with the files staged
// for it.
type RuntimeMove struct {
	From, To catalog.Version
	// Files are staged with the release's own: containerd, and runc where
	// the bundle carries it.
	Files []string
	// ArchiveSHA256 and RuncSHA256 are the signed manifest's sums of
	// containerd's archive and runc; RuncSHA256 is empty when the bundle
	// carries no runc (the node's stays).
	ArchiveSHA256, RuncSHA256 string
	// Major: the major version changes, and with it the config's schema
	// (1.x's version 2, 2.x's version 3), which containerd's own `config
	// migrate` rewrites.
	Major bool
}

// RuntimeMoveFor is what the bundle does to the runtime of a node running
// rt (its Node's status.nodeInfo.containerRuntimeVersion, parsed), for
// arch: a move when the bundle carries a containerd for arch newer than
// the node's; nil when it carries none, or the node runs another runtime,
// or containerd at or past the bundle's. A containerd whose signed
// version does not parse is an error naming the file.
func (t *Release) RuntimeMoveFor(rt nodefacts.Runtime, arch string) (*RuntimeMove, error) {
	if t == nil || t.Manifest == nil || rt.Name != FileContainerd {
		return nil, nil
	}
	f, _, ok := t.File(FileContainerd, ArchOr(arch))
	if !ok {
		return nil, nil
	}
	to, err := catalog.ParseVersion(f.Version)
	if err != nil {
		return nil, fmt.Errorf("the %s bundle's %s (%s): version %q: %w", t.Version, FileContainerd, f.Path, f.Version, err)
	}
	if rt.Version.Compare(to) >= 0 {
		return nil, nil
	}
	m := &RuntimeMove{From: rt.Version, To: to, Files: []string{FileContainerd}, ArchiveSHA256: f.SHA256, Major: rt.Version.Major != to.Major}
	if r, _, ok := t.File(FileRunc, ArchOr(arch)); ok {
		m.Files, m.RuncSHA256 = append(m.Files, FileRunc), r.SHA256
	}
	return m, nil
}

// The release files a node's tools come from, in every bundle: the CNI
// plugins' release archive and crictl's (the catalog's names).
const (
	FileCNIPlugins = "cni-plugins"
	FileCrictl     = "crictl"
)

// Where a node keeps its tools when it did not say: the CNI plugins'
// release archive unpacks into /opt/cni/bin (containerd's default cni
// bin_dir), crictl's into /usr/local/bin (cri-tools' install guide).
const (
	DefaultCNIBinDir = "/opt/cni/bin"
	DefaultCrictl    = "/usr/local/bin/crictl"
)

// ToolsPaths are where a node keeps its CNI plugins and crictl, as the
// node said; an empty field takes its default above.
type ToolsPaths struct {
	CNIBinDir, Crictl string
}

// Resolved are p's places with the defaults filled in.
func (p ToolsPaths) Resolved() (cni, crictl string) {
	cni, crictl = p.CNIBinDir, p.Crictl
	if cni == "" {
		cni = DefaultCNIBinDir
	}
	if crictl == "" {
		crictl = DefaultCrictl
	}
	return cni, crictl
}

// ToolsMove is the move of a node's CNI plugins and crictl to the
// bundle's, with the files staged for it. Each tool's SHA256 is the signed
// manifest's sum of its archive; empty when the bundle carries none for
// the node's arch (that tool stays).
type ToolsMove struct {
	Files                   []string
	CNISHA256, CrictlSHA256 string
}

// ToolsMoveFor is what the bundle does to the CNI plugins and crictl of a
// node of arch: where it carries the node stack (a containerd for arch),
// it moves them to its own, each it carries; nil otherwise. Which programs
// differ from the node's is for the node to say (nodeops.Ops.SwapTools).
func (t *Release) ToolsMoveFor(arch string) *ToolsMove {
	if t == nil || t.Manifest == nil {
		return nil
	}
	if _, _, ok := t.File(FileContainerd, ArchOr(arch)); !ok {
		return nil
	}
	m := &ToolsMove{}
	if f, _, ok := t.File(FileCNIPlugins, ArchOr(arch)); ok {
		m.Files, m.CNISHA256 = append(m.Files, FileCNIPlugins), f.SHA256
	}
	if f, _, ok := t.File(FileCrictl, ArchOr(arch)); ok {
		m.Files, m.CrictlSHA256 = append(m.Files, FileCrictl), f.SHA256
	}
	if len(m.Files) == 0 {
		return nil
	}
	return m
}

// NodeFiles are the files a node of role in a cluster of kind is staged
// from the release: its binaries (FilesForKind), the parts of the runtime
// move the bundle makes on the node (rt, its runtime as its Node reports
// it, for arch), where it makes one, its tools' archives where the
// bundle carries the node stack (ToolsMoveFor), and etcd's release
// archive on a binary cluster's control-plane nodes where the bundle
// carries etcd (bundle create --etcd).
func (t *Release) NodeFiles(kind, role string, rt nodefacts.Runtime, arch string) ([]string, error) {
	names := FilesForKind(kind, role)
	m, err := t.RuntimeMoveFor(rt, arch)
	if err != nil {
		return names, err
	}
	if m != nil {
		names = append(names, m.Files...)
	}
	if tm := t.ToolsMoveFor(arch); tm != nil {
		names = append(names, tm.Files...)
	}
	if _, _, ok := t.File(FileEtcd, ArchOr(arch)); ok && kind == KindBinary && role == RoleControlPlane {
		names = append(names, FileEtcd)
	}
	return names, nil
}

// NodeRuntime is the runtime node n reports
// (status.nodeInfo.containerRuntimeVersion), parsed; a value that does
// not parse is an error naming the node, the field and the value.
func NodeRuntime(n *corev1.Node) (nodefacts.Runtime, error) {
	rt, bad := nodefacts.ParseRuntime(n.Name, n.Status.NodeInfo.ContainerRuntimeVersion)
	if bad != nil {
		return rt, *bad
	}
	return rt, nil
}
