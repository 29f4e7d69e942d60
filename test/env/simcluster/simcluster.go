// Package simcluster runs a real etcd, kube-apiserver and
// kube-controller-manager on loopback with KWOK simulating the nodes, for
// kubelift's scale benchmark and its many-node tests: thousands of Nodes
// whose status, leases and pods behave like kubelets' (Ready, heartbeats,
// a restart that comes back after a delay at a new kubeletVersion), against
// the real API server, admission and node lifecycle controller (which
// taints NotReady nodes and evicts what does not tolerate it). A thousand
// nodes with 5000 pods take about 1 GB and a fifth of a core at rest, 5000
// nodes about 2.2 GB and 1.3 cores (mostly the API server renewing leases).
// Processes are stopped by pid.
package simcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/kubelift/kubelift/test/env/kube"
)

// BuildScript builds KWOK and prints the binary's path.
const BuildScript = "hack/build-kwok.sh"

// Options configure Start.
type Options struct {
	// Dir holds everything the cluster writes (etcd's data, certificates,
	// kubeconfigs, logs, the audit log).
	Dir string
	// KubeBin is the directory holding kube-apiserver and
	// kube-controller-manager (kube.Binaries).
	KubeBin string
	// Kwok is the kwok binary (default: built by hack/build-kwok.sh), with
	// KWOK's pod stages beside it (PodStagesFile).
	Kwok string
	// Host is the loopback address the API server binds and advertises
	// (default 127.0.0.1).
	Host string
	// RestartDelay and RestartJitter: a node whose kubelet is restarting
	// (ReasonKubeletRestarting) is Ready again RestartDelay plus a random
	// jitter below RestartJitter after the condition's lastTransitionTime.
	// Whole seconds are exact; KWOK's timestamps are in seconds.
	RestartDelay, RestartJitter time.Duration
	// LeaseDuration of node leases (default 40s, as kubelets'); KWOK
	// renews every quarter of it, and the node lifecycle controller's grace
	// period follows it. Longer leases lighten the API server at thousands
	// of nodes (1000 nodes at 40 s: 100 lease updates a second).
	LeaseDuration time.Duration
	// HeartbeatInterval is how often KWOK refreshes a Ready node's
	// conditions' lastHeartbeatTime (default 10m, KWOK's; the leases keep
	// nodes healthy in between, as kubelets' do).
	HeartbeatInterval time.Duration
	// NodeEvictionRate is how many nodes a second the node lifecycle
	// controller may taint NoExecute per zone (all nodes here are in one).
	// Default 100, so that every NotReady node is tainted within a monitor
	// period and pods without tolerations are evicted from it: the worst
	// case. Kubernetes' own default, 0.1, taints one node every 10 s.
	NodeEvictionRate float64
	// Log reports progress (nil: silent).
	Log func(format string, args ...any)
}

// Cluster is a running control plane with KWOK.
type Cluster struct {
	// Client is an admin client (user agent "simcluster").
	Client kubernetes.Interface
	// Kubeconfig is an admin kubeconfig (system:masters, client
	// certificate).
	Kubeconfig string
	// URL is the API server's.
	URL string
	// AuditLog is the API server's audit log (JSON lines, Metadata level,
	// without KWOK's, the controller-manager's and the API server's own
	// requests); read it with AuditRequests.
	AuditLog string

	o         Options
	api       *kube.APIServer
	procs     []*process
	nodeStore cache.Store
	nodeInf   cache.SharedIndexInformer
	stopInf   context.CancelFunc
	nodes     []string
	pods      int // pods per node made so far, for names
}

// Users the components run as, by token: distinct from the admin, so the
// audit policy leaves them out and API Priority and Fairness classifies
// them as it would kubelets (flow schema system-nodes, by the group) and
// the controller-manager (kube-controller-manager, by the user).
const (
	kwokUser = "kwok"
	kcmUser  = "system:kube-controller-manager"
)

