package inplace

import (
	"context"
	"fmt"
	"log/slog"
	"path"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/pkg/hashskip"
)

// CleanupOptions configure Cleanup.
type CleanupOptions struct {
	Client    kubernetes.Interface
	Catalog   *catalog.Catalog
	Connector nodeaccess.Connector
	Inventory *nodeaccess.Inventory
	Parallel  int
	DryRun    bool
	Log       *slog.Logger
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
	nodes, pods, tgts, err := listCluster(ctx, opts.Client, opts.Inventory)
	if err != nil {
		return nil, err
	}
	version := map[string]string{}
	for _, n := range nodes {
		version[n.Name] = n.Status.NodeInfo.KubeletVersion
	}
	var mu sync.Mutex
	res := map[string]*NodeCleanup{}
	failed := nodeaccess.ForEach(ctx, opts.Connector, tgts, opts.Parallel, func(ctx context.Context, t nodeaccess.Target, n nodeaccess.Node) error {
		nc, err := cleanupNode(ctx, n, t.Name, version[t.Name], pods, opts)
		mu.Lock()
		res[t.Name] = nc
		mu.Unlock()
		if nc != nil && nc.Removed {
			log.Info("hash-skip file removed", "node", t.Name)
		}
		return err
	})
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

func cleanupNode(ctx context.Context, n nodeaccess.Node, name, kubelet string, pods []corev1.Pod, opts CleanupOptions) (*NodeCleanup, error) {
	nc := &NodeCleanup{Node: name}
	f, err := ReadFacts(ctx, n, name, DefaultStageDir, kubelet)
	if err != nil {
		return nc, err
	}
	root := f.Values["kubelet --root-dir"]
	if root == "" {
		root = "/var/lib/kubelet"
	}
	file := path.Join(root, path.Base(hashskip.DefaultPath))
	out, err := n.Run(ctx, "[ -e "+nodeaccess.Quote(file)+" ] && echo yes || echo no", nil)
	if err != nil {
		return nc, fmt.Errorf("node %s: %w", name, err)
	}
	nc.File = string(out) == "yes\n"
	if !nc.File {
		return nc, nil
	}
	if f.ContainersErr != "" {
		return nc, fmt.Errorf("node %s: crictl ps: %s", name, f.ContainersErr)
	}
	hasher, err := kubeletcompat.NewHasher(opts.Catalog, kubelet)
	if err != nil {
		return nc, fmt.Errorf("node %s: kubelet %s: %w", name, kubelet, err)
	}
	// Predict with no file: what the kubelet would restart without it.
	preds, err := kubeletcompat.Predict(pods, map[string][]kubeletcompat.RuntimeContainer{name: f.Containers}, kubeletcompat.PredictOptions{Target: hasher})
	if err != nil {
		return nc, err
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
	if !hashskip.Converged(hashes) || opts.DryRun {
		return nc, nil
	}
	if _, err := n.Run(ctx, "rm -f "+nodeaccess.Quote(file), nil); err != nil {
		return nc, fmt.Errorf("node %s: remove %s: %w", name, file, err)
	}
	nc.Removed = true
	return nc, nil
}
