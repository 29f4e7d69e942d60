package sandbox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/test/env/kube"
)

// boot starts the machine's init (the service manager) inside the
// machine's network namespace and a new mount and UTS namespace, detached
// from the caller so that the sandbox outlives "make sandbox-up". The init
// bind-mounts the machine's tree and starts its enabled units.
func (s *State) boot(m *Machine, tool string) error {
	logPath := filepath.Join(s.Dir, "machines", m.Name+".init.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := m.Net().Command("unshare", "--mount", "--uts", "--propagation", "private", "--",
		tool, "node-init", "--root", m.Root, "--hostname", m.Name)
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("boot %s: %w", m.Name, err)
	}
	m.Pid = cmd.Process.Pid // nsenter and unshare exec, so this is the init
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	sock := m.fsPath("run/kubelift-systemd.sock")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("boot %s: init exited:\n%s", m.Name, log)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("boot %s: no service manager socket after 30s (log %s)", m.Name, logPath)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Command runs name inside machine m (its network, mount and UTS
// namespaces), as a root shell on it would.
func (s *State) Command(m Machine, name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"-t", fmt.Sprint(m.Pid), "--net", "--mount", "--uts", "--", name}, args...)...)
}

// NetNS is the admin machine's namespace, from which every sandbox
// address is reachable.
func (s *State) NetNS() *kube.NetNS { return s.Admin().Net() }

// Net is the machine's network namespace (to dial from, or run a command
// in with its Command).
func (m Machine) Net() *kube.NetNS { return &kube.NetNS{Name: m.NetNS, Addr: m.Address} }

// RESTConfig is the admin kubeconfig, dialing from the admin namespace.
func (s *State) RESTConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(s.Dir, "kubeconfig"))
	if err != nil {
		return nil, err
	}
	cfg.Dial = s.NetNS().DialContext
	cfg.Timeout = 15 * time.Second
	return cfg, nil
}

// Client is an admin client of the sandbox's API server.
func (s *State) Client() (kubernetes.Interface, error) {
	cfg, err := s.RESTConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// SSH connects to a node as root with the sandbox's key, checking the
// node's host key against ssh/known_hosts (never skipped).
func (s *State) SSH(ctx context.Context, node string) (*ssh.Client, error) {
	m, err := s.Machine(node)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(s.Dir, "ssh", "id_ed25519"))
	if err != nil {
		return nil, err
	}
	signer, err := ssh.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, err
	}
	hostKeys, err := knownhosts.New(filepath.Join(s.Dir, "ssh", "known_hosts"))
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort(m.Address, "22")
	conn, err := s.NetNS().DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ssh %s (%s): %w", node, addr, err)
	}
	c, chans, reqs, err := ssh.NewClientConn(conn, addr, &ssh.ClientConfig{
		User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hostKeys, Timeout: 10 * time.Second,
	})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("ssh %s (%s): %w", node, addr, err)
	}
	return ssh.NewClient(c, chans, reqs), nil
}

// UnitLog is the tail of a unit's log on machine m (the journal stand-in).
func (s *State) UnitLog(m Machine, unit string, maxBytes int) string {
	data, _ := os.ReadFile(m.fsPath("var/log/units/" + strings.TrimSuffix(unit, ".service") + ".log"))
	if len(data) > maxBytes {
		data = data[len(data)-maxBytes:]
	}
	return string(data)
}

func (s *State) waitAPIServer(ctx context.Context) error {
	cfg, err := s.RESTConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var last error
	err = poll(ctx, 2*time.Minute, func() (bool, error) {
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		last = err
		return err == nil && strings.TrimSpace(string(body)) == "ok", nil
	})
	if err != nil {
		cp := s.Nodes()[0]
		return fmt.Errorf("kube-apiserver %s not ready (last: %v): %w\n%s", s.APIServer, last, err, s.UnitLog(cp, "kube-apiserver", 3000))
	}
	return nil
}

