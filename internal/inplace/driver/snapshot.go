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
)

// KeepOffNode copies the etcd snapshot a driver took on node, at file,
// to r.SnapshotDir on this machine (as NODE-NAME), so that it outlives
// the node it protects: written to a temporary file, its sha256 checked
// against the node's file, then renamed into place. It returns where the
// copy is ("" without a SnapshotDir, or in a dry run).
func KeepOffNode(ctx context.Context, r *Run, node, file string) (string, error) {
	if r.SnapshotDir == "" || r.Dry {
		return "", nil
	}
	dst := filepath.Join(r.SnapshotDir, node+"-"+path.Base(file))
	err := r.OnNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error {
		if err := os.MkdirAll(r.SnapshotDir, 0o700); err != nil {
			return err
		}
		tmp, err := os.CreateTemp(r.SnapshotDir, ".snapshot-*")
		if err != nil {
			return err
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
			return fmt.Errorf("node %s: copy the etcd snapshot %s here: %w", node, file, err)
		}
		sum := hex.EncodeToString(h.Sum(nil))
		if _, err := o.Run(ctx, "check the etcd snapshot's copy", nodescript.CheckFile, file, sum); err != nil {
			return err
		}
		return os.Rename(tmp.Name(), dst)
	})
	if err != nil {
		return "", err
	}
	r.Log.Info("etcd snapshot kept off the node", "node", node, "copy", dst)
	return dst, nil
}
