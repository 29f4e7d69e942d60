package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubelift/kubelift/test/env/internet"
)

type importResult struct {
	UploadBytes int64
	Images      []struct {
		Ref, Target, Digest, UpstreamDigest, Action, Note string
		DigestKept                                        bool
		BlobsUploaded, BlobsMounted, BlobsPresent         int
	}
}

func parseImport(t *testing.T, r result) importResult {
	t.Helper()
	var res importResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("import -o json: %v\nstdout: %s\nstderr: %s", err, r.stdout, r.stderr)
	}
	return res
}

func (res importResult) uploaded() (n int) {
	for _, im := range res.Images {
		n += im.BlobsUploaded
	}
	return n
}

// TestImportTLSAndAuth imports a .run bundle into a TLS registry with
// htpasswd auth, the way an operator does inside the air gap.
func TestImportTLSAndAuth(t *testing.T) {
	w := startWorld(t, internet.ImageShape{Arches: []string{"amd64", "arm64"}, BaseBytes: 256 << 10, UniqueBytes: 64 << 10})
	key, pub := w.keygen(t, "team")
	out := filepath.Join(w.dir, "k8s-"+version+"-linux-amd64.run")
	if r := w.create(t, key, out, filepath.Join(w.dir, "cache"), "--format", "run", "--all-platforms"); r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	priv, err := internet.StartRegistry(context.Background(), filepath.Join(w.dir, "private"), internet.RegistryOptions{TLS: true, User: "admin", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(priv.Stop)
	base := []string{"--key", pub, "--domain", priv.Host, "--namespace", "library", "--username", "admin", "--password-stdin", "--ca-file", priv.CAFile, "-q"}

	t.Run("wrong password", func(t *testing.T) {
		r := runIn(t, "wrong\n", out, append([]string{"--upgrade"}, base...)...)
		if r.code == 0 || !strings.Contains(r.stderr, priv.Host+"/library/") || !strings.Contains(r.stderr, "401") || !strings.Contains(r.stderr, "check the credentials") {
			t.Errorf("exit %d, stderr: %s", r.code, r.stderr)
		}
		if strings.Contains(r.stderr+r.stdout, "wrong") {
			t.Error("the password was printed")
		}
	})
	t.Run("untrusted certificate", func(t *testing.T) {
		args := []string{"import", out, "--key", pub, "--domain", priv.Host, "--username", "admin", "--password-stdin", "-q"}
		r := runIn(t, "s3cret\n", "upgrade", args...)
		if r.code == 0 || !strings.Contains(r.stderr, "x509") || !strings.Contains(r.stderr, "--ca-file") {
			t.Errorf("exit %d, stderr: %s", r.code, r.stderr)
		}
	})
	t.Run("push through the .run stub", func(t *testing.T) {
		r := runIn(t, "s3cret\n", out, append([]string{"--upgrade", "-o", "json"}, base...)...)
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		res := parseImport(t, r)
		if len(res.Images) != 7 || res.uploaded() == 0 {
			t.Fatalf("%d images, %d uploads", len(res.Images), res.uploaded())
		}
		for _, im := range res.Images {
			repo := strings.TrimPrefix(im.Ref, "registry.k8s.io/")
			if !im.DigestKept || im.Digest != w.digests[repo] || im.Action != "pushed" {
				t.Errorf("%s: %+v (upstream %s)", im.Ref, im, w.digests[repo])
			}
		}
		// skopeo reads it back from the registry: upstream's index, byte for byte.
		certDir := filepath.Dir(priv.CAFile)
		sk := mustRun(t, "skopeo", "inspect", "--raw", "--creds", "admin:s3cret", "--cert-dir", certDir, "docker://"+priv.Host+"/library/coredns:v1.11.3")
		if got := fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(sk.stdout))); got != w.digests["coredns/coredns:v1.11.3"] {
			t.Errorf("skopeo sees %s, upstream %s", got, w.digests["coredns/coredns:v1.11.3"])
		}
		sk = mustRun(t, "skopeo", "inspect", "--creds", "admin:s3cret", "--cert-dir", certDir, "docker://"+priv.Host+"/library/kube-apiserver:v1.31.4")
		if !strings.Contains(sk.stdout, `"Architecture": "amd64"`) {
			t.Errorf("skopeo inspect: %s", sk.stdout)
		}
	})
	t.Run("password from the environment, re-import sends nothing", func(t *testing.T) {
		args := []string{"import", out, "--key", pub, "--domain", priv.Host, "--namespace", "library", "--username", "admin", "--ca-file", priv.CAFile, "-q", "-o", "json"}
		r := runEnv(t, []string{"KUBELIFT_REGISTRY_PASSWORD=s3cret"}, "upgrade", args...)
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		res := parseImport(t, r)
		if res.UploadBytes != 0 || res.uploaded() != 0 {
			t.Errorf("re-import uploaded %d blobs, %d bytes", res.uploaded(), res.UploadBytes)
		}
		for _, im := range res.Images {
			if im.Action != "present" {
				t.Errorf("%s: %s", im.Ref, im.Action)
			}
		}
	})
}

