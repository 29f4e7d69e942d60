package inplace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/gzip"
	"github.com/opencontainers/go-digest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/atomicfile"
	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/cas"
	"github.com/kubelift/kubelift/internal/iocount"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/registry"
)

// Source supplies the content of a target's files. What it returns is
// checked against the signed sha256 before any of it reaches a node.
type Source interface {
	Open(ctx context.Context, f bundle.File, artifact string) (io.ReadCloser, error)
}

// BundleSource reads files from a verified bundle file.
type BundleSource struct{ Bundle *bundle.Verified }

// Open returns the file's entry.
func (s BundleSource) Open(_ context.Context, f bundle.File, _ string) (io.ReadCloser, error) {
	r, err := s.Bundle.OpenEntry(f.Path)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(r), nil
}

// RegistrySource reads files from the OCI artifacts import pushed.
type RegistrySource struct{ Access registry.Access }

// ErrNoArtifact means the record names no artifact for a file: the
// bundle was imported with --skip-binaries.
var ErrNoArtifact = errors.New("not in the private registry (imported with --skip-binaries?): stage from the bundle file")

// Open streams the artifact's layer, whose digest is the file's sha256.
func (s RegistrySource) Open(ctx context.Context, f bundle.File, artifact string) (io.ReadCloser, error) {
	if artifact == "" {
		return nil, fmt.Errorf("file %s: %w", f.Path, ErrNoArtifact)
	}
	repo, _, _ := strings.Cut(artifact, "@")
	return s.Access.OpenBlob(ctx, repo, v1.Hash{Algorithm: "sha256", Hex: f.SHA256})
}

// StageOptions configure Stage.
type StageOptions struct {
	Target *Target
	Source Source
	// Nodes are the cluster's nodes (their architecture picks the files);
	// Targets say how to reach each.
	Nodes     []corev1.Node
	Targets   []nodeaccess.Target
	Connector nodeaccess.Connector
	// Parallel bounds the nodes staged at once.
	Parallel int
	// StageDir is where files go on the nodes (DefaultStageDir).
	StageDir string
	// CacheDir keeps verified files and their compressed form on this
	// machine, so each is fetched and compressed once for every node.
	CacheDir string
	// Kind is the cluster's kind (KindBinary when empty): what each node
	// needs (FilesForKind). StageCluster reads it from the cluster.
	Kind string
	Log  *slog.Logger
}

// NodeStage is what staging did on one node.
type NodeStage struct {
	Node string `json:"node"`
	// Sent lists the files sent; Present those already there, unchanged.
	Sent    []string `json:"sent"`
	Present []string `json:"present"`
	// BytesSent is what crossed the wire (compressed); Bytes the files'
	// size.
	BytesSent int64  `json:"bytesSent"`
	Bytes     int64  `json:"bytes"`
	Error     string `json:"error,omitempty"`
}

// StageResult reports Stage.
type StageResult struct {
	Version string      `json:"version"`
	Dir     string      `json:"dir"`
	Nodes   []NodeStage `json:"nodes"`
	// Took is the wall time (set by StageCluster).
	Took string `json:"took,omitempty"`
}

// BytesSent is the total sent to every node.
func (r *StageResult) BytesSent() (sent, size int64) {
	for _, n := range r.Nodes {
		sent += n.BytesSent
		size += n.Bytes
	}
	return sent, size
}

// ErrStage means some nodes were not staged; the result names them.
var ErrStage = errors.New("staging failed")

