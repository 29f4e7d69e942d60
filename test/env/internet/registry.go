// Package internet starts real servers on loopback that play the outside
// world and the air gap's private registry for kubelift's end-to-end tests,
// benchmarks and demo: the CNCF distribution registry (Debian's
// docker-registry) with optional htpasswd auth and TLS from a generated CA,
// a counting proxy in front of it, and a file server that publishes
// checksums the way dl.k8s.io and GitHub releases do.
package internet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// RegistryBinary is the distribution registry from Debian's docker-registry.
const RegistryBinary = "/usr/bin/docker-registry"

// Registry is a running docker-registry process.
type Registry struct {
	// Host is host:port clients use (the proxy's address when proxied).
	Host string
	// Backend is the registry process's own host:port.
	Backend string
	// CAFile is the CA that signed the TLS certificate (TLS registries).
	CAFile   string
	User     string
	Password string
	Dir      string

	cmd     *exec.Cmd
	cfgPath string
	proxy   *http.Server
	// killAfter kills the registry process once this many uploads completed
	// (0: never).
	killAfter atomic.Int64
	// BlobGETs counts blob downloads through the proxy, BlobUploads
	// completed blob uploads (the final PUT), BlobHEADs existence checks.
	BlobGETs, BlobUploads, BlobHEADs atomic.Int64
	// failing makes the proxy drop blob transfers once passLeft reaches 0.
	failing  atomic.Bool
	passLeft atomic.Int64
	mu       sync.Mutex
	stopped  bool
}

// RegistryOptions configure StartRegistry.
type RegistryOptions struct {
	// TLS serves HTTPS with a certificate from a CA generated in Dir.
	TLS bool
	// User and Password enable htpasswd auth.
	User, Password string
	// Proxy puts a counting, fault-injecting HTTP proxy in front (plain
	// HTTP registries only).
	Proxy bool
	// Port pins the listen port (0 picks one); a restarted registry keeps
	// its port and storage.
	Port int
}

// StartRegistry starts docker-registry with storage in dir and waits until
// it answers. Stop it with Stop (by pid).
func StartRegistry(ctx context.Context, dir string, o RegistryOptions) (*Registry, error) {
	if _, err := os.Stat(RegistryBinary); err != nil {
		return nil, fmt.Errorf("%s missing: run 'make deps' (Debian package docker-registry): %w", RegistryBinary, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "storage"), 0o755); err != nil {
		return nil, err
	}
	port := o.Port
	if port == 0 {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		port = p
	}
	r := &Registry{Backend: fmt.Sprintf("127.0.0.1:%d", port), Dir: dir, User: o.User, Password: o.Password}
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
  secret: kubelift-test-secret
`, filepath.Join(dir, "storage"), r.Backend)
	if o.TLS {
		ca, err := NewCA(filepath.Join(dir, "ca"))
		if err != nil {
			return nil, err
		}
		cert, key, err := ca.Issue(filepath.Join(dir, "tls"), "registry", []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")})
		if err != nil {
			return nil, err
		}
		r.CAFile = ca.CertFile
		cfg += fmt.Sprintf("  tls:\n    certificate: %s\n    key: %s\n", cert, key)
	}
	if o.User != "" {
		hp := filepath.Join(dir, "htpasswd")
		if err := WriteHtpasswd(hp, o.User, o.Password); err != nil {
			return nil, err
		}
		cfg += fmt.Sprintf("auth:\n  htpasswd:\n    realm: kubelift\n    path: %s\n", hp)
	}
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	r.cfgPath = cfgPath
	r.Host = r.Backend
	if err := r.start(ctx); err != nil {
		r.Stop()
		return nil, err
	}
	if o.Proxy && !o.TLS {
		if err := r.startProxy(); err != nil {
			r.Stop()
			return nil, err
		}
	}
	return r, nil
}

func (r *Registry) start(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(r.Dir, "registry.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(RegistryBinary, "serve", r.cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.cmd = cmd
	r.mu.Unlock()
	go func() { _ = cmd.Wait() }()
	if err := r.waitReady(ctx); err != nil {
		log, _ := os.ReadFile(filepath.Join(r.Dir, "registry.log"))
		return fmt.Errorf("docker-registry on %s: %w\n%s", r.Backend, err, log)
	}
	return nil
}

// Kill stops the registry process (by pid) and keeps its storage, port and
// proxy, as a crash or a maintenance restart would.
func (r *Registry) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kill()
}

func (r *Registry) kill() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	pid := r.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = r.cmd.Process.Kill()
	for i := 0; i < 250 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(20 * time.Millisecond)
	}
}

// Restart starts the registry again on the same port and storage.
func (r *Registry) Restart(ctx context.Context) error {
	r.killAfter.Store(0)
	return r.start(ctx)
}

// KillAfterUploads kills the registry process once n more blob uploads have
// completed through the proxy.
func (r *Registry) KillAfterUploads(n int64) { r.killAfter.Store(r.BlobUploads.Load() + n) }

func (r *Registry) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c, err := net.DialTimeout("tcp", r.Backend, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("did not start listening within 30s")
}

func (r *Registry) startProxy() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	target, _ := url.Parse("http://" + r.Backend)
	rp := httputil.NewSingleHostReverseProxy(target)
	r.proxy = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		isBlob := strings.Contains(req.URL.Path, "/blobs/")
		switch {
		case isBlob && req.Method == http.MethodGet:
			r.BlobGETs.Add(1)
		case isBlob && req.Method == http.MethodHead:
			r.BlobHEADs.Add(1)
		}
		if isBlob && req.Method != http.MethodHead && r.failing.Load() && r.passLeft.Add(-1) < 0 {
			// Drop the connection mid-request, as a flaky link does.
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
					return
				}
			}
			http.Error(w, "cut", http.StatusBadGateway)
			return
		}
		rp.ServeHTTP(w, req)
		if isBlob && req.Method == http.MethodPut {
			if n := r.BlobUploads.Add(1); n == r.killAfter.Load() {
				r.Kill()
			}
		}
	})}
	go func() { _ = r.proxy.Serve(ln) }()
	r.Host = ln.Addr().String()
	return nil
}

// FailBlobsAfter lets pass more blob transfers through the proxy, then
// drops every further one (the connection closes mid-request) until Heal.
func (r *Registry) FailBlobsAfter(pass int64) {
	r.passLeft.Store(pass)
	r.failing.Store(true)
}

// Heal ends FailBlobsAfter.
func (r *Registry) Heal() { r.failing.Store(false) }

// Stop kills the registry process (by pid, with its process group) and the
// proxy. It is safe to call twice.
func (r *Registry) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	r.stopped = true
	if r.proxy != nil {
		_ = r.proxy.Close()
	}
	r.kill()
}

// Pid returns the registry process id.
func (r *Registry) Pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd.Process.Pid
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// WriteHtpasswd writes a bcrypt htpasswd file for user with htpasswd(1).
func WriteHtpasswd(path, user, password string) error {
	out, err := exec.Command("htpasswd", "-Bbn", user, password).Output()
	if err != nil {
		return fmt.Errorf("htpasswd (Debian apache2-utils): %w", err)
	}
	return os.WriteFile(path, out, 0o600)
}