// waitNodesReady waits (up to 3 minutes) until every node is Ready.
func (s *State) waitNodesReady(ctx context.Context, log func(string, ...any)) error {
	client, err := s.Client()
	if err != nil {
		return err
	}
	var notReady []string
	err = poll(ctx, 3*time.Minute, func() (bool, error) {
		notReady = notReady[:0]
		for _, m := range s.Nodes() {
			n, err := client.CoreV1().Nodes().Get(ctx, m.Name, metav1.GetOptions{})
			if err != nil || !NodeReady(n) {
				notReady = append(notReady, m.Name)
			}
		}
		return len(notReady) == 0, nil
	})
	if err != nil {
		var b strings.Builder
		for _, name := range notReady {
			m, _ := s.Machine(name)
			fmt.Fprintf(&b, "\n--- %s kubelet log tail:\n%s", name, s.UnitLog(*m, "kubelet", 2000))
		}
		return fmt.Errorf("nodes not Ready: %v: %w%s", notReady, err, b.String())
	}
	log("%d nodes Ready", len(s.Nodes()))
	return nil
}

// NodeReady says whether the Node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// labelNodes gives nodes their roles (the kubelet may not set
// node-role.kubernetes.io labels itself) and taints control planes, as
// kubeadm does.
func (s *State) labelNodes(ctx context.Context) error {
	client, err := s.Client()
	if err != nil {
		return err
	}
	for _, m := range s.Nodes() {
		patch := `{"metadata":{"labels":{"node-role.kubernetes.io/worker":""}}}`
		if m.Role == "control-plane" {
			patch = `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}},"spec":{"taints":[{"key":"node-role.kubernetes.io/control-plane","effect":"NoSchedule"}]}}`
		}
		if err := write(ctx, "label node "+m.Name, func() error {
			_, err := client.CoreV1().Nodes().Patch(ctx, m.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// waitRegistry waits until the private registry refuses an anonymous
// client and accepts the sandbox's user.
func (s *State) waitRegistry(ctx context.Context) error {
	caPEM, err := os.ReadFile(s.Registry.CAFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, DialContext: s.NetNS().DialContext}}
	var last string
	err = poll(ctx, time.Minute, func() (bool, error) {
		anon, err := hc.Get("https://" + s.Registry.Address + "/v2/")
		if err != nil {
			last = err.Error()
			return false, nil
		}
		anon.Body.Close()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+s.Registry.Address+"/v2/", nil)
		req.SetBasicAuth(s.Registry.User, s.Registry.Password)
		authed, err := hc.Do(req)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		authed.Body.Close()
		last = fmt.Sprintf("anonymous %d, %s %d", anon.StatusCode, s.Registry.User, authed.StatusCode)
		return anon.StatusCode == http.StatusUnauthorized && authed.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("private registry %s (last: %s): %w\n%s", s.Registry.Address, last, err, s.UnitLog(s.Admin(), "docker-registry", 2000))
	}
	return nil
}

// poll calls cond every 250ms until it is true, fails, or limit passes.
func poll(ctx context.Context, limit time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up after %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Run runs command on node over SSH (as root, host key checked) and
// returns its standard output; a non-zero exit is an error carrying its
// standard error.
func (s *State) Run(ctx context.Context, node, command string) ([]byte, error) {
	c, err := s.SSH(ctx, node)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		return nil, err
	}
	defer sess.Close()
	var stderr strings.Builder
	sess.Stderr = &stderr
	out, err := sess.Output(command)
	if err != nil {
		return out, fmt.Errorf("%s: %q: %w: %s", node, command, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Containers reads node's containers over SSH with "crictl ps -a -o
// json", as kubelift does.
func (s *State) Containers(ctx context.Context, node string) ([]kubeletcompat.RuntimeContainer, error) {
	out, err := s.Run(ctx, node, "crictl ps -a -o json")
	if err != nil {
		return nil, err
	}
	cs, err := kubeletcompat.ParseCrictl(out)
	if err != nil {
		return nil, fmt.Errorf("crictl ps on %s: %w", node, err)
	}
	return cs, nil
}
