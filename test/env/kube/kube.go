// Package kube starts a real control plane on loopback for kubelift's
// tests: etcd from Debian's etcd-server and kube-apiserver built from the
// Go module proxy by hack/build-kubernetes.sh, with TLS, RBAC and an admin
// kubeconfig. Processes are stopped by pid.
package kube

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/kubelift/kubelift/test/env/internet"
)

// BuildScript builds Kubernetes binaries and prints their directory.
const BuildScript = "hack/build-kubernetes.sh"

// Binaries returns the directory holding the given components at version,
// building them if needed (minutes when cold, cached by version after).
func Binaries(ctx context.Context, version string, components ...string) (string, error) {
	return runBuild(ctx, BuildScript, append([]string{version}, components...)...)
}

// runBuild runs one of the build scripts with args and returns what it
// prints, the path of what it built; its progress goes to stderr.
func runBuild(ctx context.Context, script string, args ...string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, script), args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", script, strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// RuntimeScript builds the container runtime (containerd, its shim, ctr,
// runc, crictl) from the Go module proxy.
const RuntimeScript = "hack/build-runtime.sh"

// The container runtime's versions. containerd 2.3 is containerd's
// long-term support line (April 2026 to April 2028), the one its release
// table pairs with Kubernetes 1.30 and later; runc is the version that
// containerd release names (script/setup/runc-version); crictl 1.34
// serves Kubernetes 1.30 to 1.34.
const (
	ContainerdVersion = "v2.3.7"
	RuncVersion       = "v1.5.2"
	CrictlVersion     = "v1.34.0"
)

// Containerd17 is containerd's last 1.x line, with the runc that release
// names (script/setup/runc-version of v1.7.35): what nodes run that
// Kubernetes after v1.35 no longer supports (`kubelift-sandbox up
// --runtime-version v1.7.35`).
const (
	Containerd17     = "v1.7.35"
	Containerd17Runc = "v1.3.6"
)

// RuntimeVersions are the versions of one build of the container runtime.
type RuntimeVersions struct{ Containerd, Runc, Crictl string }

// RuntimeFor is the runtime the sandbox builds for a containerd version:
// "" or ContainerdVersion (the default), or Containerd17; each with the
// runc its release names.
func RuntimeFor(containerd string) (RuntimeVersions, error) {
	switch containerd {
	case "", ContainerdVersion:
		return RuntimeVersions{ContainerdVersion, RuncVersion, CrictlVersion}, nil
	case Containerd17:
		return RuntimeVersions{Containerd17, Containerd17Runc, CrictlVersion}, nil
	}
	return RuntimeVersions{}, fmt.Errorf("containerd %s: the sandbox builds %s (the default) or %s", containerd, ContainerdVersion, Containerd17)
}

// RuntimeBinaries returns the directory of the built container runtime,
// building it first if it is not cached.
func RuntimeBinaries(ctx context.Context, v RuntimeVersions) (string, error) {
	return runBuild(ctx, RuntimeScript, v.Containerd, v.Runc, v.Crictl)
}

// KubeletScript builds a release's kubelet with kubelift's hash-skip patch.
const KubeletScript = "hack/build-kubelet.sh"

// HashSkipKubelet returns the path of version's kubelet with kubelift's
// hash-skip patch, building it first if it is not cached (the stock
// kubelet of version is built before it, and shares its compiled
// packages).
func HashSkipKubelet(ctx context.Context, version string) (string, error) {
	return runBuild(ctx, KubeletScript, version)
}

// AddonScript builds etcd, CoreDNS and the CNI plugins from the Go
// module proxy.
const AddonScript = "hack/build-addons.sh"

// Addon returns the directory holding the built addon (etcd with etcdctl
// and etcdutl, coredns, or the CNI plugins: name is etcd, coredns or cni)
// at version, building it first if it is not cached.
func Addon(ctx context.Context, name, version string) (string, error) {
	return runBuild(ctx, AddonScript, name, version)
}

// RepoRoot is kubelift's source tree (where go.mod is), found from this
// file's compiled-in path.
func RepoRoot() (string, error) { return repoRoot() }

func repoRoot() (string, error) {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Dir(file)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above %s", file)
		}
		dir = parent
	}
}

// APIServer is a running etcd and kube-apiserver.
type APIServer struct {
	URL        string
	Kubeconfig string
	Dir        string
	// NetNS is the namespace it runs in (nil: the test's own, on loopback).
	NetNS *NetNS
	procs []*exec.Cmd
}

// APIServerOptions tune StartAPIServer.
type APIServerOptions struct {
	// NetNS runs etcd and the apiserver inside this namespace, serving on
	// its address (reach it with NetNS.DialContext).
	NetNS *NetNS
	// ExtraArgs are added to kube-apiserver's flags.
	ExtraArgs []string
	// Host is the loopback address kube-apiserver binds and advertises
	// (e.g. "127.1.0.1"; default 127.0.0.1), so several control planes
	// or a simulated fleet can keep their addresses apart. etcd stays on
	// 127.0.0.1. Ignored with NetNS.
	Host string
}

