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
