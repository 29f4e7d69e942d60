// Package stage puts a release's files on the nodes before an upgrade, so
// that the upgrade itself is a rename on each node: read what a node has
// staged, choose how to send the rest (pulled by the node from the private
// registry, or sent over SSH, encoded once per file for every node), and
// check each file's size and sha256 on the node before it is renamed into
// place.
package stage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/cas"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/codec"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/progress"
)

// The ways a node gets its files (Options.Via).
const (
	// ViaAuto pulls from the registry on nodes that reach it and pushes
	// over SSH to the others.
	ViaAuto = "auto"
	// ViaRegistry: every node pulls from the registry; a node that cannot
	// is not staged.
	ViaRegistry = "registry"
	// ViaSSH: this machine sends every node its files over SSH.
	ViaSSH = "ssh"
	// ViaNone is the path of a node that can get its files neither way
	// (--via registry or agent, and it cannot pull): only the plan says
	// it.
	ViaNone = "none"
)

// What nodes are handed to pull with (Options.NodeCredentials).
const (
	// NodeTokens hands nodes a pull-scoped token from the registry's token
	// service, or nothing to an anonymous registry; nodes of a registry
	// that takes only passwords are sent their files over SSH.
	NodeTokens = "token"
	// NodePasswords also hands nodes, on stdin, this machine's password
	// for a registry that takes only passwords (htpasswd), which can
	// usually push as well as pull.
	NodePasswords = "password"
)

// The encodings of a file sent over SSH (Options.Codec).
const (
	// CodecAuto relays the registry's zstd copies where the node has
	// zstd; a file encoded here is encoded (zstd where the node has it,
	// else gzip) or sent as it is, whichever the first file's first
	// megabytes measure faster (measureCodec).
	CodecAuto = "auto"
	CodecZstd = codec.Zstd
	CodecGzip = codec.Gzip
	// CodecNone sends the file as it is (links faster than decompression).
	CodecNone = codec.None
)

// Options configure Stage.
type Options struct {
	Release *release.Release
	Source  Source
	// Nodes are the cluster's nodes (their architecture picks the files);
	// Addresses say how to reach each.
	Nodes     []corev1.Node
	Addresses []nodeaccess.Address
	Connector nodeaccess.Connector
	// Parallel bounds the nodes staged at once.
	Parallel int
	// StageDir is where files go on the nodes (release.DefaultStageDir).
	StageDir string
	// CacheDir keeps verified files and their compressed form on this
	// machine, so each is fetched and compressed once for every node.
	CacheDir string
	// Kind is the cluster's kind (release.KindBinary when empty): what each node
	// needs (release.FilesForKind). Cluster reads it from the cluster.
	Kind string
	// Via is how nodes get their files (ViaAuto when empty); pulls need a
	// Source that is a NodePuller.
	Via string
	// Codec encodes what SSH carries (CodecAuto when empty).
	Codec string
	// NodeCredentials says what nodes may be handed (NodeTokens when
	// empty).
	NodeCredentials string
	// Progress counts the files' bytes as each lands on a node.
	Progress progress.Sink
	Log      *slog.Logger
}

// CheckChoice refuses a Via, Codec or NodeCredentials that is none
// of the known ones.
func CheckChoice(via, codec, creds string) error {
	switch creds {
	case "", NodeTokens, NodePasswords:
	default:
		return fmt.Errorf("node credentials %q: want token or password", creds)
	}
	switch via {
	case "", ViaAuto, ViaRegistry, ViaSSH:
	default:
		return fmt.Errorf("staging path %q: want auto, registry or ssh", via)
	}
	switch codec {
	case "", CodecAuto, CodecZstd, CodecGzip, CodecNone:
	default:
		return fmt.Errorf("codec %q: want auto, zstd, gzip or none", codec)
	}
	return nil
}

