package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubelift/kubelift/internal/parallel"
	"github.com/kubelift/kubelift/internal/progress"
)

// RawManifest is a manifest pushed byte for byte as upstream wrote it.
type RawManifest struct {
	Digest    v1.Hash
	MediaType types.MediaType
	Raw       []byte
}

// PushImage is one image to push.
type PushImage struct {
	// Ref is the upstream reference, for messages.
	Ref string
	// Target is where the image goes: a tag, or a digest.
	Target name.Reference
	// Manifests are pushed in order, by digest, except the last, which is
	// pushed by Target (children first, the manifest Target names last).
	Manifests []RawManifest
	// Blobs are every config and layer the manifests reference.
	Blobs []v1.Descriptor
}

// Root is the manifest Target resolves to.
func (im *PushImage) Root() RawManifest { return im.Manifests[len(im.Manifests)-1] }

// BlobSource supplies blob content by digest.
type BlobSource interface {
	OpenBlob(d v1.Hash) (io.Reader, error)
}

// Blob actions, in the order of preference.
const (
	ActionPresent = "present" // the target repository has it
	ActionMount   = "mount"   // another repository of the registry has it
	ActionUpload  = "upload"
)

// ImagePlan says what pushing one image will do.
type ImagePlan struct {
	Image           *PushImage
	Present         int
	Mounted         int
	Uploaded        int
	UploadBytes     int64
	ManifestPresent bool // Target already resolves to the right digest
}

// PushPlan is the outcome of Plan: what is there, what to send.
type PushPlan struct {
	Images []*ImagePlan
	steps  []blobStep
}

type blobStep struct {
	repo   name.Repository
	desc   v1.Descriptor
	action string
	from   name.Repository // for mounts
}

// Pusher pushes images to a registry, sending only what it lacks.
type Pusher struct {
	Access   Access
	Source   BlobSource
	Jobs     int
	Progress progress.Sink
	// Retry governs broken uploads.
	Retry
	// ImageDone, if set, is called (from any goroutine) as each image is
	// complete in the registry.
	ImageDone func(*ImagePlan)

	transports transports
	repos      []name.Repository // every target repository, for mount scopes
}

// Plan asks the registry which blobs and manifests it already has and
// decides, per blob and repository, to skip, mount or upload. It changes
// nothing in the registry.
func (p *Pusher) Plan(ctx context.Context, imgs []*PushImage) (*PushPlan, error) {
	type key struct {
		repo   string
		digest v1.Hash
	}
	seenRepo := map[string]bool{}
	for _, im := range imgs {
		if r := im.Target.Context(); !seenRepo[r.String()] {
			seenRepo[r.String()] = true
			p.repos = append(p.repos, r)
		}
	}
	// HEAD every (repository, blob) pair once.
	var keys []key
	descs := map[v1.Hash]v1.Descriptor{}
	repoOf := map[string]name.Repository{}
	have := map[key]bool{}
	for _, im := range imgs {
		repo := im.Target.Context()
		repoOf[repo.String()] = repo
		for _, b := range im.Blobs {
			k := key{repo.String(), b.Digest}
			if _, dup := have[k]; dup {
				continue
			}
			have[k] = false
			keys = append(keys, k)
			descs[b.Digest] = b
		}
	}
	var mu sync.Mutex
	if err := parallel.ForEach(ctx, p.Jobs, len(keys), func(ctx context.Context, i int) error {
		k := keys[i]
		ok, err := p.blobExists(ctx, repoOf[k.repo], k.digest)
		if err != nil {
			return err
		}
		mu.Lock()
		have[k] = ok
		mu.Unlock()
		return nil
	}); err != nil {
		return nil, err
	}
	manifestOK := make([]bool, len(imgs))
	if err := parallel.ForEach(ctx, p.Jobs, len(imgs), func(ctx context.Context, i int) error {
		d, err := p.ManifestDigest(ctx, imgs[i].Target)
		if err != nil {
			return err
		}
		manifestOK[i] = d == imgs[i].Root().Digest
		return nil
	}); err != nil {
		return nil, err
	}

	plan := &PushPlan{}
	holder := map[v1.Hash]name.Repository{} // a repository that has (or will have) the blob
	for _, k := range keys {
		if have[k] {
			if _, ok := holder[k.digest]; !ok {
				holder[k.digest] = repoOf[k.repo]
			}
		}
	}
	stepOf := map[key]string{}
	for _, k := range keys {
		repo := repoOf[k.repo]
		switch from, ok := holder[k.digest]; {
		case have[k]:
			stepOf[k] = ActionPresent
		case ok:
			stepOf[k] = ActionMount
			plan.steps = append(plan.steps, blobStep{repo: repo, desc: descs[k.digest], action: ActionMount, from: from})
		default:
			stepOf[k] = ActionUpload
			holder[k.digest] = repo
			plan.steps = append(plan.steps, blobStep{repo: repo, desc: descs[k.digest], action: ActionUpload})
		}
	}
	counted := map[key]bool{}
	for i, im := range imgs {
		ip := &ImagePlan{Image: im, ManifestPresent: manifestOK[i]}
		for _, b := range im.Blobs {
			k := key{im.Target.Context().String(), b.Digest}
			if counted[k] { // the same blob twice in one repository counts once
				continue
			}
			counted[k] = true
			switch stepOf[k] {
			case ActionPresent:
				ip.Present++
			case ActionMount:
				ip.Mounted++
			case ActionUpload:
				ip.Uploaded++
				ip.UploadBytes += b.Size
			}
		}
		plan.Images = append(plan.Images, ip)
	}
	return plan, nil
}