// Start starts etcd, kube-apiserver, kube-controller-manager and KWOK, and
// returns once the API server answers and the components are running.
func Start(ctx context.Context, o Options) (_ *Cluster, err error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = 40 * time.Second
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = 10 * time.Minute
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.NodeEvictionRate == 0 {
		o.NodeEvictionRate = 100
	}
	if o.Kwok == "" {
		if o.Kwok, err = KwokBinary(ctx); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	c := &Cluster{o: o, AuditLog: filepath.Join(o.Dir, "audit.log")}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	tokens := map[string]string{kwokUser: randomToken(), kcmUser: randomToken()}
	tokenFile := filepath.Join(o.Dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(fmt.Sprintf("%s,%s,%s,\"system:nodes\"\n%s,%s,%s\n",
		tokens[kwokUser], kwokUser, kwokUser, tokens[kcmUser], kcmUser, kcmUser)), 0o600); err != nil {
		return nil, err
	}
	policy := filepath.Join(o.Dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		return nil, err
	}
	o.Log("simcluster: etcd and kube-apiserver on %s", o.Host)
	c.api, err = kube.StartAPIServer(ctx, filepath.Join(o.Dir, "apiserver"), o.KubeBin, kube.APIServerOptions{Host: o.Host, ExtraArgs: []string{
		// Sized for 5000 nodes (the Kubernetes scalability tests' values).
		"--max-requests-inflight=3000", "--max-mutating-requests-inflight=1000",
		"--token-auth-file=" + tokenFile,
		"--audit-policy-file=" + policy, "--audit-log-path=" + c.AuditLog,
		"--audit-log-maxsize=100000", "--audit-log-maxbackup=0",
		// Pods get the not-ready/unreachable tolerations from AddPods, so
		// that some can go without.
		"--disable-admission-plugins=DefaultTolerationSeconds",
		// As a real cluster's: its CNI and kube-proxy run privileged, and
		// so do agent mode's agents.
		"--allow-privileged=true",
	}})
	if err != nil {
		return nil, err
	}
	c.URL, c.Kubeconfig = c.api.URL, c.api.Kubeconfig
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "simcluster"
	cfg.QPS, cfg.Burst = 1000, 2000
	// Certificates inline: client-go watches certificate files for the
	// life of the process, and these go when the cluster's directory does.
	if err := rest.LoadTLSFiles(cfg); err != nil {
		return nil, err
	}
	cfg.CertFile, cfg.KeyFile, cfg.CAFile = "", "", ""
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "simcluster:components"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{
			{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: kwokUser},
			{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: kcmUser},
		},
	}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("cluster role binding for the components: %w", err)
	}

	pki := filepath.Join(o.Dir, "apiserver", "pki")
	ca := filepath.Join(pki, "ca.crt")
	kubeconfigs := map[string]string{}
	for user, token := range tokens {
		name := strings.TrimPrefix(user, "system:")
		kubeconfigs[user] = filepath.Join(o.Dir, name+".kubeconfig")
		if err := os.WriteFile(kubeconfigs[user], []byte(tokenKubeconfig(c.URL, ca, name, token)), 0o600); err != nil {
			return nil, err
		}
	}

	o.Log("simcluster: kube-controller-manager")
	if err := c.start("kube-controller-manager", filepath.Join(o.KubeBin, "kube-controller-manager"),
		"--kubeconfig", kubeconfigs[kcmUser],
		"--leader-elect=false",
		// No serving: nothing scrapes it, and parallel clusters would
		// fight over the default port.
		"--secure-port=0",
		"--service-account-private-key-file", filepath.Join(pki, "sa.key"),
		"--root-ca-file", ca,
		"--use-service-account-credentials=false",
		// The node lifecycle controller (on by default) taints NotReady
		// nodes with node.kubernetes.io/not-ready:NoExecute within a
		// monitor period, and the taint eviction controller evicts pods
		// that do not tolerate it.
		// A node is unhealthy once its lease is a lease duration old.
		"--node-monitor-period=5s", fmt.Sprintf("--node-monitor-grace-period=%s", max(40*time.Second, o.LeaseDuration)),
		// The same rate when the zone looks disrupted (while nodes are
		// being added, many are not Ready yet): otherwise it stops tainting
		// there and, back to normal, starts with an empty token bucket.
		fmt.Sprintf("--node-eviction-rate=%g", o.NodeEvictionRate),
		fmt.Sprintf("--secondary-node-eviction-rate=%g", o.NodeEvictionRate),
		"--kube-api-qps=200", "--kube-api-burst=400",
		"-v=1"); err != nil {
		return nil, err
	}

	// Its service account controller making default/default says its
	// controllers run.
	if err := c.waitServiceAccount(ctx, "default", "default"); err != nil {
		return nil, fmt.Errorf("kube-controller-manager: %w", err)
	}

	// KWOK's own pod stages (hack/build-kwok.sh puts them beside the
	// binary): since v0.8.0 it plays none it is not given.
	podStages, err := os.ReadFile(filepath.Join(filepath.Dir(o.Kwok), PodStagesFile))
	if err != nil {
		return nil, fmt.Errorf("kwok's pod stages: %w", err)
	}
	kwokConf := filepath.Join(o.Dir, "kwok.yaml")
	if err := os.WriteFile(kwokConf, []byte(kwokConfig(o, string(podStages))), 0o644); err != nil {
		return nil, err
	}
	o.Log("simcluster: kwok (%s)", o.Kwok)
	if err := c.start("kwok", o.Kwok, "--kubeconfig", kubeconfigs[kwokUser], "--config", kwokConf, "--manage-all-nodes=true"); err != nil {
		return nil, err
	}

	// One informer on Nodes serves every wait.
	infCtx, cancel := context.WithCancel(context.Background())
	c.stopInf = cancel
	c.nodeInf = informers.NewSharedInformerFactory(c.Client, 0).Core().V1().Nodes().Informer()
	c.nodeStore = c.nodeInf.GetStore()
	go c.nodeInf.Run(infCtx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.nodeInf.HasSynced) {
		return nil, fmt.Errorf("node informer: %w", context.Cause(ctx))
	}
	return c, nil
}