// StageCluster stages opts.Target on every node of the cluster: its Nodes
// as the API lists them, each reached where inv says (nil: at its
// InternalIP); opts.Nodes and opts.Targets are filled in.
func StageCluster(ctx context.Context, client kubernetes.Interface, inv *nodeaccess.Inventory, opts StageOptions) (*StageResult, error) {
	nodes, err := ListNodes(ctx, client)
	if err != nil {
		return nil, err
	}
	targets, err := nodeaccess.Targets(nodes, inv)
	if err != nil {
		return nil, err
	}
	opts.Nodes, opts.Targets = nodes, targets
	if opts.Kind == "" {
		if opts.Kind, err = ClusterKind(ctx, client); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	res, err := Stage(ctx, opts)
	if res != nil {
		res.Took = time.Since(start).Round(time.Millisecond).String()
	}
	return res, err
}

// Stage puts every node's files of the target under StageDir/VERSION on
// it, and on control-plane nodes each hop's under StageDir/HOP: compressed
// in transit, the sha256 checked on the node, placed atomically, and
// skipped where the right file is already there (a re-run sends nothing).
// One unreachable node is reported and the others staged.
func Stage(ctx context.Context, opts StageOptions) (*StageResult, error) {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir := opts.StageDir
	if dir == "" {
		dir = DefaultStageDir
	}
	version := opts.Target.Version.String()
	arch := map[string]string{}
	for _, n := range opts.Nodes {
		arch[n.Name] = n.Status.NodeInfo.Architecture
	}
	c := &compressedCache{store: &cas.Store{Dir: filepath.Join(opts.CacheDir, "files")}, dir: filepath.Join(opts.CacheDir, "gzip"),
		source: opts.Source}
	res := &StageResult{Version: version, Dir: dir}
	var mu sync.Mutex
	byNode := map[string]*NodeStage{}
	for _, t := range opts.Targets {
		byNode[t.Name] = &NodeStage{Node: t.Name}
	}
	failed := nodeaccess.ForEach(ctx, opts.Connector, opts.Targets, opts.Parallel, func(ctx context.Context, t nodeaccess.Target, n nodeaccess.Node) error {
		ns := &NodeStage{Node: t.Name}
		var err error
		// The hops' files (control-plane nodes only), then the target's.
		for _, h := range opts.Target.Hops {
			if err == nil {
				err = stageNode(ctx, n, t, ns, arch[t.Name], dir, h, HopFilesForKind(opts.Kind, t.Role), h.Version.String()+"/", c)
			}
		}
		if err == nil {
			err = stageNode(ctx, n, t, ns, arch[t.Name], dir, opts.Target, FilesForKind(opts.Kind, t.Role), "", c)
		}
		sort.Strings(ns.Sent)
		sort.Strings(ns.Present)
		mu.Lock()
		defer mu.Unlock()
		byNode[t.Name] = ns
		if err == nil {
			log.Info("staged", "node", t.Name, "sent", len(ns.Sent), "present", len(ns.Present), "bytes", ns.BytesSent)
		}
		return err
	})
	var errs []error
	for _, t := range opts.Targets {
		ns := byNode[t.Name]
		if err := failed[t.Name]; err != nil {
			ns.Error = err.Error()
			errs = append(errs, err)
			log.Error("not staged", "node", t.Name, "err", err)
		}
		res.Nodes = append(res.Nodes, *ns)
	}
	if len(errs) > 0 {
		return res, fmt.Errorf("%w on %d of %d nodes: %w", ErrStage, len(errs), len(opts.Targets), errors.Join(errs...))
	}
	return res, nil
}

// stageNode sends the node's missing files of target (names) to
// StageDir/VERSION, adding to ns what it did; a hop's files are named
// VERSION/NAME there.
func stageNode(ctx context.Context, n nodeaccess.Node, t nodeaccess.Target, ns *NodeStage, arch, dir string, target *Target, names []string, prefix string, c *compressedCache) error {
	if len(names) == 0 {
		return nil
	}
	if arch == "" {
		arch = "amd64"
	}
	version := target.Version.String()
	var files []bundle.File
	var artifacts []string
	for _, name := range names {
		f, artifact, ok := target.File(name, arch)
		if !ok {
			if name == "kube-proxy" || name == "kubectl" {
				continue // optional: not every bundle carries them
			}
			return fmt.Errorf("node %s: the %s bundle has no %s for linux/%s", t.Name, version, name, arch)
		}
		files = append(files, f)
		artifacts = append(artifacts, artifact)
	}
	vdir := StagePath(dir, version, "")
	out, err := n.Run(ctx, nodescript.ListStaged.Command(vdir), nil)
	if err != nil {
		return fmt.Errorf("node %s: read %s: %w", t.Name, vdir, err)
	}
	have := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if sum, name, ok := strings.Cut(strings.TrimSpace(line), "  "); ok {
			have[name] = sum
		}
	}
	for i, f := range files {
		ns.Bytes += f.Size
		if have[f.Name] == f.SHA256 {
			ns.Present = append(ns.Present, prefix+f.Name)
			continue
		}
		gz, err := c.compressed(ctx, f, artifacts[i])
		if err != nil {
			return err
		}
		sent, err := sendFile(ctx, n, vdir, f, gz)
		ns.BytesSent += sent
		if err != nil {
			return fmt.Errorf("node %s: stage %s: %w", t.Name, prefix+f.Name, err)
		}
		ns.Sent = append(ns.Sent, prefix+f.Name)
	}
	return nil
}

// sendFile streams a compressed file to the node, which decompresses it
// to a temporary name, checks its sha256 and renames it into place.
func sendFile(ctx context.Context, n nodeaccess.Node, vdir string, f bundle.File, gzPath string) (int64, error) {
	if _, ok := nodefacts.Under(vdir, f.Name); !ok {
		return 0, fmt.Errorf("file %s: name %q is not a file name", f.Path, f.Name)
	}
	in, err := os.Open(gzPath)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	cr := iocount.NewReader(in)
	_, err = n.Run(ctx, nodescript.StageFile.Command(vdir, f.Name, f.SHA256), cr)
	return cr.N(), err
}

// compressedCache fetches each file once, checks it, and keeps it gzipped
// for every node that needs it.
type compressedCache struct {
	store  *cas.Store
	dir    string
	source Source
	mu     sync.Mutex
	locks  map[string]*sync.Mutex
}

func (c *compressedCache) lock(sum string) *sync.Mutex {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.locks == nil {
		c.locks = map[string]*sync.Mutex{}
	}
	if c.locks[sum] == nil {
		c.locks[sum] = &sync.Mutex{}
	}
	return c.locks[sum]
}

func (c *compressedCache) compressed(ctx context.Context, f bundle.File, artifact string) (string, error) {
	l := c.lock(f.SHA256)
	l.Lock()
	defer l.Unlock()
	gzPath := filepath.Join(c.dir, f.SHA256+".gz")
	if _, err := os.Stat(gzPath); err == nil {
		return gzPath, nil
	}
	d := digest.NewDigestFromEncoded(digest.SHA256, f.SHA256)
	if !c.store.Has(d, f.Size) {
		rc, err := c.source.Open(ctx, f, artifact)
		if err != nil {
			return "", fmt.Errorf("file %s: %w", f.Path, err)
		}
		_, err = c.store.Put(d, f.Size, rc)
		rc.Close()
		if err != nil {
			return "", fmt.Errorf("file %s: %w", f.Path, err)
		}
	}
	raw, err := c.store.Open(d)
	if err != nil {
		return "", err
	}
	defer raw.Close()
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return "", err
	}
	out, err := atomicfile.Create(gzPath, 0o644)
	if err != nil {
		return "", err
	}
	defer out.Abort()
	zw, _ := gzip.NewWriterLevel(out.File, gzip.BestSpeed)
	if _, err := io.Copy(zw, raw); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	if err := out.Commit(); err != nil {
		return "", err
	}
	return gzPath, nil
}