// Push carries out a plan: uploads, then mounts (which need the uploads),
// then manifests, children before the manifests that list them.
func (p *Pusher) Push(ctx context.Context, plan *PushPlan) error {
	sink := progress.OrNop(p.Progress)
	var uploads, mounts []blobStep
	for _, s := range plan.steps {
		if s.action == ActionUpload {
			uploads = append(uploads, s)
			sink.Expect(s.desc.Size)
		} else {
			mounts = append(mounts, s)
		}
	}
	// Largest first, so the last wave is not one big blob alone.
	sort.SliceStable(uploads, func(i, j int) bool { return uploads[i].desc.Size > uploads[j].desc.Size })
	for _, batch := range [][]blobStep{uploads, mounts} {
		if err := parallel.ForEach(ctx, p.Jobs, len(batch), func(ctx context.Context, i int) error {
			return p.pushBlob(ctx, batch[i], sink)
		}); err != nil {
			return err
		}
	}
	return parallel.ForEach(ctx, p.Jobs, len(plan.Images), func(ctx context.Context, i int) error {
		ip := plan.Images[i]
		if ip.ManifestPresent {
			if p.ImageDone != nil {
				p.ImageDone(ip)
			}
			return nil
		}
		im := ip.Image
		for j, m := range im.Manifests {
			ref := name.Reference(im.Target.Context().Digest(m.Digest.String()))
			if j == len(im.Manifests)-1 {
				ref = im.Target
			}
			if err := p.putManifest(ctx, ref, m); err != nil {
				return fmt.Errorf("image %s: %w", im.Ref, err)
			}
		}
		if p.ImageDone != nil {
			p.ImageDone(ip)
		}
		return nil
	})
}

// Check resolves every image's Target, and its digest, in the registry. It
// returns nil only when every image was checked and resolves to the expected
// digest; otherwise one error per image, each naming it, joined. An image
// left unchecked because the check was cut short (cancelled, or the pool
// stopped) counts as failed.
func (p *Pusher) Check(ctx context.Context, imgs []*PushImage) error {
	errs := make([]error, len(imgs))
	for i, im := range imgs {
		errs[i] = fmt.Errorf("%s: %w", im.Target, errNotChecked)
	}
	stopped := parallel.ForEach(ctx, p.Jobs, len(imgs), func(ctx context.Context, i int) error {
		errs[i] = p.checkOne(ctx, imgs[i])
		return nil
	})
	if stopped != nil {
		for i := range errs {
			if errors.Is(errs[i], errNotChecked) {
				errs[i] = fmt.Errorf("%w (%w)", errs[i], stopped)
			}
		}
	}
	return errors.Join(errs...)
}

// errNotChecked marks an image the check did not reach.
var errNotChecked = errors.New("not checked")

func (p *Pusher) checkOne(ctx context.Context, im *PushImage) error {
	want := im.Root().Digest
	got, err := p.ManifestDigest(ctx, im.Target)
	switch {
	case err != nil:
		return err // names the reference
	case got == v1.Hash{}:
		return fmt.Errorf("%s: not in the registry", im.Target)
	case got != want:
		return fmt.Errorf("%s resolves to %s, want %s", im.Target, got, want)
	}
	byDigest := im.Target.Context().Digest(want.String())
	switch d, err := p.ManifestDigest(ctx, byDigest); {
	case err != nil:
		return err
	case d != want:
		return fmt.Errorf("%s does not resolve", byDigest)
	}
	return nil
}