// PodStagesFile is the file beside the kwok binary that holds the pod
// stages KWOK ships (pod-ready, pod-complete, pod-delete), which
// hack/build-kwok.sh copies from its module.
const PodStagesFile = "pod-stages.yaml"

// KwokBinary returns the path of the kwok binary, building it with
// hack/build-kwok.sh if needed (minutes when cold, cached after). Its pod
// stages are beside it (PodStagesFile).
func KwokBinary(ctx context.Context) (string, error) {
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "..", BuildScript)
	cmd := exec.CommandContext(ctx, script)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w", BuildScript, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Pids are the processes the cluster runs, by name (etcd and
// kube-apiserver among them).
func (c *Cluster) Pids() map[string]int {
	m := map[string]int{}
	if c.api != nil {
		m = c.api.Pids()
	}
	for _, p := range c.procs {
		m[p.name] = p.cmd.Process.Pid
	}
	return m
}

// Stop kills KWOK, the controller-manager, the API server and etcd, by
// pid, and waits for them to exit.
func (c *Cluster) Stop() {
	if c.stopInf != nil {
		c.stopInf()
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop()
	}
	c.procs = nil
	if c.api != nil {
		c.api.Stop()
		c.api = nil
	}
}

// process is a component the cluster started.
type process struct {
	name, log string
	cmd       *exec.Cmd
	done      chan struct{}
	err       error
}

func (c *Cluster) start(name, bin string, args ...string) error {
	logPath := filepath.Join(c.o.Dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = c.o.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	p := &process{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	c.procs = append(c.procs, p)
	return nil
}

func (p *process) stop() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// exited reports the first component that is no longer running, with the
// end of its log.
func (c *Cluster) exited() error {
	for _, p := range c.procs {
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.log)
			if len(b) > 2000 {
				b = b[len(b)-2000:]
			}
			return fmt.Errorf("%s exited (%v):\n%s", p.name, p.err, b)
		default:
		}
	}
	return nil
}

// ensureNamespace creates a namespace and its default service account
// (which pod admission requires, and the controller-manager would make
// only a moment later).
func (c *Cluster) ensureNamespace(ctx context.Context, name string) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	_, err = c.Client.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: default service account: %w", name, err)
	}
	return nil
}

func (c *Cluster) waitServiceAccount(ctx context.Context, namespace, name string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	byName := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (k8sruntime.Object, error) {
			o.FieldSelector = byName
			return c.Client.CoreV1().ServiceAccounts(namespace).List(ctx, o)
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return c.Client.CoreV1().ServiceAccounts(namespace).Watch(ctx, o)
		},
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.ServiceAccount{}, nil, func(ev watch.Event) (bool, error) {
		if err := c.exited(); err != nil {
			return false, err
		}
		return ev.Type == watch.Added || ev.Type == watch.Modified, nil
	})
	if err != nil {
		if e := c.exited(); e != nil {
			return e
		}
		return fmt.Errorf("service account %s/%s: %w", namespace, name, err)
	}
	return nil
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func tokenKubeconfig(server, caFile, user, token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: simcluster
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: %s
  context: {cluster: simcluster, user: %s}
current-context: %s
`, server, caFile, user, token, user, user, user)
}