// TestImportResumesAfterRegistryRestart stops the registry in the middle of
// a push, starts it again, and checks the re-run sends only what is missing.
func TestImportResumesAfterRegistryRestart(t *testing.T) {
	w := startWorld(t, internet.ImageShape{Arches: []string{"amd64"}, BaseBytes: 256 << 10, UniqueBytes: 128 << 10})
	key, pub := w.keygen(t, "team")
	out := filepath.Join(w.dir, "b.tar")
	if r := w.create(t, key, out, filepath.Join(w.dir, "cache")); r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	priv, err := internet.StartRegistry(context.Background(), filepath.Join(w.dir, "private"), internet.RegistryOptions{Proxy: true, User: "admin", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(priv.Stop)
	// Images only: their blob uploads are what this test counts.
	args := []string{"import", out, "--key", pub, "--domain", priv.Host, "--namespace", "k8s", "--username", "admin", "--password-stdin", "--plain-http", "-o", "json", "-q", "--jobs", "1",
		"--skip-binaries"}

	// A dry run checks credentials, plans, and sends nothing.
	dry := parseImport(t, mustRunIn(t, "pw\n", "upgrade", append(args, "--dry-run")...))
	total := dry.uploaded()
	if total == 0 || priv.BlobUploads.Load() != 0 {
		t.Fatalf("dry run: plans %d uploads, sent %d", total, priv.BlobUploads.Load())
	}

	priv.KillAfterUploads(5)
	r := runIn(t, "pw\n", "upgrade", args...)
	if r.code == 0 {
		t.Fatal("import succeeded with the registry gone")
	}
	if !strings.Contains(r.stderr, priv.Host) {
		t.Errorf("error does not name the registry: %s", r.stderr)
	}
	sentBefore := priv.BlobUploads.Load()
	if err := priv.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	res := parseImport(t, mustRunIn(t, "pw\n", "upgrade", args...))
	sent := priv.BlobUploads.Load() - sentBefore
	if sent != int64(res.uploaded()) || res.uploaded() != total-5 {
		t.Errorf("re-run planned %d uploads and sent %d; %d of %d were done before the registry stopped", res.uploaded(), sent, sentBefore, total)
	}
	for _, im := range res.Images {
		if im.Target != priv.Host+"/k8s/"+strings.TrimPrefix(strings.SplitN(im.Ref, "/", 2)[1], "coredns/") {
			t.Errorf("target %s for %s", im.Target, im.Ref)
		}
	}
	// Everything is there now: a third run sends nothing.
	again := parseImport(t, mustRunIn(t, "pw\n", "upgrade", args...))
	if again.uploaded() != 0 || priv.BlobUploads.Load()-sentBefore != sent {
		t.Errorf("third run uploaded %d", again.uploaded())
	}
}

func mustRunIn(t *testing.T, stdin, name string, args ...string) result {
	t.Helper()
	r := runIn(t, stdin, name, args...)
	if r.code != 0 {
		t.Fatalf("%s %v: exit %d\nstderr: %s", filepath.Base(name), args, r.code, r.stderr)
	}
	return r
}

func runEnv(t *testing.T, env []string, name string, args ...string) result {
	t.Helper()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	return run(t, name, args...)
}