// ManifestDigest returns the digest ref resolves to, or a zero Hash when
// the registry does not have it.
func (p *Pusher) ManifestDigest(ctx context.Context, ref name.Reference) (v1.Hash, error) {
	repo := ref.Context()
	resp, err := p.do(ctx, repo, http.MethodHead, p.url(repo, "manifests/"+ref.Identifier()), nil, 0, map[string]string{
		"Accept": strings.Join([]string{string(types.OCIImageIndex), string(types.OCIManifestSchema1), string(types.DockerManifestList), string(types.DockerManifestSchema2)}, ","),
	})
	if err != nil {
		return v1.Hash{}, Explain(ref.String(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return v1.Hash{}, nil
	}
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		return v1.Hash{}, Explain(ref.String(), err)
	}
	h, err := v1.NewHash(resp.Header.Get("Docker-Content-Digest"))
	if err != nil {
		return v1.Hash{}, fmt.Errorf("%s: registry sent no usable Docker-Content-Digest: %w", ref, err)
	}
	return h, nil
}

func (p *Pusher) blobExists(ctx context.Context, repo name.Repository, d v1.Hash) (bool, error) {
	ref := repo.Digest(d.String()).String()
	resp, err := p.do(ctx, repo, http.MethodHead, p.url(repo, "blobs/"+d.String()), nil, 0, nil)
	if err != nil {
		return false, Explain(ref, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return false, nil
	}
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		return false, Explain(ref, err)
	}
	return true, nil
}

// pushBlob mounts or uploads one blob, retrying transfers that break.
func (p *Pusher) pushBlob(ctx context.Context, s blobStep, sink progress.Sink) error {
	ref := s.repo.Digest(s.desc.Digest.String()).String()
	err := p.Retry.run(ctx, func() error { return p.tryPushBlob(ctx, s, sink) }, func(err error) bool {
		// A 4xx answer (but 429) is final; 5xx, 429 and broken connections
		// are not. Nor is a source that says so (a bundle entry that is
		// not the signed one).
		var terr *transport.Error
		var final interface{ Final() bool }
		return errors.As(err, &terr) && terr.StatusCode < 500 && terr.StatusCode != http.StatusTooManyRequests ||
			errors.As(err, &final) && final.Final()
	})
	if err != nil {
		return Explain(ref, err)
	}
	return nil
}

func (p *Pusher) tryPushBlob(ctx context.Context, s blobStep, sink progress.Sink) error {
	start := p.url(s.repo, "blobs/uploads/")
	if s.action == ActionMount {
		start += "?mount=" + url.QueryEscape(s.desc.Digest.String()) + "&from=" + url.QueryEscape(s.from.RepositoryStr())
	}
	resp, err := p.do(ctx, s.repo, http.MethodPost, start, nil, 0, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close() // CheckError reads a refusal's body
	if resp.StatusCode == http.StatusCreated && s.action == ActionMount {
		return nil // mounted
	}
	if err := transport.CheckError(resp, http.StatusAccepted); err != nil {
		return err
	}
	loc, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
	if err != nil || resp.Header.Get("Location") == "" {
		return fmt.Errorf("registry gave no upload location")
	}
	q := loc.Query()
	q.Set("digest", s.desc.Digest.String())
	loc.RawQuery = q.Encode()
	body, err := p.Source.OpenBlob(s.desc.Digest)
	if err != nil {
		return err
	}
	if c, ok := body.(io.Closer); ok {
		defer c.Close()
	}
	var sent atomic.Int64
	counted := &progress.Reader{R: body, Sink: countingSink{sink, &sent}}
	resp, err = p.do(ctx, s.repo, http.MethodPut, loc.String(), counted, s.desc.Size, map[string]string{"Content-Type": "application/octet-stream"})
	if err != nil {
		sink.Done(-sent.Load()) // this attempt's bytes are sent again
		return err
	}
	defer resp.Body.Close()
	if err := transport.CheckError(resp, http.StatusCreated); err != nil {
		sink.Done(-sent.Load())
		return err
	}
	return nil
}

type countingSink struct {
	progress.Sink
	n *atomic.Int64
}

func (c countingSink) Done(n int64) { c.n.Add(n); c.Sink.Done(n) }

func (p *Pusher) putManifest(ctx context.Context, ref name.Reference, m RawManifest) error {
	resp, err := p.do(ctx, ref.Context(), http.MethodPut, p.url(ref.Context(), "manifests/"+ref.Identifier()),
		strings.NewReader(string(m.Raw)), int64(len(m.Raw)), map[string]string{"Content-Type": string(m.MediaType)})
	if err != nil {
		return Explain(ref.String(), err)
	}
	defer resp.Body.Close()
	if err := transport.CheckError(resp, http.StatusCreated); err != nil {
		return Explain(ref.String(), err)
	}
	if got := resp.Header.Get("Docker-Content-Digest"); got != "" && got != m.Digest.String() {
		return fmt.Errorf("%s: registry stored the manifest as %s, not %s", ref, got, m.Digest)
	}
	return nil
}

func (p *Pusher) url(repo name.Repository, path string) string {
	return fmt.Sprintf("https://%s/v2/%s/%s", repo.RegistryStr(), repo.RepositoryStr(), path)
}

func (p *Pusher) do(ctx context.Context, repo name.Repository, method, u string, body io.Reader, size int64, headers map[string]string) (*http.Response, error) {
	tr, err := p.transport(ctx, repo)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.ContentLength = size
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	return (&http.Client{Transport: tr}).Do(req)
}

// transport returns the authenticated transport for repo (push and pull on
// it, pull on every other target repository for cross-repository mounts).
// It does not retry by itself: requests with bodies are retried whole by
// pushBlob.
func (p *Pusher) transport(ctx context.Context, repo name.Repository) (http.RoundTripper, error) {
	return p.transports.get(repo, func() (http.RoundTripper, error) {
		scopes := []string{repo.Scope(transport.PushScope)}
		for _, r := range p.repos {
			if r.String() != repo.String() {
				scopes = append(scopes, r.Scope(transport.PullScope))
			}
		}
		return p.Access.authTransport(ctx, repo, false, scopes)
	})
}
