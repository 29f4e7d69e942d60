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
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/cas"
	"github.com/kubelift/kubelift/internal/codec"
	"github.com/kubelift/kubelift/internal/iocount"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/progress"
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

// NodePuller is a Source the nodes can fetch from themselves: the private
// registry, which every node's runtime already reaches. Staging then sends
// a node only what to fetch (URL, signed sha256, size) and a credential on
// stdin, so this machine's bytes do not grow with the fleet.
type NodePuller interface {
	// ForNode says where a node fetches the blob (sha256:HEX) of the
	// artifact (REPOSITORY@DIGEST), and with what header.
	ForNode(ctx context.Context, artifact, blob string) (registry.NodePull, error)
	// ZstdCopy is the blob (sha256:HEX) and size of the zstd copy of the
	// artifact's file with sha256 sum, or "" when there is none.
	ZstdCopy(ctx context.Context, artifact, sum string) (string, int64, error)
}

// ZstdCopy finds the file's zstd copy, tagged codec.ZstdTag beside it.
func (s RegistrySource) ZstdCopy(ctx context.Context, artifact, sum string) (string, int64, error) {
	repo, _, _ := strings.Cut(artifact, "@")
	layers, err := s.Access.Layers(ctx, repo+":"+codec.ZstdTag(sum))
	if err != nil {
		return "", 0, err
	}
	for _, l := range layers {
		if l.MediaType == codec.ZstdMediaType && l.Annotations[codec.AnnotationDecodedSHA256] == sum && l.Size > 0 {
			return l.Digest.String(), l.Size, nil
		}
	}
	return "", 0, nil
}

// CopyRelay is a NodePuller whose zstd copies this machine can read too,
// to send them on over SSH as they are: a node that cannot pull is then
// sent what import compressed, with no compression here.
type CopyRelay interface {
	NodePuller
	// OpenCopy streams the blob (sha256:HEX) of the artifact's repository.
	OpenCopy(ctx context.Context, artifact, blob string) (io.ReadCloser, error)
}

// OpenCopy streams a blob of the artifact's repository (its zstd copy).
func (s RegistrySource) OpenCopy(ctx context.Context, artifact, blob string) (io.ReadCloser, error) {
	repo, _, _ := strings.Cut(artifact, "@")
	d, err := v1.NewHash(blob)
	if err != nil {
		return nil, fmt.Errorf("artifact %s: blob %q: %w", artifact, blob, err)
	}
	return s.Access.OpenBlob(ctx, repo, d)
}

// ForNode says where a node fetches a blob of the artifact.
func (s RegistrySource) ForNode(ctx context.Context, artifact, blob string) (registry.NodePull, error) {
	repo, _, _ := strings.Cut(artifact, "@")
	d, err := v1.NewHash(blob)
	if err != nil {
		return registry.NodePull{}, fmt.Errorf("artifact %s: blob %q: %w", artifact, blob, err)
	}
	return s.Access.ForNode(ctx, repo, d)
}

// The ways a node gets its files (StageOptions.Via).
const (
	// ViaAuto pulls from the registry on nodes that reach it and pushes
	// over SSH to the others.
	ViaAuto = "auto"
	// ViaRegistry: every node pulls from the registry; a node that cannot
	// is not staged.
	ViaRegistry = "registry"
	// ViaSSH: this machine sends every node its files over SSH.
	ViaSSH = "ssh"
)

// What nodes are handed to pull with (StageOptions.NodeCredentials).
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

// The encodings of a file sent over SSH (StageOptions.Codec).
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