// NodeStage is what staging did on one node.
type NodeStage struct {
	Node string `json:"node"`
	// Path is how the node got its files: "registry" (it pulled them) or
	// "ssh" (this machine sent them); PathReason says why SSH when
	// registry pulls were possible. Codec is what SSH carried.
	Path       string `json:"path,omitempty"`
	PathReason string `json:"pathReason,omitempty"`
	Codec      string `json:"codec,omitempty"`
	// CodecReason says why that codec, where --codec auto chose it.
	CodecReason string `json:"codecReason,omitempty"`
	// Sent lists the files sent; Present those already there, unchanged.
	Sent    []string `json:"sent"`
	Present []string `json:"present"`
	// BytesSent is what this machine sent over SSH (compressed);
	// BytesPulled what the node fetched from the registry itself; Bytes
	// the files' size.
	BytesSent   int64   `json:"bytesSent"`
	BytesPulled int64   `json:"bytesPulled"`
	Bytes       int64   `json:"bytes"`
	Seconds     float64 `json:"seconds"`
	Error       string  `json:"error,omitempty"`
}

// Result reports Stage.
type Result struct {
	Version string      `json:"version"`
	Dir     string      `json:"dir"`
	Nodes   []NodeStage `json:"nodes"`
	// WireBytes is what this machine wrote to the nodes over SSH, on the
	// wire (encryption, commands and all), when the connector counts it.
	WireBytes int64 `json:"wireBytes,omitempty"`
	// Took is the wall time (set by Cluster).
	Took string `json:"took,omitempty"`
}

// BytesSent is the total this machine sent to every node, and the files'
// size.
func (r *Result) BytesSent() (sent, size int64) {
	for _, n := range r.Nodes {
		sent += n.BytesSent
		size += n.Bytes
	}
	return sent, size
}

// ErrStage means some nodes were not staged; the result names them.
var ErrStage = errors.New("staging failed")

