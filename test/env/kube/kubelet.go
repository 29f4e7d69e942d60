package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubelift/kubelift/internal/kubeletcompat"
)

// KubeletOptions describe one kubelet process of a node.
type KubeletOptions struct {
	Binary      string
	NodeName    string
	Dir         string // the node's state: root dir, certs, logs
	Kubeconfig  string
	CRIEndpoint string // unix:///...
	NetNS       *NetNS
	Env         []string
}

// Kubelet is a running kubelet.
type Kubelet struct {
	Opts    KubeletOptions
	LogPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	state   string
}

// StartKubelet starts the real kubelet with the flags that work without
// cgroup management, logging at -v=3 (computePodActions is logged there).
func StartKubelet(o KubeletOptions) (*Kubelet, error) {
	for _, d := range []string{"logs", "cwd", "pod-logs"} {
		if err := os.MkdirAll(filepath.Join(o.Dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	// A configuration file, as real nodes have: with flags alone podLogsDir
	// is empty, and the kubelet's cleanup of orphaned pod logs then deletes
	// entries of its working directory (seen with 1.30.14 and 1.31.4).
	config := filepath.Join(o.Dir, "kubelet-config.yaml")
	cfg := fmt.Sprintf("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: %s\n", filepath.Join(o.Dir, "pod-logs"))
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	args := []string{
		"--config", config,
		"--kubeconfig", o.Kubeconfig,
		"--container-runtime-endpoint", o.CRIEndpoint,
		"--root-dir", filepath.Join(o.Dir, "root"),
		"--cert-dir", filepath.Join(o.Dir, "pki"),
		"--hostname-override", o.NodeName,
		"--node-ip", o.NetNS.Addr, "--address", o.NetNS.Addr,
		"--read-only-port", "0", "--healthz-port", "0",
		"--cgroups-per-qos=false", "--enforce-node-allocatable=", "--fail-swap-on=false", "--cgroup-driver=cgroupfs",
		"--eviction-hard=", "--local-storage-capacity-isolation=false",
		"--sync-frequency", "5s", "--node-status-update-frequency", "2s",
		"--volume-plugin-dir", filepath.Join(o.Dir, "volume-plugins"),
		"--v", "3",
	}
	logs, _ := filepath.Glob(filepath.Join(o.Dir, "logs", "kubelet-*.log"))
	k := &Kubelet{Opts: o, LogPath: filepath.Join(o.Dir, "logs", fmt.Sprintf("kubelet-%d.log", len(logs)+1))}
	logf, err := os.Create(k.LogPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	// Its own mount namespace (a copy of the host's, so /sys/fs/cgroup is
	// there): the kubelet bind-mounts its root dir and mounts volumes, and
	// all of it goes away with the process. Some of its paths are constants,
	// not under --root-dir (/var/lib/kubelet/device-plugins, pod-resources,
	// plugins_registry; /var/log/containers): an overlay over their parents
	// sends those writes to the node's directory, never the host's.
	script := HostOverlays(filepath.Join(o.Dir, "overlay"), PrivateHostDirs...) + `exec "$0" "$@"`
	k.cmd = o.NetNS.Command("unshare", append([]string{"--mount", "--propagation", "private", "--", "sh", "-ec", script, o.Binary}, args...)...)
	k.cmd.Env = append(os.Environ(), o.Env...)
	k.cmd.Dir = filepath.Join(o.Dir, "cwd") // empty; never the caller's directory (the repository)
	k.cmd.Stdout, k.cmd.Stderr = logf, logf
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := k.cmd.Start(); err != nil {
		return nil, err
	}
	k.exited = make(chan struct{})
	go func() {
		err := k.cmd.Wait()
		k.state = fmt.Sprintf("exited: %v", err)
		close(k.exited)
	}()
	return k, nil
}

// PrivateHostDirs are the host directories a node process may write below
// on its own: the kubelet's constant paths (/var/lib/kubelet/...,
// /var/log/containers) and the node trees' mount points (/etc/kubernetes).
var PrivateHostDirs = []string{"/etc", "/var/lib", "/var/log"}

// HostOverlays returns a shell prologue, for a private mount namespace,
// that lays an overlay over each dir with its upper layer below work: the
// host's files stay visible, and whatever is written there lands in work.
func HostOverlays(work string, dirs ...string) string {
	var b strings.Builder
	for _, d := range dirs {
		up := filepath.Join(work, strings.ReplaceAll(strings.Trim(d, "/"), "/", "_"))
		fmt.Fprintf(&b, "mkdir -p '%[1]s/upper' '%[1]s/work' && mount -t overlay overlay -o 'lowerdir=%[2]s,upperdir=%[1]s/upper,workdir=%[1]s/work' '%[2]s'\n", up, d)
	}
	return b.String()
}

// State says whether the process still runs, for failure messages.
func (k *Kubelet) State() string {
	select {
	case <-k.exited:
		return k.state
	default:
		return fmt.Sprintf("running (pid %d)", k.cmd.Process.Pid)
	}
}

// Stop sends SIGTERM, as systemctl stop does, then SIGKILL after 10s, and
// waits for the process (by pid) to be gone.
func (k *Kubelet) Stop() {
	pid := k.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	for i := 0; i < 500 && syscall.Kill(pid, 0) == nil; i++ {
		if i == 200 {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// LogContains counts lines of this kubelet's log that contain every part.
func (k *Kubelet) LogContains(parts ...string) int {
	data, _ := os.ReadFile(k.LogPath)
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// UnmountUnder lazily unmounts every mount at or below dir (deepest
// first), so that removing dir cannot cross into a mounted tree. Tests
// call it before their temporary directories are removed.
func UnmountUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var mounts []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mounts = append(mounts, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	var errs []error
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// RuntimeContainers reads every container from a CRI endpoint as
// kubeletcompat sees them (the runtime's own records: labels, annotations,
// start time).
func RuntimeContainers(ctx context.Context, endpoint string) ([]kubeletcompat.RuntimeContainer, error) {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	list, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, fmt.Errorf("CRI ListContainers: %w", err)
	}
	var out []kubeletcompat.RuntimeContainer
	for _, c := range list.Containers {
		st, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.Id})
		if removedSinceListed(err) {
			continue // the kubelet removed it between the list and its status: gone
		}
		if err != nil {
			return nil, fmt.Errorf("CRI ContainerStatus %s: %w", c.Id, err)
		}
		s := st.Status
		out = append(out, kubeletcompat.RuntimeContainer{
			ID: s.Id, PodUID: s.Labels["io.kubernetes.pod.uid"], Namespace: s.Labels["io.kubernetes.pod.namespace"],
			Pod: s.Labels["io.kubernetes.pod.name"], Name: s.Labels["io.kubernetes.container.name"],
			Running: s.State == runtimeapi.ContainerState_CONTAINER_RUNNING, StartedAt: time.Unix(0, s.StartedAt),
			Hash: s.Annotations[kubeletcompat.HashAnnotation], HashWithoutResources: s.Annotations[kubeletcompat.HashWithoutResourcesAnnotation],
		})
	}
	return out, nil
}

// removedSinceListed says err is a runtime's answer for a container that
// does not exist: NotFound from a real runtime, and from the CRI
// stand-in (upstream's fake runtime service, whose plain errors reach
// gRPC as Unknown) "container ... not found".
func removedSinceListed(err error) bool {
	if err == nil {
		return false
	}
	if status.Code(err) == codes.NotFound {
		return true
	}
	msg := status.Convert(err).Message()
	return strings.HasPrefix(msg, "container ") && strings.HasSuffix(msg, " not found")
}

// RunningIDs lists "pod/container=ID" of the running containers of pods,
// sorted: equal before and after a kubelet restart when none restarted.
func RunningIDs(rcs []kubeletcompat.RuntimeContainer, pods []string) string {
	var ids []string
	for _, rc := range rcs {
		for _, p := range pods {
			if rc.Pod == p && rc.Running {
				ids = append(ids, rc.Pod+"/"+rc.Name+"="+rc.ID)
			}
		}
	}
	sort.Strings(ids)
	return strings.Join(ids, " ")
}