// CheckStageChoice refuses a Via, Codec or NodeCredentials that is none
// of the known ones.
func CheckStageChoice(via, codec, creds string) error {
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

// StageResult reports Stage.
type StageResult struct {
	Version string      `json:"version"`
	Dir     string      `json:"dir"`
	Nodes   []NodeStage `json:"nodes"`
	// WireBytes is what this machine wrote to the nodes over SSH, on the
	// wire (encryption, commands and all), when the connector counts it.
	WireBytes int64 `json:"wireBytes,omitempty"`
	// Took is the wall time (set by StageCluster).
	Took string `json:"took,omitempty"`
}

// BytesSent is the total this machine sent to every node, and the files'
// size.
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
// it, and on control-plane nodes each hop's under StageDir/HOP: pulled by
// the node from the registry where it can (Via), else sent over SSH,
// encoded once per file for every node (Codec); the size and sha256 are
// checked on the node before the file is renamed into place, a file
// already there is skipped (a re-run sends nothing), and one a stage cut
// off is gone on from. One unreachable node is reported and the others
// staged.
func Stage(ctx context.Context, opts StageOptions) (*StageResult, error) {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := CheckStageChoice(opts.Via, opts.Codec, opts.NodeCredentials); err != nil {
		return nil, err
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
	c := &encodedCache{store: &cas.Store{Dir: filepath.Join(opts.CacheDir, "files")}, dir: opts.CacheDir, source: opts.Source, log: log}
	res := &StageResult{Version: version, Dir: dir}
	if w, ok := opts.Connector.(interface{ BytesWritten() int64 }); ok {
		before := w.BytesWritten()
		defer func() { res.WireBytes = w.BytesWritten() - before }()
	}
	var mu sync.Mutex
	byNode := map[string]*NodeStage{}
	for _, t := range opts.Targets {
		byNode[t.Name] = &NodeStage{Node: t.Name}
	}
	failed := nodeaccess.ForEach(ctx, opts.Connector, opts.Targets, opts.Parallel, func(ctx context.Context, t nodeaccess.Target, n nodeaccess.Node) error {
		began := time.Now()
		s := &nodeStager{opts: &opts, n: n, t: t, arch: arch[t.Name], dir: dir, cache: c, ns: &NodeStage{Node: t.Name}}
		if s.arch == "" {
			s.arch = "amd64"
		}
		var err error
		// The hops' files (control-plane nodes only), then the target's.
		for _, h := range opts.Target.Hops {
			if err == nil {
				err = s.stage(ctx, h, HopFilesForKind(opts.Kind, t.Role), h.Version.String()+"/")
			}
		}
		if err == nil {
			err = s.stage(ctx, opts.Target, FilesForKind(opts.Kind, t.Role), "")
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

// StagingPath says how staging would get the node's missing files there
// (ViaRegistry or ViaSSH, and why not the registry), asking the node as
// Stage does, read-only, where it could pull: opts gives Source, Via,
// NodeCredentials, StageDir and Kind. Plan says it for each node that
// lacks files.
func StagingPath(ctx context.Context, n nodeaccess.Node, t nodeaccess.Target, target *Target, arch string, opts StageOptions) (path, reason string, err error) {
	if opts.StageDir == "" {
		opts.StageDir = DefaultStageDir
	}
	s := &nodeStager{opts: &opts, n: n, t: t, arch: arch, dir: opts.StageDir, ns: &NodeStage{Node: t.Name}}
	if s.arch == "" {
		s.arch = "amd64"
	}
	for _, name := range FilesForKind(opts.Kind, t.Role) {
		if f, artifact, ok := target.File(name, s.arch); ok {
			// The node is listed (and its registry probed) only where it
			// could pull; the codec is apply's to choose.
			opts.Codec = CodecGzip
			if _, err := s.choose(ctx, StagePath(opts.StageDir, target.Version.String(), ""), f, artifact, &staged{}); err != nil {
				return "", "", err
			}
			return s.ns.Path, s.ns.PathReason, nil
		}
	}
	return "", "", nil
}

// nodeStager stages one node's files.
type nodeStager struct {
	opts  *StageOptions
	n     nodeaccess.Node
	t     nodeaccess.Target
	arch  string
	dir   string
	cache *encodedCache
	ns    *NodeStage
	zstd  bool // the node has zstd
	// measure: the codec is auto and not yet weighed against the link
	// (measureCodec, on the first file big enough).
	measure bool
}

// staged is what list-staged reports of a version directory and the node.
type staged struct {
	sums     map[string]string // name -> sha256
	partial  map[string]int64  // NAME.SHA256 -> bytes a cut-off stage left
	zstd     bool
	curl     bool
	registry string // the HTTP status of the registry's /v2/ from the node
}

// parseStaged reads list-staged's output; what does not parse is refused,
// naming the node and the line.
func parseStaged(node string, out []byte) (*staged, error) {
	st := &staged{sums: map[string]string{}, partial: map[string]int64{}}
	yes := map[string]bool{"yes": true, "no": false}
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimRight(line, "\r")
		if line == "" {
			continue
		}
		bad := fmt.Errorf("node %s: list-staged: line %q does not parse", node, line)
		if rest, ok := strings.CutPrefix(line, "### "); ok {
			f := strings.Fields(rest)
			switch {
			case len(f) == 3 && f[0] == "partial":
				n, err := strconv.ParseInt(f[2], 10, 64)
				if _, ok := nodefacts.Under("/", f[1]); err != nil || n < 0 || !ok {
					return nil, bad
				}
				st.partial[f[1]] = n
			case len(f) == 2 && (f[0] == "zstd" || f[0] == "curl"):
				v, ok := yes[f[1]]
				if !ok {
					return nil, bad
				}
				if f[0] == "zstd" {
					st.zstd = v
				} else {
					st.curl = v
				}
			case len(f) == 2 && f[0] == "registry" && len(f[1]) == 3 && strings.Trim(f[1], "0123456789") == "":
				st.registry = f[1]
			default:
				return nil, bad
			}
			continue
		}
		// Names sha256sum escaped (a backslash first: a newline or a
		// backslash in them) are not kubelift's and are skipped.
		if strings.HasPrefix(line, "\\") {
			continue
		}
		sum, name, ok := strings.Cut(line, "  ")
		if !ok || len(sum) != 64 || strings.Trim(sum, "0123456789abcdef") != "" || name == "" {
			return nil, bad
		}
		st.sums[name] = sum
	}
	return st, nil
}

// decide picks the node's path (once, at its first listing that could
// pull) and codec. pullable says the files come from a registry the node
// could pull from; header is the credential it would be handed.
func (s *nodeStager) decide(st *staged, pullable bool, header string) error {
	if s.ns.Path != "" {
		return nil
	}
	via := s.opts.Via
	if via == "" {
		via = ViaAuto
	}
	s.ns.Path = ViaSSH
	if via != ViaSSH {
		switch {
		case !pullable:
			s.ns.PathReason = "the files come from a bundle file, not the registry"
		case strings.HasPrefix(header, "Authorization: Basic ") && s.opts.NodeCredentials != NodePasswords:
			s.ns.PathReason = "the registry takes a password, not a pull-only token, and nodes are not handed it (--node-credentials password allows it)"
		case !st.curl:
			s.ns.PathReason = "no curl on the node"
		case st.registry == "":
			s.ns.PathReason = "the node did not say whether it reaches the registry"
		case st.registry == "000":
			s.ns.PathReason = "the registry cannot be reached from the node"
		case st.registry != "200" && st.registry != "401":
			s.ns.PathReason = "the registry answers " + st.registry + " from the node"
		default:
			s.ns.Path = ViaRegistry
		}
		if s.ns.Path != ViaRegistry && via == ViaRegistry {
			return fmt.Errorf("node %s: cannot pull from the registry (%s): stage with --via auto or ssh", s.t.Name, s.ns.PathReason)
		}
	}
	return s.pickCodec(st)
}

// pickCodec chooses what SSH carries to the node, where it needs SSH.
func (s *nodeStager) pickCodec(st *staged) error {
	if s.ns.Path != ViaSSH || s.ns.Codec != "" {
		return nil
	}
	enc := s.opts.Codec
	switch {
	case enc == "" || enc == CodecAuto:
		enc = CodecGzip
		if st.zstd {
			enc = CodecZstd
		}
		s.measure = true
	case enc == CodecZstd && !st.zstd:
		return fmt.Errorf("node %s: --codec zstd, but the node has no zstd to decompress with: use --codec auto or gzip", s.t.Name)
	}
	s.ns.Codec = enc
	return nil
}

// choose picks the node's path the first time a file is missing (st is
// the listing of vdir): where the node could pull, its registry is probed
// from it with a second, read-only listing; f and artifact are the file
// the probe asks for. Once the path is chosen it only picks the codec.
func (s *nodeStager) choose(ctx context.Context, vdir string, f bundle.File, artifact string, st *staged) (*staged, error) {
	s.zstd = st.zstd
	if s.ns.Path != "" {
		return st, s.pickCodec(st)
	}
	puller, pullable := s.opts.Source.(NodePuller)
	pullable = pullable && s.opts.Via != ViaSSH && artifact != ""
	if !pullable {
		return st, s.decide(st, false, "")
	}
	probe, err := puller.ForNode(ctx, artifact, "sha256:"+f.SHA256)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", s.t.Name, err)
	}
	st, err = s.list(ctx, vdir, probe.Base, probe.Host)
	if err != nil {
		return nil, err
	}
	s.zstd = st.zstd
	return st, s.decide(st, true, probe.Header)
}

// list runs list-staged on vdir (with the registry to probe, when given).
func (s *nodeStager) list(ctx context.Context, vdir string, registry ...string) (*staged, error) {
	out, err := s.n.Run(ctx, nodescript.ListStaged.Command(append([]string{vdir}, registry...)...), nil)
	if err != nil {
		return nil, fmt.Errorf("node %s: read %s: %w", s.t.Name, vdir, err)
	}
	return parseStaged(s.t.Name, out)
}

// stage gets the node's missing files of target (names) into
// StageDir/VERSION; a hop's files are named VERSION/NAME in the result.
func (s *nodeStager) stage(ctx context.Context, target *Target, names []string, prefix string) error {
	if len(names) == 0 {
		return nil
	}
	version := target.Version.String()
	var files []bundle.File
	var artifacts []string
	for _, name := range names {
		f, artifact, ok := target.File(name, s.arch)
		if !ok {
			if name == "kube-proxy" || name == "kubectl" {
				continue // optional: not every bundle carries them
			}
			return fmt.Errorf("node %s: the %s bundle has no %s for linux/%s", s.t.Name, version, name, s.arch)
		}
		if _, ok := nodefacts.Under("/", f.Name); !ok {
			return fmt.Errorf("file %s: name %q is not a file name", f.Path, f.Name)
		}
		files = append(files, f)
		artifacts = append(artifacts, artifact)
	}
	vdir := StagePath(s.dir, version, "")
	st, err := s.list(ctx, vdir)
	if err != nil {
		return err
	}
	puller, _ := s.opts.Source.(NodePuller)
	// Once the node takes its files over SSH, the files after the one
	// being sent are fetched and encoded (or their copies fetched) here
	// meanwhile, so that this machine's work overlaps the link's.
	var ahead sync.WaitGroup
	aheadCtx, stopAhead := context.WithCancel(ctx)
	defer ahead.Wait()
	defer stopAhead()
	warming := false
	for i, f := range files {
		s.ns.Bytes += f.Size
		if st.sums[f.Name] == f.SHA256 {
			s.ns.Present = append(s.ns.Present, prefix+f.Name)
			continue
		}
		if s.ns.Path == "" || s.ns.Codec == "" && s.ns.Path == ViaSSH {
			// The first file missing: ask the node how it gets it.
			if st, err = s.choose(ctx, vdir, f, artifacts[i], st); err != nil {
				return err
			}
		}
		have := st.partial[f.Name+"."+f.SHA256]
		if have >= f.Size {
			have = 0
		}
		if s.ns.Path == ViaSSH && s.measure {
			if have > 0 {
				// Going on from a cut-off stage: no probe from the start;
				// the codec stays the node's.
				s.measure = false
				s.ns.CodecReason = "not measured: the stage went on from a file a stage had cut off"
			} else {
				// Before anything is encoded ahead: in which codec.
				probed, err := s.measureCodec(ctx, vdir, f, artifacts[i])
				s.ns.BytesSent += probed
				if err != nil {
					return fmt.Errorf("node %s: stage %s: %w", s.t.Name, prefix+f.Name, err)
				}
				have = probed
			}
		}
		// Nothing is encoded ahead before the codec is known.
		if s.ns.Path == ViaSSH && !warming && !s.measure {
			warming = true
			sums, partial, enc := st.sums, st.partial, s.ns.Codec
			ahead.Add(1)
			go func() {
				defer ahead.Done()
				for j := i + 1; j < len(files); j++ {
					f := files[j]
					if sums[f.Name] == f.SHA256 || partial[f.Name+"."+f.SHA256] > 0 {
						continue // there, or gone on from as it is sent
					}
					// Errors are the sender's to meet and report.
					if _, _, err := s.cache.ready(aheadCtx, f, artifacts[j], enc); err != nil {
						return
					}
				}
			}()
		}
		progress.OrNop(s.opts.Progress).Expect(f.Size)
		if s.ns.Path == ViaRegistry && artifacts[i] != "" {
			err := s.pull(ctx, vdir, f, artifacts[i], puller, have)
			var ee *nodeaccess.ExitError
			switch {
			case err == nil:
				s.ns.Sent = append(s.ns.Sent, prefix+f.Name)
				progress.OrNop(s.opts.Progress).Done(f.Size)
				continue
			case errors.As(err, &ee) && (ee.Code == 69 || ee.Code == 66):
				// The node cannot pull after all: this machine sends the
				// rest. A cut-off pull's bytes are gone on from.
				s.ns.Path, s.ns.PathReason = ViaSSH, nodeReason(ee)
				if st, err = s.list(ctx, vdir); err != nil {
					return err
				}
				if err := s.pickCodec(st); err != nil {
					return err
				}
				if have = st.partial[f.Name+"."+f.SHA256]; have >= f.Size {
					have = 0
				}
			default:
				return fmt.Errorf("node %s: pull %s: %w", s.t.Name, prefix+f.Name, err)
			}
		}
		sent, err := s.send(ctx, vdir, f, artifacts[i], have)
		s.ns.BytesSent += sent
		if err != nil {
			return fmt.Errorf("node %s: stage %s: %w", s.t.Name, prefix+f.Name, err)
		}
		s.ns.Sent = append(s.ns.Sent, prefix+f.Name)
		progress.OrNop(s.opts.Progress).Done(f.Size)
	}
	return nil
}

// nodeReason says why a pull failed on the node: its exit code's meaning
// and the first line it printed, quoted (a node's words are shown, never
// taken as they are).
func nodeReason(ee *nodeaccess.ExitError) string {
	what := map[int]string{69: "the registry cannot be reached from the node", 66: "the registry refused the node's pull"}[ee.Code]
	line, _, _ := strings.Cut(strings.TrimSpace(ee.Stderr), "\n")
	if len(line) > 200 {
		line = line[:200]
	}
	return what + ": " + strconv.Quote(line)
}

// pull has the node fetch f from the registry itself, going on from what
// a cut-off pull left: the zstd copy import pushed beside it where the
// node has zstd (it decodes it and checks what comes out; the file itself
// when that fails), else the file.
func (s *nodeStager) pull(ctx context.Context, vdir string, f bundle.File, artifact string, puller NodePuller, have int64) error {
	if s.zstd {
		blob, size, err := s.cache.zstdCopy(ctx, puller, artifact, f.SHA256)
		if err != nil {
			return err
		}
		if blob != "" {
			err := s.pullBlob(ctx, vdir, f, artifact, puller, blob, CodecZstd, size)
			var ee *nodeaccess.ExitError
			if err == nil || !errors.As(err, &ee) || (ee.Code != 65 && ee.Code != 66) {
				return err
			}
			// A copy that does not decode to the file, or is not there:
			// the file itself.
		}
	}
	return s.pullBlob(ctx, vdir, f, artifact, puller, "sha256:"+f.SHA256, CodecNone, f.Size-have)
}

// pullBlob runs pull-file for one blob of size bytes (the rest to fetch).
func (s *nodeStager) pullBlob(ctx context.Context, vdir string, f bundle.File, artifact string, puller NodePuller, blob, enc string, size int64) error {
	np, err := puller.ForNode(ctx, artifact, blob)
	if err != nil {
		return err
	}
	whole := size
	if enc == CodecNone {
		whole = f.Size
	}
	_, err = s.n.Run(ctx, nodescript.PullFile.Command(vdir, f.Name, f.SHA256, strconv.FormatInt(f.Size, 10), np.URL, np.Host, enc, strconv.FormatInt(whole, 10)),
		strings.NewReader(np.Header+"\n"))
	if err == nil {
		s.ns.BytesPulled += size
	}
	return err
}

// The first bytes of a file measureCodec sends as they are: an eighth of
// the file, within these bounds; smaller files are not measured.
const (
	minProbe = 512 << 10
	maxProbe = 8 << 20
)

// measureCodec weighs the link against this machine's encoding, where the
// codec is auto, on the first file sent big enough to tell: unless its
// zstd copy is relayed from the registry (nothing encoded here: zstd), its
// first bytes go to the node as they are (stage-file keeps them, cut off,
// for the rest to go on from), and the rate they went at is compared with
// the rate this machine encodes them, measured once for every node (it
// encodes each file once for all of them; measured beside the probes, it
// lost to them on a 2-core machine and chose none where zstd was 1.3x
// faster); the faster way sends the rest of the files. It returns the
// bytes sent.
func (s *nodeStager) measureCodec(ctx context.Context, vdir string, f bundle.File, artifact string) (int64, error) {
	enc := s.ns.Codec
	if enc == CodecZstd {
		p, err := s.cache.relayed(ctx, f, artifact)
		if err != nil {
			return 0, err
		}
		if p != "" {
			s.measure = false
			s.ns.CodecReason = "the registry's zstd copies are relayed: nothing is encoded here"
			return 0, nil
		}
	}
	probe := probeSize(f)
	if probe == 0 {
		return 0, nil // the next file, maybe
	}
	s.measure = false
	raw, err := s.cache.raw(ctx, f, artifact)
	if err != nil {
		return 0, err
	}
	defer raw.Close()
	// This machine's rate first: the first node to get here measures it
	// while the others wait, so that no probe runs beside it.
	encode, ratio, err := s.cache.encodeRate(enc, raw, probe)
	if err != nil {
		return 0, err
	}
	// Timed from the first byte SSH takes (the session is open and the
	// command started) to the node's answer.
	in := &firstRead{r: io.NewSectionReader(raw, 0, probe)}
	sent, err := s.stream(ctx, vdir, f, in, CodecNone, 0)
	var ee *nodeaccess.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.Code == 75) { // 75: cut off, as meant
		return sent, err
	}
	if sent != probe {
		return sent, fmt.Errorf("%d of the first %d bytes sent", sent, probe)
	}
	link := float64(probe) / max(time.Since(in.at).Seconds(), 1e-6)
	s.ns.Codec, s.ns.CodecReason = fasterWay(enc, link, encode, ratio)
	return sent, nil
}

// probeSize is how much of f measureCodec sends as it is: an eighth of
// it within [minProbe, maxProbe], the same for every node (so that the
// rest is encoded once for all of them); 0 for a file too small to tell.
func probeSize(f bundle.File) int64 {
	if f.Size < 8*minProbe {
		return 0
	}
	return min(max(f.Size/8, minProbe), maxProbe)
}

// firstRead is a reader that notes when it is first read.
type firstRead struct {
	r  io.Reader
	at time.Time
}

func (f *firstRead) Read(p []byte) (int, error) {
	if f.at.IsZero() {
		f.at = time.Now()
	}
	return f.r.Read(p)
}

// fasterWay is the codec that gets files to the node sooner, the rates in
// bytes per second and ratio enc's encoded size over the size: enc where
// this machine encodes faster than the link carries the files as they
// are and enc makes them smaller (what it saves on the wire is then time
// saved), else none (the link waits for nothing).
func fasterWay(enc string, link, encode, ratio float64) (codecName, reason string) {
	codecName = enc
	if link >= encode || ratio > 0.9 {
		codecName = CodecNone
	}
	return codecName, fmt.Sprintf("measured on the first megabytes: the link took %.0f MB/s as they are; %s encodes %.0f MB/s here, to %.2fx their size", link/1e6, enc, encode/1e6, ratio)
}

// send streams f to the node in the node's codec: the registry's zstd
// copy relayed as it is, or the file encoded here once for every node, or,
// going on from have bytes a cut-off stage left, the rest encoded as it
// goes. A relayed copy the node finds does not decode to the file is
// dropped, and the file sent again from the start, encoded here.
func (s *nodeStager) send(ctx context.Context, vdir string, f bundle.File, artifact string, have int64) (int64, error) {
	sent, err := s.sendFrom(ctx, vdir, f, artifact, have)
	var ee *nodeaccess.ExitError
	if have > 0 && errors.As(err, &ee) && ee.Code == 65 {
		// What a cut-off stage left was not the file's start (a relayed
		// copy that was wrong, cut off); the node removed it.
		again, err := s.sendFrom(ctx, vdir, f, artifact, 0)
		return sent + again, err
	}
	return sent, err
}

// sendFrom sends f from byte have on: whole, as ready has it (a relayed
// copy the node refuses or cuts short is dropped and the file encoded
// here), or the rest after have.
func (s *nodeStager) sendFrom(ctx context.Context, vdir string, f bundle.File, artifact string, have int64) (int64, error) {
	enc := s.ns.Codec
	if have > 0 {
		return s.sendRest(ctx, vdir, f, artifact, have)
	}
	p, relayed, err := s.cache.ready(ctx, f, artifact, enc)
	if err != nil {
		return 0, err
	}
	sent, err := s.sendFile(ctx, vdir, f, p, enc, 0)
	var ee *nodeaccess.ExitError
	if !relayed || !errors.As(err, &ee) || (ee.Code != 65 && ee.Code != 75) {
		return sent, err
	}
	s.cache.dropCopy(f.SHA256, p)
	s.cache.log.Warn("the zstd copy was refused or cut off on the node: encoding the file here", "node", s.t.Name, "file", f.Path, "err", err)
	again, err := s.sendFrom(ctx, vdir, f, artifact, 0)
	return sent + again, err
}

// sendRest sends f from byte have on: where have is where the codec's
// probe stopped, the rest encoded once for every node; else encoded as it
// goes.
func (s *nodeStager) sendRest(ctx context.Context, vdir string, f bundle.File, artifact string, have int64) (int64, error) {
	enc := s.ns.Codec
	if have == probeSize(f) && enc != CodecNone {
		p, err := s.cache.encodedFrom(ctx, f, artifact, enc, have)
		if err != nil {
			return 0, err
		}
		sent, err := s.sendFile(ctx, vdir, f, p, enc, have)
		var ee *nodeaccess.ExitError
		if errors.As(err, &ee) && ee.Code == 65 {
			os.Remove(p) // it may be what was wrong: made again next time
		}
		return sent, err
	}
	raw, err := s.cache.raw(ctx, f, artifact)
	if err != nil {
		return 0, err
	}
	defer raw.Close()
	if _, err := raw.Seek(have, io.SeekStart); err != nil {
		return 0, err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(codec.Encode(pw, raw, enc)) }()
	defer pr.Close()
	return s.stream(ctx, vdir, f, pr, enc, have)
}

// sendFile sends f from byte have on, encoded with enc, from the file at
// p (which holds that, encoded).
func (s *nodeStager) sendFile(ctx context.Context, vdir string, f bundle.File, p, enc string, have int64) (int64, error) {
	file, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer file.Close()
	return s.stream(ctx, vdir, f, file, enc, have)
}

// stream runs stage-file with in (f from byte have on, encoded with enc)
// on stdin, and says how many bytes of in it sent.
func (s *nodeStager) stream(ctx context.Context, vdir string, f bundle.File, in io.Reader, enc string, have int64) (int64, error) {
	cr := iocount.NewReader(in)
	_, err := s.n.Run(ctx, nodescript.StageFile.Command(vdir, f.Name, f.SHA256, strconv.FormatInt(f.Size, 10), enc, strconv.FormatInt(have, 10)), cr)
	return cr.N(), err
}

// encodedCache fetches each file once, checks it, and keeps it encoded in
// each codec asked for, for every node that needs it.
type encodedCache struct {
	store  *cas.Store
	dir    string
	source Source
	mu     sync.Mutex
	locks  map[string]*sync.Mutex
	copies map[string]zstdCopy   // "zstd-copy SHA256" -> the zstd copy in the registry
	bad    map[string]bool       // sha256 -> its copy did not decode to it on a node
	rates  map[string][2]float64 // "rate CODEC" -> bytes per second this machine encodes, and the ratio
	log    *slog.Logger
}

// relayed is the path of the registry's zstd copy of f, fetched once for
// every node (checked against the copy's digest, not opened here: the
// node checks what it decodes to), or "" when the source has no copy to
// relay or a node refused it.
func (c *encodedCache) relayed(ctx context.Context, f bundle.File, artifact string) (string, error) {
	src, ok := c.source.(CopyRelay)
	if !ok || artifact == "" {
		return "", nil
	}
	l := c.lock("relay " + f.SHA256)
	l.Lock()
	defer l.Unlock()
	c.mu.Lock()
	bad := c.bad[f.SHA256]
	c.mu.Unlock()
	if bad {
		return "", nil
	}
	// Encoded here already (import keeps what it pushed): the same bytes,
	// made from the checked file.
	if p := codec.Path(c.dir, CodecZstd, f.SHA256); fileExists(p) {
		return p, nil
	}
	blob, size, err := c.zstdCopy(ctx, src, artifact, f.SHA256)
	if err == nil && blob == "" {
		return "", nil
	}
	var d digest.Digest
	if err == nil {
		d, err = digest.Parse(blob)
	}
	if err == nil && size > f.Size+f.Size/16+1<<20 {
		err = fmt.Errorf("%d bytes for a file of %d: not a zstd copy of it", size, f.Size)
	}
	if err == nil && !c.store.Has(d, size) {
		var rc io.ReadCloser
		if rc, err = src.OpenCopy(ctx, artifact, blob); err == nil {
			_, err = c.store.Put(d, size, io.LimitReader(rc, size+1))
			rc.Close()
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return "", context.Cause(ctx)
		}
		// The copy is a shortcut: without it the file is encoded here.
		c.log.Warn("the registry's zstd copy could not be fetched: encoding the file here", "file", f.Path, "copy", blob, "err", err)
		c.dropCopy(f.SHA256, "")
		return "", nil
	}
	return c.store.Path(d), nil
}

// dropCopy stops relaying the zstd copy of the file with sha256 sum, and
// removes it from this machine, at path p when given.
func (c *encodedCache) dropCopy(sum, p string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bad == nil {
		c.bad = map[string]bool{}
	}
	c.bad[sum] = true
	if p != "" {
		os.Remove(p)
	}
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// ready is the path of f in enc, to send whole: the zstd copy to relay
// (relayed) where there is one, else the file encoded here.
func (c *encodedCache) ready(ctx context.Context, f bundle.File, artifact, enc string) (p string, relayed bool, err error) {
	if enc == CodecZstd {
		if p, err := c.relayed(ctx, f, artifact); err != nil || p != "" {
			return p, p != "", err
		}
	}
	p, err = c.encoded(ctx, f, artifact, enc)
	return p, false, err
}

// encodeRate is this machine's rate of encoding with enc, in bytes per
// second, and the encoded size over the size, measured once, on the
// first n bytes of r.
func (c *encodedCache) encodeRate(enc string, r io.ReaderAt, n int64) (rate, ratio float64, err error) {
	m, err := remember(c, &c.rates, "rate "+enc, func() ([2]float64, error) {
		var out discardCounter
		began := time.Now()
		if err := codec.Encode(&out, io.NewSectionReader(r, 0, n), enc); err != nil {
			return [2]float64{}, err
		}
		return [2]float64{float64(n) / max(time.Since(began).Seconds(), 1e-6), float64(out) / float64(n)}, nil
	})
	return m[0], m[1], err
}

// discardCounter counts what is written to it, and keeps none of it.
type discardCounter int64

func (d *discardCounter) Write(p []byte) (int, error) {
	*d += discardCounter(len(p))
	return len(p), nil
}

type zstdCopy struct {
	blob string
	size int64
}

// zstdCopy looks the file's zstd copy up in the registry once for every
// node.
func (c *encodedCache) zstdCopy(ctx context.Context, puller NodePuller, artifact, sum string) (string, int64, error) {
	z, err := remember(c, &c.copies, "zstd-copy "+sum, func() (zstdCopy, error) {
		blob, size, err := puller.ZstdCopy(ctx, artifact, sum)
		return zstdCopy{blob, size}, err
	})
	return z.blob, z.size, err
}

// remember is what compute made for key in *m, made once for every
// caller (they wait for the first); an error is not remembered.
func remember[T any](c *encodedCache, m *map[string]T, key string, compute func() (T, error)) (T, error) {
	l := c.lock(key)
	l.Lock()
	defer l.Unlock()
	c.mu.Lock()
	v, ok := (*m)[key]
	c.mu.Unlock()
	if ok {
		return v, nil
	}
	v, err := compute()
	if err != nil {
		return v, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if *m == nil {
		*m = map[string]T{}
	}
	(*m)[key] = v
	return v, nil
}

func (c *encodedCache) lock(key string) *sync.Mutex {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.locks == nil {
		c.locks = map[string]*sync.Mutex{}
	}
	if c.locks[key] == nil {
		c.locks[key] = &sync.Mutex{}
	}
	return c.locks[key]
}

// raw opens the file, fetched and checked against its sha256 once.
func (c *encodedCache) raw(ctx context.Context, f bundle.File, artifact string) (*os.File, error) {
	l := c.lock(f.SHA256)
	l.Lock()
	defer l.Unlock()
	d := digest.NewDigestFromEncoded(digest.SHA256, f.SHA256)
	if !c.store.Has(d, f.Size) {
		rc, err := c.source.Open(ctx, f, artifact)
		if err != nil {
			return nil, fmt.Errorf("file %s: %w", f.Path, err)
		}
		_, err = c.store.Put(d, f.Size, rc)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("file %s: %w", f.Path, err)
		}
	}
	return c.store.Open(d)
}

// encodedFrom is the path of f from byte off on (the whole file at 0),
// encoded with enc, once for every node.
func (c *encodedCache) encodedFrom(ctx context.Context, f bundle.File, artifact, enc string, off int64) (string, error) {
	raw, err := c.raw(ctx, f, artifact)
	if err != nil {
		return "", err
	}
	defer raw.Close()
	key := f.SHA256
	if off > 0 {
		key = fmt.Sprintf("%s-from-%d", f.SHA256, off)
	}
	l := c.lock(key + "." + enc)
	l.Lock()
	defer l.Unlock()
	p, err := codec.Cached(c.dir, enc, key, func() (io.ReadCloser, error) {
		return io.NopCloser(io.NewSectionReader(raw, off, f.Size-off)), nil
	})
	if err != nil {
		return "", fmt.Errorf("file %s: %w", f.Path, err)
	}
	return p, nil
}

// encoded is the path of the file encoded with codec (the raw file for
// CodecNone).
func (c *encodedCache) encoded(ctx context.Context, f bundle.File, artifact, enc string) (string, error) {
	if enc != CodecNone {
		return c.encodedFrom(ctx, f, artifact, enc, 0)
	}
	raw, err := c.raw(ctx, f, artifact)
	if err != nil {
		return "", err
	}
	defer raw.Close()
	return raw.Name(), nil
}
