package stage

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/progress"
)

// nodeStager stages one node's files.
type nodeStager struct {
	opts  *Options
	n     nodeaccess.Node
	t     nodeaccess.Address
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
			return fmt.Errorf("node %s: cannot pull from the registry (%s): let it reach the registry, or stage it over SSH (--via auto or ssh)", s.t.Name, s.ns.PathReason)
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
func (s *nodeStager) stage(ctx context.Context, target *release.Release, names []string, prefix string) error {
	if len(names) == 0 {
		return nil
	}
	files, artifacts, err := s.filesOf(target, names)
	if err != nil {
		return err
	}
	vdir := release.StagePath(s.dir, target.Version.String(), "")
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
			ahead.Add(1)
			go s.encodeAhead(aheadCtx, &ahead, files[i+1:], artifacts[i+1:], st, s.ns.Codec)
		}
		progress.OrNop(s.opts.Progress).Expect(f.Size)
		if s.ns.Path == ViaRegistry && artifacts[i] != "" {
			pulled, err := s.pullOrFallBack(ctx, vdir, f, artifacts[i], puller, &have, &st, prefix)
			if err != nil {
				return err
			}
			if pulled {
				continue
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

// filesOf are the release's files names says this node gets, for its
// architecture, and each one's artifact in the registry.
func (s *nodeStager) filesOf(target *release.Release, names []string) ([]bundle.File, []string, error) {
	var files []bundle.File
	var artifacts []string
	for _, name := range names {
		f, artifact, ok := target.File(name, s.arch)
		if !ok {
			if name == "kube-proxy" || name == "kubectl" {
				continue // optional: not every bundle carries them
			}
			return nil, nil, fmt.Errorf("node %s: the %s bundle has no %s for linux/%s", s.t.Name, target.Version, name, s.arch)
		}
		if _, ok := nodefacts.Under("/", f.Name); !ok {
			return nil, nil, fmt.Errorf("file %s: name %q is not a file name", f.Path, f.Name)
		}
		files = append(files, f)
		artifacts = append(artifacts, artifact)
	}
	return files, artifacts, nil
}

// encodeAhead fetches and encodes in enc (or fetches the copies of) the
// files still to be sent while the one before them goes over the link,
// so that this machine's work overlaps the link's; st is what the node
// had, read before. Errors are the sender's to meet and report.
func (s *nodeStager) encodeAhead(ctx context.Context, wg *sync.WaitGroup, files []bundle.File, artifacts []string, st *staged, enc string) {
	defer wg.Done()
	for j, f := range files {
		if st.sums[f.Name] == f.SHA256 || st.partial[f.Name+"."+f.SHA256] > 0 {
			continue // there, or gone on from as it is sent
		}
		if _, _, err := s.cache.ready(ctx, f, artifacts[j], enc); err != nil {
			return
		}
	}
}

// pullOrFallBack has the node pull f; a node that cannot reach the
// registry, or is refused by it, turns to SSH for the rest (pulled
// false), going on from what a cut-off pull left (have, st updated).
func (s *nodeStager) pullOrFallBack(ctx context.Context, vdir string, f bundle.File, artifact string, puller NodePuller, have *int64, st **staged, prefix string) (pulled bool, err error) {
	err = s.pull(ctx, vdir, f, artifact, puller, *have)
	var ee *nodeaccess.ExitError
	switch {
	case err == nil:
		s.ns.Sent = append(s.ns.Sent, prefix+f.Name)
		progress.OrNop(s.opts.Progress).Done(f.Size)
		return true, nil
	case errors.As(err, &ee) && (ee.Code == nodescript.ExitUnavailable || ee.Code == nodescript.ExitNoInput):
		s.ns.Path, s.ns.PathReason = ViaSSH, nodeReason(ee)
		if *st, err = s.list(ctx, vdir); err != nil {
			return false, err
		}
		if err := s.pickCodec(*st); err != nil {
			return false, err
		}
		if *have = (*st).partial[f.Name+"."+f.SHA256]; *have >= f.Size {
			*have = 0
		}
		return false, nil
	}
	return false, fmt.Errorf("node %s: pull %s: %w", s.t.Name, prefix+f.Name, err)
}

// nodeReason says why a pull failed on the node: its exit code's meaning
// and the first line it printed, quoted (a node's words are shown, never
// taken as they are).
func nodeReason(ee *nodeaccess.ExitError) string {
	what := map[int]string{nodescript.ExitUnavailable: "the registry cannot be reached from the node", nodescript.ExitNoInput: "the registry refused the node's pull"}[ee.Code]
	line, _, _ := strings.Cut(strings.TrimSpace(ee.Stderr), "\n")
	if len(line) > 200 {
		line = line[:200]
	}
	return what + ": " + strconv.Quote(line)
}
