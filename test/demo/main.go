// Command demo is `make demo`: it plays the whole kubelift story as far as
// it exists, on this machine, with the progress a user sees. A real
// registry (Debian's docker-registry) and a file server on loopback stand in
// for registry.k8s.io and dl.k8s.io; then the real bundle and upgrade
// programs from bin/ make, inspect, verify and unpack a signed .run bundle,
// and import it into a second registry playing the air gap's private one.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/test/internet"
)

const version = "v1.31.4"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

func sh(name string, args ...string) error {
	shown := append([]string{filepath.Base(name)}, args...)
	fmt.Printf("$ %s\n", strings.Join(shown, " "))
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

func run(ctx context.Context) error {
	work, err := filepath.Abs(".demo")
	if err != nil {
		return err
	}
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	bin, _ := filepath.Abs("bin")

	step("Starting the stand-in internet: docker-registry and a file server on loopback")
	reg, err := internet.StartRegistry(ctx, filepath.Join(work, "source-registry"), internet.RegistryOptions{})
	if err != nil {
		return err
	}
	defer reg.Stop()
	cat, err := catalog.Default()
	if err != nil {
		return err
	}
	rel, err := cat.Lookup(version)
	if err != nil {
		return err
	}
	if _, err := internet.Seed(ctx, reg.Host, internet.ReleaseRepos(rel), internet.ImageShape{Arches: []string{"amd64", "arm64"}, BaseBytes: 8 << 20, UniqueBytes: 2 << 20}); err != nil {
		return err
	}
	files, err := internet.StartFileServer()
	if err != nil {
		return err
	}
	defer files.Close()
	mirrors := files.AddRelease(rel, []string{"amd64"}, 4<<20)
	fmt.Printf("registry %s (pid %d) plays registry.k8s.io; %s plays dl.k8s.io and github.com\n", reg.Host, reg.Pid(), files.URL)

	step("Making the team's signing key")
	key := filepath.Join(work, "team")
	if err := sh(filepath.Join(bin, "bundle"), "keygen", "--out", key); err != nil {
		return err
	}

	step("What would be fetched (hand this to the proxy allow-list)")
	flags := []string{"--registry-mirror", "registry.k8s.io=" + reg.Host, "--insecure-registry", reg.Host}
	for _, m := range mirrors {
		flags = append(flags, "--url-mirror", m)
	}
	if err := sh(filepath.Join(bin, "bundle"), append([]string{"create", "--kubernetes-version", version, "--dry-run"}, flags...)...); err != nil {
		return err
	}

	step("Bundling Kubernetes %s into a signed, self-extracting installer (every platform, so index digests survive the import)", version)
	out := filepath.Join(work, "k8s-"+version+"-linux-amd64.run")
	args := append([]string{"create", "--kubernetes-version", version, "--sign-key", key + ".key", "--format", "run", "-o", out,
		"--all-platforms", "--cache-dir", filepath.Join(work, "cache")}, flags...)
	if err := sh(filepath.Join(bin, "bundle"), args...); err != nil {
		return err
	}

	step("Inside the air gap: what the bundle holds")
	if err := sh(out, "--help"); err != nil {
		return err
	}
	if err := sh(filepath.Join(bin, "bundle"), "inspect", out); err != nil {
		return err
	}

	step("Verifying with the team's public key, then unpacking")
	if err := sh(out, "--verify", "--key", key+".pub"); err != nil {
		return err
	}
	if err := sh(out, "--extract", filepath.Join(work, "extracted"), "--key", key+".pub"); err != nil {
		return err
	}
	if err := sh("openssl", "dgst", "-sha256", "-verify", key+".pub", "-signature",
		filepath.Join(work, "extracted", "bundle.json.sig"), filepath.Join(work, "extracted", "bundle.json")); err != nil {
		return err
	}

	step("A tampered copy is refused, naming the entry")
	data, err := os.ReadFile(out)
	if err != nil {
		return err
	}
	data[len(data)/3] ^= 1
	bad := filepath.Join(work, "tampered.run")
	if err := os.WriteFile(bad, data, 0o755); err != nil {
		return err
	}
	if err := sh(bad, "--verify", "--key", key+".pub"); err == nil {
		return fmt.Errorf("the tampered bundle verified")
	}
	fmt.Println("(refused, as it should be)")

	step("Inside the air gap: the private registry (TLS from its own CA, htpasswd)")
	priv, err := internet.StartRegistry(ctx, filepath.Join(work, "private-registry"), internet.RegistryOptions{TLS: true, User: "admin", Password: "demo-password"})
	if err != nil {
		return err
	}
	defer priv.Stop()
	fmt.Printf("registry %s (pid %d), CA %s\n", priv.Host, priv.Pid(), priv.CAFile)

	step("Importing: ./%s --upgrade ...", filepath.Base(out))
	importArgs := []string{"--upgrade", "--key", key + ".pub", "--domain", priv.Host, "--namespace", "library",
		"--username", "admin", "--password-stdin", "--ca-file", priv.CAFile}
	if err := shIn("demo-password\n", out, importArgs...); err != nil {
		return err
	}
	step("Importing again: everything is there, nothing is sent")
	if err := shIn("demo-password\n", out, append(importArgs, "-q")...); err != nil {
		return err
	}
	step("A wrong password is a clear error")
	if err := shIn("not-the-password\n", out, append(importArgs, "-q")...); err == nil {
		return fmt.Errorf("a wrong password was accepted")
	}

	step("Why in-place kubelet upgrades restart containers: the same pod, hashed by two kubelets")
	pod := filepath.Join(work, "pod.yaml")
	if err := os.WriteFile(pod, []byte(demoPod), 0o644); err != nil {
		return err
	}
	for _, v := range []string{"v1.30.14", "v1.31.4"} {
		if err := sh(filepath.Join(bin, "upgrade"), "compat", "hash", "--kubelet-version", v, "-f", pod); err != nil {
			return err
		}
	}
	fmt.Println("(every recorded hash differs after a 1.30 -> 1.31 swap: the kubelet restarts every container;")
	fmt.Println(" kubelift's hash-skip kubelet keeps them running: see README, \"Kubelet upgrades without container restarts\")")

	step("Done. Files are in %s; the registries were stopped.", work)
	return nil
}

// shIn is sh with standard input.
func shIn(stdin, name string, args ...string) error {
	shown := append([]string{filepath.Base(name)}, args...)
	fmt.Printf("$ echo ... | %s\n", strings.Join(shown, " "))
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

const demoPod = `apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: shop}
spec:
  containers:
  - name: web
    image: registry.corp:5000/library/nginx:1.27
    ports: [{containerPort: 80}]
    resources: {requests: {cpu: 100m, memory: 128Mi}}
  - name: metrics
    image: registry.corp:5000/library/exporter:v2
    args: [--listen=:9100]
`
