package stage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/codec"
	"github.com/kubelift/kubelift/internal/iocount"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodescript"
)

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
			if !exited(err, nodescript.ExitDataErr, nodescript.ExitNoInput) {
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
	if err != nil && !exited(err, nodescript.ExitTempFail) { // cut off, as meant
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
	if have > 0 && exited(err, nodescript.ExitDataErr) {
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
	if !relayed || !exited(err, nodescript.ExitDataErr, nodescript.ExitTempFail) {
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
		if exited(err, nodescript.ExitDataErr) {
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

// exited says whether err is a node script's exit with one of codes.
func exited(err error, codes ...int) bool {
	var ee *nodeaccess.ExitError
	return errors.As(err, &ee) && slices.Contains(codes, ee.Code)
}