// StartAPIServer starts etcd and the kube-apiserver found in binDir, and
// waits until /readyz answers. Stop it with Stop.
func StartAPIServer(ctx context.Context, dir, binDir string, opts ...APIServerOptions) (*APIServer, error) {
	var o APIServerOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	s := &APIServer{Dir: dir, NetNS: o.NetNS}
	host := "127.0.0.1"
	if o.NetNS != nil {
		host = o.NetNS.Addr
	} else if o.Host != "" {
		host = o.Host
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	etcdPort, _ := internet.FreePort()
	peerPort, _ := internet.FreePort()
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	if err := s.start(filepath.Join(dir, "etcd.log"), "/usr/bin/etcd", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort), "--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort),
		"--initial-cluster", fmt.Sprintf("default=http://127.0.0.1:%d", peerPort), "--log-level", "error"); err != nil {
		return nil, err
	}

	pki := filepath.Join(dir, "pki")
	ca, err := internet.NewCA(pki)
	if err != nil {
		s.Stop()
		return nil, err
	}
	cert, key, err := ca.Issue(pki, "apiserver", []string{"localhost", "kubernetes", "kubernetes.default.svc"}, []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(host), net.ParseIP("10.96.0.1")})
	if err != nil {
		s.Stop()
		return nil, err
	}
	adminCert, adminKey, err := ca.IssueClient(pki, "kubelift-admin", []string{"system:masters"})
	if err != nil {
		s.Stop()
		return nil, err
	}
	saKey := filepath.Join(pki, "sa.key")
	saPub := filepath.Join(pki, "sa.pub")
	if err := WriteServiceAccountKey(saKey, saPub); err != nil {
		s.Stop()
		return nil, err
	}
	port, _ := internet.FreePort()
	s.URL = fmt.Sprintf("https://%s:%d", host, port)
	if err := s.start(filepath.Join(dir, "kube-apiserver.log"), filepath.Join(binDir, "kube-apiserver"), append([]string{
		"--etcd-servers", etcdURL,
		"--bind-address", host, "--secure-port", fmt.Sprint(port), "--advertise-address", host,
		"--endpoint-reconciler-type", "none",
		"--tls-cert-file", cert, "--tls-private-key-file", key, "--client-ca-file", ca.CertFile,
		"--service-account-key-file", saPub, "--service-account-signing-key-file", saKey,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--authorization-mode", "Node,RBAC",
		"--cert-dir", filepath.Join(dir, "certs")}, o.ExtraArgs...)...); err != nil {
		s.Stop()
		return nil, err
	}
	s.Kubeconfig = filepath.Join(dir, "kubeconfig")
	kc := Kubeconfig(s.URL, ca.CertFile, adminCert, adminKey, "admin")
	if err := os.WriteFile(s.Kubeconfig, []byte(kc), 0o600); err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.waitReady(ctx, ca.CertFile, adminCert, adminKey); err != nil {
		s.Stop()
		log, _ := os.ReadFile(filepath.Join(dir, "kube-apiserver.log"))
		if len(log) > 4000 {
			log = log[len(log)-4000:]
		}
		return nil, fmt.Errorf("kube-apiserver: %w\n%s", err, log)
	}
	return s, nil
}

// Pids are its processes (etcd, kube-apiserver), by program name.
func (s *APIServer) Pids() map[string]int {
	m := map[string]int{}
	for _, c := range s.procs {
		if c.Process != nil {
			m[filepath.Base(c.Path)] = c.Process.Pid
		}
	}
	return m
}

func (s *APIServer) start(logPath, bin string, args ...string) error {
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	if s.NetNS != nil {
		cmd = s.NetNS.Command(bin, args...)
	}
	cmd.Dir = s.Dir // never the caller's directory (the repository)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	go func() { _ = cmd.Wait() }()
	s.procs = append(s.procs, cmd)
	return nil
}

func (s *APIServer) waitReady(ctx context.Context, caFile, certFile, keyFile string) error {
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(caFile)
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return err
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}
	if s.NetNS != nil {
		tr.DialContext = s.NetNS.DialContext
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: tr}
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		resp, err := client.Get(s.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("not ready within 90s (last: %s)", last)
}

// Stop kills every process (by pid, with its process group).
func (s *APIServer) Stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i].Process
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
		_ = p.Kill()
		for j := 0; j < 250 && syscall.Kill(p.Pid, 0) == nil; j++ {
			time.Sleep(20 * time.Millisecond)
		}
	}
	s.procs = nil
}

// WriteServiceAccountKey writes an RSA key pair for signing service account
// tokens (PKCS#8 private key, PKIX public key, PEM).
func WriteServiceAccountKey(keyFile, pubFile string) error {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

// Kubeconfig is a kubeconfig for user, authenticated by a client
// certificate, of the API server at server (CA, certificate and key are
// file paths).
func Kubeconfig(server, caFile, certFile, keyFile, user string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubelift
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: %s@kubelift
  context: {cluster: kubelift, user: %s}
current-context: %s@kubelift
`, server, caFile, user, certFile, keyFile, user, user, user)
}
