package driver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/registry"
)

// Snapshots says where the etcd snapshot a driver takes is kept off the
// node it protects.
type Snapshots struct {
	// Dir is the directory on this machine it is copied to ("": kept on
	// the node only).
	Dir string
	// Repository, with Registry, is where that copy is pushed on to, as
	// an artifact tagged with the copy's name, NODE-NAME ("": not pushed).
	Repository string
	Registry   FilePusher
}

// FilePusher pushes a file as an OCI artifact (registry.Access).
type FilePusher interface {
	PushFile(ctx context.Context, ref, path, sum string, art registry.Artifact) (string, error)
}

// SnapshotArtifact is what a pushed etcd snapshot is: the artifact type
// (its manifest's config media type) and its one layer's, the snapshot
// file as etcdctl wrote it.
var SnapshotArtifact = registry.Artifact{Type: "application/vnd.kubelift.etcd-snapshot.v1", LayerType: "application/vnd.etcd.snapshot.db"}

// KeepOffNode copies the etcd snapshot a driver took on node, at file,
// to r.Snapshot.Dir on this machine (as NODE-NAME), so that it outlives
// the node it protects: written to a temporary file, its sha256 checked
// against the node's file, then renamed into place; and pushes the copy
// on to r.Snapshot.Repository where one is given. It returns where the
// copy is ("" without a directory, or in a dry run).
func KeepOffNode(ctx context.Context, r *Run, node, file string) (string, error) {
	if r.Snapshot.Dir == "" || r.Dry {
		return "", nil
	}
	dst := filepath.Join(r.Snapshot.Dir, node+"-"+path.Base(file))
	var sum string
	err := r.OnNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error {
		var err error
		sum, err = copyOff(ctx, o, r.Snapshot.Dir, node, file, dst)
		return err
	})
	if err != nil {
		return "", err
	}
	r.Log.Info("etcd snapshot kept off the node", "node", node, "copy", dst)
	if r.Snapshot.Repository == "" || r.Snapshot.Registry == nil {
		return dst, nil
	}
	ref := r.Snapshot.Repository + ":" + snapshotTag(path.Base(dst))
	art := SnapshotArtifact
	art.Annotations = map[string]string{"org.opencontainers.image.title": path.Base(dst)}
	d, err := r.Snapshot.Registry.PushFile(ctx, ref, dst, sum, art)
	if err != nil {
		return "", fmt.Errorf("etcd snapshot %s: %w", dst, err)
	}
	r.Log.Info("etcd snapshot pushed", "node", node, "artifact", ref, "digest", d)
	return dst, nil
}

// copyOff copies node's file to dst in dir through o, and returns its
// sha256 (hex), which the node's file has too.
func copyOff(ctx context.Context, o *nodeops.Ops, dir, node, file, dst string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".snapshot-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name()) // gone once renamed
	h := sha256.New()
	_, err = o.Node.Stream(ctx, nodescript.ReadFile.Command(file), io.MultiWriter(tmp, h))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("node %s: copy the etcd snapshot %s here: %w", node, file, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if _, err := o.Run(ctx, "check the etcd snapshot's copy", nodescript.CheckFile, file, sum); err != nil {
		return "", err
	}
	return sum, os.Rename(tmp.Name(), dst)
}

// snapshotTag is a tag for a snapshot's name: what a tag may hold
// ([A-Za-z0-9_.-], 128 at most, not first a '.' or '-') kept, anything
// else a '-'.
func snapshotTag(name string) string {
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			b[i] = '-'
		}
	}
	if len(b) > 128 {
		b = b[len(b)-128:]
	}
	if len(b) > 0 && (b[0] == '.' || b[0] == '-') {
		b[0] = '_'
	}
	return string(b)
}
