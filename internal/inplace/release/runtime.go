package release

import (
	"fmt"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// The node-stack files a bundle carries for the nodes' container runtime
// (bundle create --node-stack), named as the catalog's parts:
// containerd's release archive and runc's binary.
const (
	FileContainerd = catalog.StackContainerd
	FileRunc       = catalog.StackRunc
)

// RuntimeMove is the move of a node's containerd that the bundle makes:
// from the version the node runs to the bundle's, with the files staged
// for it.
type RuntimeMove struct {
	From, To catalog.Version
	// Files are staged with the release's own: containerd, and runc where
	// the bundle carries it.
	Files []string
	// Major: the major version changes, and with it the config's schema.
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
	m := &RuntimeMove{From: rt.Version, To: to, Files: []string{FileContainerd}, Major: rt.Version.Major != to.Major}
	if _, _, ok := t.File(FileRunc, ArchOr(arch)); ok {
		m.Files = append(m.Files, FileRunc)
	}
	return m, nil
}