// Cluster stages opts.Release on every node of the cluster: its Nodes
// as the API lists them, each reached where inv says (nil: at its
// InternalIP); opts.Nodes and opts.Addresses are filled in.
func Cluster(ctx context.Context, client kubernetes.Interface, inv *nodeaccess.Inventory, opts Options) (*Result, error) {
	nodes, err := cluster.ListNodes(ctx, client)
	if err != nil {
		return nil, err
	}
	targets, err := nodeaccess.Addresses(nodes, inv)
	if err != nil {
		return nil, err
	}
	opts.Nodes, opts.Addresses = nodes, targets
	if opts.Kind == "" {
		if opts.Kind, err = release.ClusterKind(ctx, client); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	res, err := Run(ctx, opts)
	if res != nil {
		res.Took = time.Since(start).Round(time.Millisecond).String()
	}
	return res, err
}

// Run puts every node's files of the target under StageDir/VERSION on
// it, and on control-plane nodes each hop's under StageDir/HOP: pulled by
// the node from the registry where it can (Via), else sent over SSH,
// encoded once per file for every node (Codec); the size and sha256 are
// checked on the node before the file is renamed into place, a file
// already there is skipped (a re-run sends nothing), and one a stage cut
// off is gone on from. One unreachable node is reported and the others
// staged.
func Run(ctx context.Context, opts Options) (*Result, error) {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := CheckChoice(opts.Via, opts.Codec, opts.NodeCredentials); err != nil {
		return nil, err
	}
	dir := opts.StageDir
	if dir == "" {
		dir = release.DefaultStageDir
	}
	version := opts.Release.Version.String()
	arch := map[string]string{}
	nodes := map[string]*corev1.Node{}
	for i, n := range opts.Nodes {
		arch[n.Name], nodes[n.Name] = n.Status.NodeInfo.Architecture, &opts.Nodes[i]
	}
	c := &encodedCache{store: &cas.Store{Dir: filepath.Join(opts.CacheDir, "files")}, dir: opts.CacheDir, source: opts.Source, log: log}
	res := &Result{Version: version, Dir: dir}
	if w, ok := opts.Connector.(interface{ BytesWritten() int64 }); ok {
		before := w.BytesWritten()
		defer func() { res.WireBytes = w.BytesWritten() - before }()
	}
	var mu sync.Mutex
	byNode := map[string]*NodeStage{}
	for _, t := range opts.Addresses {
		byNode[t.Name] = &NodeStage{Node: t.Name}
	}
	failed := nodeaccess.ForEach(ctx, opts.Connector, opts.Addresses, opts.Parallel, func(ctx context.Context, t nodeaccess.Address, n nodeaccess.Node) error {
		began := time.Now()
		s := &nodeStager{opts: &opts, n: n, t: t, arch: arch[t.Name], dir: dir, cache: c, ns: &NodeStage{Node: t.Name}}
		if s.arch == "" {
			s.arch = "amd64"
		}
		var err error
		// The hops' files (control-plane nodes only), then the target's.
		for _, h := range opts.Release.Hops {
			if err == nil {
				err = s.stage(ctx, h, release.HopFilesForKind(opts.Kind, t.Role), h.Version.String()+"/")
			}
		}
		if err == nil {
			var names []string
			if names, err = NodeFiles(opts.Release, opts.Kind, t.Role, nodes[t.Name], s.arch); err == nil {
				err = s.stage(ctx, opts.Release, names, "")
			}
		}
		ns := s.ns
		ns.Seconds = time.Since(began).Seconds()
		sort.Strings(ns.Sent)
		sort.Strings(ns.Present)
		mu.Lock()
		defer mu.Unlock()
		byNode[t.Name] = ns
		if err == nil {
			moved := ns.BytesSent + ns.BytesPulled
			log.Info("staged", "node", t.Name, "path", ns.Path, "codec", ns.Codec, "sent", len(ns.Sent), "present", len(ns.Present),
				"bytes", moved, "rate", fmt.Sprintf("%.0f MB/s", float64(moved)/1e6/max(ns.Seconds, 0.001)), "took", time.Duration(ns.Seconds*float64(time.Second)).Round(time.Millisecond))
		}
		return err
	})
	var errs []error
	for _, t := range opts.Addresses {
		ns := byNode[t.Name]
		if err := failed[t.Name]; err != nil {
			ns.Error = err.Error()
			errs = append(errs, err)
			log.Error("not staged", "node", t.Name, "err", err)
		}
		res.Nodes = append(res.Nodes, *ns)
	}
	if len(errs) > 0 {
		return res, fmt.Errorf("%w on %d of %d nodes: %w", ErrStage, len(errs), len(opts.Addresses), errors.Join(errs...))
	}
	return res, nil
}

// NodeFiles are the release's files node n (of role, in a cluster of
// kind) is staged: its binaries, and its runtime move's parts where the
// bundle makes one (n nil: a node the API did not list, its binaries).
func NodeFiles(target *release.Release, kind, role string, n *corev1.Node, arch string) ([]string, error) {
	if n == nil {
		return release.FilesForKind(kind, role), nil
	}
	rt, err := release.NodeRuntime(n)
	if err != nil {
		return nil, err
	}
	return target.NodeFiles(kind, role, rt, arch)
}

// Path says how staging would get the node's missing files there
// (ViaRegistry or ViaSSH, and why not the registry), asking the node as
// Stage does, read-only, where it could pull: opts gives Source, Via,
// NodeCredentials, StageDir and Kind. Plan says it for each node that
// lacks files.
func Path(ctx context.Context, n nodeaccess.Node, t nodeaccess.Address, target *release.Release, arch string, opts Options) (path, reason string, err error) {
	if opts.StageDir == "" {
		opts.StageDir = release.DefaultStageDir
	}
	s := &nodeStager{opts: &opts, n: n, t: t, arch: arch, dir: opts.StageDir, ns: &NodeStage{Node: t.Name}}
	if s.arch == "" {
		s.arch = "amd64"
	}
	for _, name := range release.FilesForKind(opts.Kind, t.Role) {
		if f, artifact, ok := target.File(name, s.arch); ok {
			// The node is listed (and its registry probed) only where it
			// could pull; the codec is apply's to choose.
			opts.Codec = CodecGzip
			if _, err := s.choose(ctx, release.StagePath(opts.StageDir, target.Version.String(), ""), f, artifact, &staged{}); err != nil {
				return "", "", err
			}
			return s.ns.Path, s.ns.PathReason, nil
		}
	}
	return "", "", nil
}

// Describe says how apply gets a node its missing files along path (why:
// what keeps it from the registry, or from both ways).
func Describe(path, why string) string {
	switch path {
	case ViaSSH:
		return "apply sends them over SSH (" + why + ")"
	case ViaNone:
		return "apply cannot get them there: " + why
	}
	return "apply has the node pull them from the private registry"
}
