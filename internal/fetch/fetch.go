// Package fetch downloads binaries over HTTP(S) into the content-addressed
// cache, checking each against a pinned sha256 or the checksum file its
// upstream publishes beside it, so a re-run downloads only what is missing.
package fetch

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/kubelift/kubelift/internal/cas"
	"github.com/kubelift/kubelift/internal/parallel"
	"github.com/kubelift/kubelift/internal/progress"
	"k8s.io/apimachinery/pkg/util/wait"
)

// File is one download. SHA256 may be empty before Fetch; afterwards it
// and Size describe what is in the cache.
type File struct {
	URL    string
	SHA256 string
	Size   int64
}

// Fetcher downloads Files into Store.
type Fetcher struct {
	Store    *cas.Store
	Client   *http.Client
	Jobs     int
	Progress progress.Sink
	// Backoff says how often a download is tried (Steps) and how long
	// to wait between tries; the zero one is 3 tries, 0.5 s then 1 s
	// apart.
	Backoff wait.Backoff
	// MaxSize bounds a download whose size neither the File nor the
	// server says (DefaultMaxSize when 0); one whose size is known is
	// read no further than that.
	MaxSize int64
}

// DefaultMaxSize bounds a download of unknown size: a Kubernetes server
// binary is a few hundred MB, the largest archive a bundle carries less.
const DefaultMaxSize = 4 << 30

// ErrTooLarge means a download went past its bound.
var ErrTooLarge = errors.New("larger than allowed")

var hexRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ErrChecksum means the content or its checksum file was wrong.
var ErrChecksum = errors.New("checksum mismatch")

// Fetch makes every file present in the cache, verified.
func (f *Fetcher) Fetch(ctx context.Context, files []*File) error {
	// Checksums first: small requests that decide what is already cached.
	if err := parallel.ForEach(ctx, f.Jobs, len(files), func(ctx context.Context, i int) error {
		if files[i].SHA256 != "" {
			return nil
		}
		sum, err := f.checksum(ctx, files[i].URL)
		if err != nil {
			return err
		}
		files[i].SHA256 = sum
		return nil
	}); err != nil {
		return err
	}
	sink := progress.OrNop(f.Progress)
	var todo []*File
	for _, file := range files {
		if !hexRE.MatchString(file.SHA256) {
			return fmt.Errorf("%s: sha256 %q is not 64 lowercase hex digits", file.URL, file.SHA256)
		}
		d := digest.NewDigestFromEncoded(digest.SHA256, file.SHA256)
		if fi, err := statStore(f.Store, d); err == nil {
			file.Size = fi
			continue
		}
		todo = append(todo, file)
	}
	return parallel.ForEach(ctx, f.Jobs, len(todo), func(ctx context.Context, i int) error {
		file := todo[i]
		d := digest.NewDigestFromEncoded(digest.SHA256, file.SHA256)
		return f.retry(ctx, file.URL, func() error {
			resp, err := f.get(ctx, file.URL)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if resp.ContentLength > 0 {
				sink.Expect(resp.ContentLength)
			}
			// The size the File says, else the server's (Go's client reads
			// no further than it); else the bound.
			size := int64(-1)
			var body io.Reader = &progress.Reader{R: resp.Body, Sink: sink}
			switch {
			case file.Size > 0:
				size = file.Size
			case resp.ContentLength >= 0:
				size = resp.ContentLength
			default:
				body = &boundedReader{r: body, left: cmp.Or(f.MaxSize, DefaultMaxSize)}
			}
			n, err := f.Store.Put(d, size, body)
			if errors.Is(err, ErrTooLarge) {
				return permanent{fmt.Errorf("%s: %w: more than %d bytes", file.URL, ErrTooLarge, cmp.Or(f.MaxSize, DefaultMaxSize))}
			}
			if errors.Is(err, cas.ErrDigestMismatch) {
				return permanent{fmt.Errorf("%s: %w: %v", file.URL, ErrChecksum, err)}
			}
			if err != nil {
				return fmt.Errorf("%s: %w", file.URL, err)
			}
			file.Size = n
			return nil
		})
	})
}

// boundedReader fails with ErrTooLarge once more than left bytes were
// read.
type boundedReader struct {
	r    io.Reader
	left int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, ErrTooLarge
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n, ErrTooLarge
	}
	return n, err
}

func statStore(s *cas.Store, d digest.Digest) (int64, error) {
	f, err := s.Open(d)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// checksum reads URL.sha256: either the bare hex digest or "hex  filename".
// A local file (file://) is hashed instead.
func (f *Fetcher) checksum(ctx context.Context, url string) (string, error) {
	if path, ok := strings.CutPrefix(url, "file://"); ok {
		file, err := os.Open(path)
		if err != nil {
			return "", permanent{err}
		}
		defer file.Close()
		h := sha256.New()
		if _, err := io.Copy(h, file); err != nil {
			return "", permanent{fmt.Errorf("%s: %w", path, err)}
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	}
	var sum string
	err := f.retry(ctx, url+".sha256", func() error {
		resp, err := f.get(ctx, url+".sha256")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if err != nil {
			return fmt.Errorf("%s.sha256: %w", url, err)
		}
		fields := strings.Fields(string(body))
		if len(fields) == 0 || !hexRE.MatchString(strings.ToLower(fields[0])) {
			return permanent{fmt.Errorf("%s.sha256: %w: not a sha256 checksum file", url, ErrChecksum)}
		}
		sum = strings.ToLower(fields[0])
		return nil
	})
	return sum, err
}

func (f *Fetcher) get(ctx context.Context, url string) (*http.Response, error) {
	if path, ok := strings.CutPrefix(url, "file://"); ok {
		file, err := os.Open(path)
		if err != nil {
			return nil, permanent{err}
		}
		fi, err := file.Stat()
		if err != nil {
			file.Close()
			return nil, permanent{err}
		}
		return &http.Response{StatusCode: http.StatusOK, Body: file, ContentLength: fi.Size()}, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, permanent{err}
	}
	client := f.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		err := fmt.Errorf("%s: HTTP %s", url, resp.Status)
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
			return nil, err
		}
		return nil, permanent{err}
	}
	return resp, nil
}

// permanent marks an error that retrying cannot fix.
type permanent struct{ error }

func (p permanent) Unwrap() error { return p.error }

func (f *Fetcher) retry(ctx context.Context, what string, fn func() error) error {
	b := f.Backoff
	if b.Steps < 1 {
		b = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Steps: 3}
	}
	steps := b.Steps
	var last error
	err := wait.ExponentialBackoffWithContext(ctx, b, func(ctx context.Context) (bool, error) {
		if last = fn(); last == nil {
			return true, nil
		}
		var p permanent
		if errors.As(last, &p) {
			return false, p.error
		}
		if ctx.Err() != nil {
			return false, last
		}
		return false, nil
	})
	if errors.Is(err, wait.ErrWaitTimeout) {
		return fmt.Errorf("after %d attempts: %w", steps, last)
	}
	return err
}
