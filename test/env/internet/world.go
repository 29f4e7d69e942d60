package internet

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubelift/kubelift/internal/catalog"
)

// ImageShape says how big the seeded images are.
type ImageShape struct {
	Arches []string
	// BaseBytes is one base layer per arch shared by every image.
	BaseBytes int
	// UniqueBytes is each image's own layer.
	UniqueBytes int
	// ExtraImages adds images named kubelift/extra-N:v1 (the catalog's
	// images come first).
	ExtraImages int
}

// Seed pushes an image for every reference (as multi-arch indexes, the way
// registry.k8s.io serves them) to host, which is reached over plain HTTP.
// It returns the upstream digest of each reference, keyed by the reference
// as written after the registry host. opts are added to every push (a
// transport that dials into a namespace, say).
//
// Up to four repositories are pushed at once, but one repository's tags
// in turn: every image shares its arch's base layer, and docker-registry
// rewrites a repository's link to a blob in place, so a manifest put while
// another push of the same blob into the same repository rewrites that
// link can be refused (DIGEST_INVALID, MANIFEST_BLOB_UNKNOWN: one sandbox
// run seeding kube-apiserver at a hop's tag and the target's). kubelift's
// own push never does so: it puts each (repository, blob) pair once, and
// the manifests after every blob.
func Seed(ctx context.Context, host string, repos []string, shape ImageShape, opts ...remote.Option) (map[string]string, error) {
	if len(shape.Arches) == 0 {
		shape.Arches = []string{"amd64"}
	}
	bases := map[string]v1.Layer{}
	for i, arch := range shape.Arches {
		bases[arch] = static.NewLayer(pseudoRandom(uint64(1000+i), shape.BaseBytes), types.DockerLayer)
	}
	// The references of each repository, in the order given; n is a
	// reference's place in repos, which seeds its own layer.
	type tagged struct {
		n    int
		repo string
	}
	var order []string
	byRepo := map[string][]tagged{}
	for n, repo := range repos {
		ref, err := name.ParseReference(host+"/"+repo, name.Insecure)
		if err != nil {
			return nil, err
		}
		r := ref.Context().String()
		if _, ok := byRepo[r]; !ok {
			order = append(order, r)
		}
		byRepo[r] = append(byRepo[r], tagged{n, repo})
	}
	digests := map[string]string{}
	var mu sync.Mutex
	errs := make(chan error, len(order))
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for _, r := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			for _, t := range byRepo[r] {
				d, err := seedOne(ctx, host, t.repo, t.n, shape, bases, opts)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				digests[t.repo] = d
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return digests, nil
}

// seedOne pushes repo (the n-th reference Seed was given) as a multi-arch
// index and returns the index's digest.
func seedOne(ctx context.Context, host, repo string, n int, shape ImageShape, bases map[string]v1.Layer, opts []remote.Option) (string, error) {
	idx := v1.ImageIndex(empty.Index)
	for i, arch := range shape.Arches {
		top := static.NewLayer(pseudoRandom(uint64(n*100+i), shape.UniqueBytes), types.DockerLayer)
		img, err := mutate.AppendLayers(empty.Image, bases[arch], top)
		if err != nil {
			return "", err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return "", err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", arch
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return "", err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	idx = mutate.IndexMediaType(idx, types.DockerManifestList)
	ref, err := name.ParseReference(host+"/"+repo, name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.WriteIndex(ref, idx, append([]remote.Option{remote.WithContext(ctx)}, opts...)...); err != nil {
		return "", fmt.Errorf("seed %s: %w", ref, err)
	}
	d, err := idx.Digest()
	if err != nil {
		return "", err
	}
	return d.String(), nil
}

// ReleaseRepos returns the catalog release's images as paths below
// registry.k8s.io (kube-apiserver:v1.31.4, coredns/coredns:v1.11.3, ...).
func ReleaseRepos(r *catalog.Release) []string {
	var out []string
	for _, im := range r.Images {
		out = append(out, strings.TrimPrefix(im, "registry.k8s.io/"))
	}
	return out
}

// pseudoRandom returns n deterministic, incompressible bytes.
func pseudoRandom(seed uint64, n int) []byte {
	r := rand.New(rand.NewChaCha8(sha256.Sum256(binary.LittleEndian.AppendUint64(nil, seed))))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}

// FileServer serves files at URL paths /HOST/PATH (so https://dl.k8s.io/x
// is http://ADDR/dl.k8s.io/x after --url-mirror) with a .sha256 beside each.
type FileServer struct {
	URL     string
	srv     *http.Server
	mu      sync.Mutex
	content map[string][]byte
	hits    map[string]int
}

// StartFileServer serves nothing until Add is called.
func StartFileServer() (*FileServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	fs := &FileServer{URL: "http://" + ln.Addr().String(), content: map[string][]byte{}, hits: map[string]int{}}
	fs.srv = &http.Server{Handler: http.HandlerFunc(fs.serve)}
	go func() { _ = fs.srv.Serve(ln) }()
	return fs, nil
}

func (fs *FileServer) serve(w http.ResponseWriter, r *http.Request) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if base, ok := strings.CutSuffix(r.URL.Path, ".sha256"); ok {
		if c, ok := fs.content[base]; ok {
			fmt.Fprintf(w, "%x\n", sha256.Sum256(c))
			return
		}
	}
	c, ok := fs.content[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	fs.hits[r.URL.Path]++
	w.Header().Set("Content-Length", fmt.Sprint(len(c)))
	_, _ = w.Write(c)
}

// Add serves content at the mirrored location of upstream URL u.
func (fs *FileServer) Add(u string, content []byte) {
	pu, err := url.Parse(u)
	if err != nil {
		panic(err)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.content["/"+pu.Host+pu.Path] = content
}

// Hits returns how often upstream URL u was downloaded.
func (fs *FileServer) Hits(u string) int {
	pu, _ := url.Parse(u)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.hits["/"+pu.Host+pu.Path]
}

// Mirror returns the --url-mirror value for an upstream host.
func (fs *FileServer) Mirror(host string) string {
	return "https://" + host + "=" + fs.URL + "/" + host
}

// Close stops the server.
func (fs *FileServer) Close() { _ = fs.srv.Close() }

// AddRelease serves every file of the release for the arches, size bytes
// each (deterministic content), and returns the --url-mirror flags needed.
func (fs *FileServer) AddRelease(r *catalog.Release, arches []string, size int) []string {
	hosts := map[string]bool{}
	for ai, arch := range arches {
		for fi, f := range r.Files {
			u := f.URLFor(arch)
			fs.Add(u, pseudoRandom(uint64(50000+ai*100+fi), size))
			pu, _ := url.Parse(u)
			hosts[pu.Host] = true
		}
	}
	var mirrors []string
	for h := range hosts {
		mirrors = append(mirrors, fs.Mirror(h))
	}
	return mirrors
}
