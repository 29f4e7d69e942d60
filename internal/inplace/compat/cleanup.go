// Package compat removes what kubelift's kubelet compatibility left on
// the nodes once nothing needs it: the hash-skip file, from every node
// where each running container's recorded hash is what its kubelet
// computes (upgrade compat cleanup).
package compat

import (
	"context"
	"fmt"
	"log/slog"
	"path"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/upgradelock"
	"github.com/kubelift/kubelift/pkg/hashskip"
)

// CleanupOptions configure Cleanup.
type CleanupOptions struct {
	Client    kubernetes.Interface
	Catalog   *catalog.Catalog
	Connector nodeaccess.Connector
	Inventory *nodeaccess.Inventory
	Parallel  int
	// StageDir is where stage put the files on the nodes (release.DefaultStageDir).
	StageDir string
	DryRun   bool
	Log      *slog.Logger
	// Holder and LockDuration are the upgrade lock's, which Cleanup holds
	// (but in a dry run): an apply beside it may be writing the very file
	// it would remove. Defaults: a new identity, a minute.
	Holder       string
	LockDuration time.Duration
}

// NodeCleanup says what Cleanup found on one node.
type NodeCleanup struct {
	Node string `json:"node"`
	// File: the hash-skip file is there.
	File bool `json:"file"`
	// Containers running; Old those whose recorded hash is not what the
	// running kubelet computes (they still need the file).
	Containers int    `json:"containers"`
	Old        int    `json:"old"`
	Removed    bool   `json:"removed"`
	Error      string `json:"error,omitempty"`
	// DryRun is, in a dry run, the node script that would remove the file.
	DryRun string `json:"dryRun,omitempty"`
	// converged: no running container needs the file.
	converged bool
}

// Cleanup removes the hash-skip file from every node where it is no longer
// needed: every running container's recorded hash equals what the node's
// kubelet computes for its spec (hashskip.Converged), so the kubelet
// behaves exactly as upstream without it.
func Cleanup(ctx context.Context, opts CleanupOptions) ([]NodeCleanup, error) {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var lock *upgradelock.Lock
	if !opts.DryRun {
		if opts.Holder == "" {
			opts.Holder = upgradelock.NewHolder()
		}
		if opts.LockDuration == 0 {
			opts.LockDuration = time.Minute
		}
		var err error
		if lock, err = upgradelock.Acquire(ctx, opts.Client, opts.Holder, opts.LockDuration, nil, log); err != nil {
			return nil, err
		}
		var stop func()
		ctx, stop = upgradelock.Hold(ctx, lock, log)
		defer stop()
	}
	nodes, pods, tgts, err := preflight.ListCluster(ctx, opts.Client, opts.Inventory)
	if err != nil {
		return nil, err
	}
	if opts.StageDir == "" {
		opts.StageDir = release.DefaultStageDir
	}
	version, bad := nodefacts.KubeletVersions(nodes)
	onNode := map[string][]corev1.Pod{}
	for i := range pods {
		onNode[pods[i].Spec.NodeName] = append(onNode[pods[i].Spec.NodeName], pods[i])
	}
	// Read every node first, change nothing: a value a node reported
	// that does not parse refuses the whole cleanup before any node is
	// touched.
	var mu sync.Mutex
	res := map[string]*NodeCleanup{}
	files := map[string]string{}
	failed := nodeaccess.ForEach(ctx, opts.Connector, tgts, opts.Parallel, func(ctx context.Context, t nodeaccess.Address, n nodeaccess.Node) error {
		kubelet, ok := version[t.Name]
		if !ok {
			return nil // refused above
		}
		nc, file, nodeBad, err := inspectNode(ctx, n, t.Name, kubelet, onNode[t.Name], opts)
		mu.Lock()
		defer mu.Unlock()
		res[t.Name], files[t.Name] = nc, file
		bad = append(bad, nodeBad...)
		return err
	})
	if len(bad) > 0 {
		sort.Slice(bad, func(i, j int) bool { return bad[i].Node < bad[j].Node })
		return nil, nodefacts.Refused(bad)
	}
	var remove []nodeaccess.Address
	for _, t := range tgts {
		if nc := res[t.Name]; nc != nil && failed[t.Name] == nil && nc.File && nc.converged {
			remove = append(remove, t)
			if opts.DryRun {
				nc.DryRun = nodescript.Remove.Show(files[t.Name])
			}
		}
	}
	if !opts.DryRun {
		for k, v := range removeFiles(ctx, opts, lock, remove, files, res, log) {
			failed[k] = v
		}
	}
	return cleanupResults(tgts, res, failed)
}

