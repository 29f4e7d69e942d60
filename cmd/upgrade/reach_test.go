package main

import (
	"context"
	"errors"
	"io"
	"log"
	"math"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/agent/access/accesstest"
	"github.com/kubelift/kubelift/internal/agent/image"
	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/registry"
)

// Agent mode starts only from an agent image in the registry by its
// signed digest: one missing there blocks the run before anything is
// made in the cluster; one there starts an agent on every node.
func TestReachAgents(t *testing.T) {
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	domain := u.Host
	img, _ := random.Image(256, 1)
	d, _ := img.Digest()
	ref := image.Repository + ":sha256-0123456789abcdef"
	target := &release.Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 4},
		Manifest: &bundle.Manifest{Images: []bundle.Image{{Ref: ref, Digest: d.String()}}},
		Record: &cluster.Available{Registry: domain, Images: []cluster.ImageRecord{
			{Ref: ref, Target: domain + "/library/kubelift-agent:sha256-0123456789abcdef", Digest: d.String()}}}}
	acc := registry.Access{Insecure: []string{domain}}
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-1"}}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}})
	accesstest.DeleteCollections(cs) // the run's end deletes its pods in one request
	ctx := context.Background()

	_, err := reachForRelease(ctx, viaAgent, &cli.NodeFlags{}, cs, cs, target, acc, domain, "")
	var ce *cli.CodeError
	if !errors.As(err, &ce) || ce.Code != cli.ExitBlocked || !strings.Contains(err.Error(), "is not in the registry") {
		t.Fatalf("an agent image missing from the registry: %v, want exit %d", err, cli.ExitBlocked)
	}
	for _, a := range cs.Actions() {
		if a.GetVerb() != "get" && a.GetVerb() != "list" {
			t.Errorf("the blocked run made %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}

	pushed, _ := name.ParseReference(domain + "/library/kubelift-agent:sha256-0123456789abcdef")
	if err := remote.Write(pushed, img); err != nil {
		t.Fatal(err)
	}
	r, err := reachForRelease(ctx, viaAgent, &cli.NodeFlags{}, cs, cs, target, acc, domain, "")
	if err != nil {
		t.Fatal(err)
	}
	if r.agent() != domain+"/library/kubelift-agent@"+d.String() {
		t.Errorf("agent image %q", r.agent())
	}
	pods, _ := cs.CoreV1().Pods(agent.Namespace).List(ctx, metav1.ListOptions{})
	if len(pods.Items) != 2 {
		t.Errorf("%d agent pods for 2 nodes", len(pods.Items))
	}
	r.stop(ctx, &err)
	if err != nil {
		t.Fatal(err)
	}
	if pods, _ := cs.CoreV1().Pods(agent.Namespace).List(ctx, metav1.ListOptions{}); len(pods.Items) != 0 {
		t.Errorf("%d agent pods after the run", len(pods.Items))
	}
}

// --via and --agent-image of rollback and compat cleanup.
func TestViaFlags(t *testing.T) {
	ok := "registry.local:5000/library/kubelift-agent@sha256:" + strings.Repeat("a", 64)
	for _, tc := range []struct {
		f    agentFlags
		want string
	}{
		{agentFlags{Via: viaSSH}, ""},
		{agentFlags{Via: viaAgent, Image: ok}, ""},
		{agentFlags{Via: "kubectl"}, `--via "kubectl": want ssh or agent`},
		{agentFlags{Via: viaSSH, Image: ok}, "--agent-image without --via agent"},
		{agentFlags{Via: viaAgent, Image: "registry.local:5000/library/kubelift-agent:latest"}, "want REPOSITORY@sha256:DIGEST"},
	} {
		err := tc.f.check()
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.f, err, tc.want)
		}
	}
}

// Agent mode keeps the etcd snapshot on its node and stages from the
// registry; SSH's path keeps a copy here and stages as --via says.
func TestAgentModeSnapshotAndStaging(t *testing.T) {
	var got *applyOptions
	mk := func(s *cli.IO) *cobra.Command {
		return newCmdApply(s, func(_ context.Context, o *applyOptions) error { got = o; return nil })
	}
	if err := parse(t, mk, "--to", "v1.31.4", "--via", "agent", "--cache-dir", "/srv/cache"); err != nil {
		t.Fatal(err)
	}
	if s := snapshots(got, registry.Access{}); s.Dir != "" || s.Repository != "" {
		t.Errorf("agent mode's snapshots %+v, want none kept off the node", s)
	}
	if v := got.Path.stageVia(); v != "registry" {
		t.Errorf("agent mode stages via %q, want registry", v)
	}
	if err := parse(t, mk, "--to", "v1.31.4", "--via", "ssh", "--cache-dir", "/srv/cache"); err != nil {
		t.Fatal(err)
	}
	if s := snapshots(got, registry.Access{}); s.Dir != "/srv/cache/etcd-snapshots" || got.Path.stageVia() != "ssh" {
		t.Errorf("SSH's snapshots %+v, staging %q", s, got.Path.stageVia())
	}
	stage := func(s *cli.IO) *cobra.Command { return newCmdStage(s, nil) }
	if err := parse(t, stage, "--via", "agent", "--key", "k.pub", "bundle.run"); err == nil || !strings.Contains(err.Error(), "--via agent with a bundle FILE") {
		t.Errorf("stage --via agent FILE: %v", err)
	}
	imp := func(s *cli.IO) *cobra.Command { return newCmdImport(s, nil) }
	if err := parse(t, imp, "bundle.run", "--via", "agent", "--skip-binaries", "--domain", "r.local:5000", "--key", "k.pub"); err == nil || !strings.Contains(err.Error(), "--via agent with --skip-binaries") {
		t.Errorf("import --via agent --skip-binaries --stage: %v", err)
	}
}

// Agent mode's step requests have a rate of their own (--agent-qps),
// not a share of --kube-qps's: the engine's requests keep theirs.
func TestStepClientHasItsOwnRate(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &kubeFlags{Kubeconfig: kc, QPS: 5, Burst: 10}
	engine, err := f.config()
	if err != nil {
		t.Fatal(err)
	}
	steps, err := f.stepConfig(200)
	if err != nil {
		t.Fatal(err)
	}
	if steps.RateLimiter == engine.RateLimiter || steps.RateLimiter.QPS() != 200 || steps.Burst != 400 || engine.RateLimiter.QPS() != 5 {
		t.Errorf("steps at %v (burst %d), the engine at %v: want 200 (400) apart from 5", steps.RateLimiter.QPS(), steps.Burst, engine.RateLimiter.QPS())
	}
	if d, _ := f.stepConfig(0); d.RateLimiter.QPS() != defaultAgentQPS {
		t.Errorf("--agent-qps 0: %v, want the default %d", d.RateLimiter.QPS(), defaultAgentQPS)
	}
	if d, _ := f.stepConfig(0.25); d.Burst != 1 {
		t.Errorf("--agent-qps 0.25: burst %d, want 1 (a burst of 0 refuses every request)", d.Burst)
	}
	for _, q := range []float32{float32(math.NaN()), -1, 1e19} {
		if err := checkAgentQPS(q); err == nil || !strings.Contains(err.Error(), "--agent-qps") {
			t.Errorf("--agent-qps %v: %v, want refused", q, err)
		}
	}
}