// removeFiles removes the hash-skip file of each node in remove, each
// while the run still holds the lock; the nodes it could not, with why.
func removeFiles(ctx context.Context, opts CleanupOptions, lock *upgradelock.Lock, remove []nodeaccess.Address, files map[string]string, res map[string]*NodeCleanup, log *slog.Logger) map[string]error {
	var mu sync.Mutex
	return nodeaccess.ForEach(ctx, opts.Connector, remove, opts.Parallel, func(ctx context.Context, t nodeaccess.Address, n nodeaccess.Node) error {
		if err := lock.Fence(ctx, opts.LockDuration); err != nil {
			return fmt.Errorf("node %s: not removed: %w", t.Name, err)
		}
		if _, err := n.Run(ctx, nodescript.Remove.Command(files[t.Name]), nil); err != nil {
			return fmt.Errorf("node %s: remove %s: %w", t.Name, files[t.Name], err)
		}
		mu.Lock()
		res[t.Name].Removed = true
		mu.Unlock()
		log.Info("hash-skip file removed", "node", t.Name)
		return nil
	})
}

// cleanupResults is every node's result, by name, with its error; an
// error says how many nodes failed.
func cleanupResults(tgts []nodeaccess.Address, res map[string]*NodeCleanup, failed map[string]error) ([]NodeCleanup, error) {
	var out []NodeCleanup
	for _, t := range tgts {
		nc := res[t.Name]
		if nc == nil {
			nc = &NodeCleanup{Node: t.Name}
		}
		if err := failed[t.Name]; err != nil {
			nc.Error = err.Error()
		}
		out = append(out, *nc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	if len(failed) > 0 {
		return out, fmt.Errorf("%d of %d nodes could not be cleaned up", len(failed), len(tgts))
	}
	return out, nil
}

// inspectNode reads what Cleanup needs of one node, changing nothing:
// whether the hash-skip file is there and whether every running
// container's recorded hash is what the kubelet computes; the file's
// path; the values it refused.
func inspectNode(ctx context.Context, n nodeaccess.Node, name, kubelet string, pods []corev1.Pod, opts CleanupOptions) (*NodeCleanup, string, []nodefacts.BadValue, error) {
	nc := &NodeCleanup{Node: name}
	f, err := nodefacts.Read(ctx, n, name, opts.StageDir, kubelet)
	if err != nil {
		return nc, "", nil, err
	}
	if len(f.Bad) > 0 {
		return nc, "", f.Bad, nil
	}
	root := f.Values["kubelet --root-dir"]
	if root == "" {
		root = "/var/lib/kubelet"
	}
	file := path.Join(root, path.Base(hashskip.DefaultPath))
	out, err := n.Run(ctx, nodescript.Exists.Command(file), nil)
	if err != nil {
		return nc, file, nil, fmt.Errorf("node %s: %w", name, err)
	}
	nc.File = string(out) == "yes\n"
	if !nc.File {
		return nc, file, nil, nil
	}
	if f.ContainersErr != "" {
		return nc, file, nil, fmt.Errorf("node %s: crictl ps: %s", name, f.ContainersErr)
	}
	hasher, err := kubeletcompat.NewHasher(opts.Catalog, kubelet)
	if err != nil {
		return nc, file, nil, fmt.Errorf("node %s: kubelet %s: %w", name, kubelet, err)
	}
	// Predict with no file: what the kubelet would restart without it.
	preds, err := kubeletcompat.Predict(pods, map[string][]kubeletcompat.RuntimeContainer{name: f.Containers}, kubeletcompat.PredictOptions{Target: hasher})
	if err != nil {
		return nc, file, nil, err
	}
	var hashes []hashskip.Hashes
	for _, p := range preds {
		nc.Containers++
		h := hashskip.Hashes{Recorded: kubeletcompat.ParseLabel(p.Recorded), Computed: kubeletcompat.ParseLabel(p.Expected)}
		if p.Changed {
			nc.Old++
		} else {
			h.Recorded = h.Computed
		}
		hashes = append(hashes, h)
	}
	nc.converged = hashskip.Converged(hashes)
	return nc, file, nil, nil
}
