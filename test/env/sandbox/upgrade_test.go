package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/pkg/hashskip"
	"github.com/kubelift/kubelift/test/env/kube"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

// pinnedPods creates count two-container pods bound to the node in
// namespace ns (with the given tolerations) and waits until they run.
func pinnedPods(t *testing.T, m sandbox.Machine, ns, prefix string, count int, tol []corev1.Toleration) []string {
	t.Helper()
	ctx := context.Background()
	if err := sandbox.EnsureNamespace(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := 0; i < count; i++ {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i), Namespace: ns}, Spec: sb.PodSpec(tol)}
		p.Spec.NodeName = m.Name
		if _, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		names = append(names, p.Name)
	}
	if err := sandbox.WaitPodsRunning(ctx, client, ns, 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, kubeletLog(m)())
	}
	return names
}

// restartCounts maps "pod/container" to the kubelet's restart count.
func restartCounts(t *testing.T, ns string, pods []string) map[string]int32 {
	t.Helper()
	out := map[string]int32{}
	for _, name := range pods {
		p, err := client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cs := range p.Status.ContainerStatuses {
			out[name+"/"+cs.Name] = cs.RestartCount
		}
	}
	return out
}

// runningContainers lists "pod/container=ID@PID" of the runtime's running
// containers of pods, read over SSH as an operator would: the container
// IDs from crictl (sb.Containers), each one's process from containerd's
// tasks ("ctr -n k8s.io tasks ls"). The same string before and after
// means the same processes still run.
func runningContainers(t *testing.T, m sandbox.Machine, pods []string) string {
	t.Helper()
	rcs, err := sb.Containers(context.Background(), m.Name)
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]string{}
	for _, line := range strings.Split(ssh(t, m.Name, "ctr -n k8s.io tasks ls", nil), "\n")[1:] {
		if f := strings.Fields(line); len(f) == 3 && f[2] == "RUNNING" {
			pids[f[0]] = f[1]
		}
	}
	var out []string
	for _, id := range strings.Fields(kube.RunningIDs(rcs, pods)) {
		full := id[strings.IndexByte(id, '=')+1:]
		pid := ""
		for task, p := range pids {
			if strings.HasPrefix(task, full) {
				pid = p
			}
		}
		if pid == "" {
			t.Fatalf("%s: container %s has no running containerd task (tasks %v)", m.Name, id, pids)
		}
		out = append(out, id+"@"+pid)
	}
	return strings.Join(out, " ")
}

func kubeletLogSize(m sandbox.Machine) int64 {
	fi, err := os.Stat(filepath.Join(m.Root, "var/log/units/kubelet.log"))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// installKubelet replaces the node's /usr/local/bin/kubelet with binary
// over SSH (upload, then rename, as an operator or the engine would) and
// runs "systemctl restart kubelet"; then waits until the Node is Ready at
// version and the new kubelet has evaluated every pod in pods.
func installKubelet(t *testing.T, m sandbox.Machine, binary, version, ns string, pods []string) {
	t.Helper()
	offset := kubeletLogSize(m)
	before := strings.TrimSpace(ssh(t, m.Name, "systemctl show kubelet -p MainPID", nil))
	if binary == "" {
		ssh(t, m.Name, "systemctl restart kubelet", nil)
	} else {
		installComponent(t, m, "kubelet", binary)
	}
	if after := strings.TrimSpace(ssh(t, m.Name, "systemctl show kubelet -p MainPID", nil)); after == before {
		t.Fatalf("kubelet on %s not restarted (%s)", m.Name, after)
	}
	if got := strings.TrimSpace(ssh(t, m.Name, "/usr/local/bin/kubelet --version", nil)); got != "Kubernetes "+version {
		t.Fatalf("kubelet on %s is %q, want %s", m.Name, got, version)
	}
	// What the wait saw last, said when it gives up.
	var seen struct {
		ready     string
		version   string
		evaluated []string
		errors    []string
	}
	waitFor(t, m.Name+" Ready at "+version+" and every pod evaluated by the new kubelet", func() (bool, error) {
		n := getNode(t, m.Name)
		seen.ready, seen.version = "no Ready condition", n.Status.NodeInfo.KubeletVersion
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				seen.ready = fmt.Sprintf("Ready=%s (%s: %s)", c.Status, c.Reason, c.Message)
			}
		}
		data, err := os.ReadFile(filepath.Join(m.Root, "var/log/units/kubelet.log"))
		if err != nil || int64(len(data)) < offset {
			return false, err
		}
		// Only what the new kubelet logged counts: the old one, until it
		// stops, logs its own evaluations after offset too, and the Node
		// reports the new version before the new kubelet's first sync (a
		// CI run judged a swap by the old kubelet's lines).
		logged := string(data[offset:])
		start := strings.LastIndex(logged, "systemd: Starting kubelet.service")
		if start < 0 {
			return false, nil
		}
		evaluated := map[string]bool{}
		seen.errors = seen.errors[:0]
		for _, line := range strings.Split(logged[start:], "\n") {
			if strings.HasPrefix(line, "E") {
				seen.errors = append(seen.errors, line)
			}
			if strings.Contains(line, "computePodActions got for pod") {
				for _, p := range pods {
					if strings.Contains(line, fmt.Sprintf(`pod="%s/%s"`, ns, p)) {
						evaluated[p] = true
					}
				}
			}
		}
		seen.evaluated = seen.evaluated[:0]
		for p := range evaluated {
			seen.evaluated = append(seen.evaluated, p)
		}
		return sandbox.NodeReady(n) && n.Status.NodeInfo.KubeletVersion == version && len(evaluated) == len(pods), nil
	}, func() string {
		errs := seen.errors
		if len(errs) > 15 {
			errs = errs[len(errs)-15:]
		}
		return fmt.Sprintf("node %s: %s, kubelet %s; pods evaluated by the new kubelet: %v of %v; its last errors:\n%s",
			m.Name, seen.ready, seen.version, seen.evaluated, pods, strings.Join(errs, "\n"))
	}, kubeletLog(m))
}

// installComponent replaces /usr/local/bin/NAME on a node with binary
// over SSH (upload beside it, rename into place) and restarts its unit.
func installComponent(t *testing.T, m sandbox.Machine, name, binary string) {
	t.Helper()
	f, err := os.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ssh(t, m.Name, fmt.Sprintf("cat > /usr/local/bin/.%[1]s.new && chmod 755 /usr/local/bin/.%[1]s.new && mv -f /usr/local/bin/.%[1]s.new /usr/local/bin/%[1]s && systemctl restart %[1]s", name), f)
}

// upgradeControlPlane brings cp-1's kube-apiserver, controller manager and
// scheduler to the new version in place, unless they are there already:
// the skew policy puts the control plane first (a v1.31 kubelet cannot
// start containers against a v1.30 API server: it lists Services by
// spec.clusterIP, which v1.30 does not serve).
func upgradeControlPlane(t *testing.T) {
	t.Helper()
	if v, err := client.Discovery().ServerVersion(); err == nil && v.GitVersion == cfg.NewVersion {
		return
	}
	cp := node(t, "cp-1")
	for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		installComponent(t, cp, c, filepath.Join(sb.Binaries.New, c))
	}
	waitFor(t, "kube-apiserver at "+cfg.NewVersion, func() (bool, error) {
		v, err := client.Discovery().ServerVersion()
		return err == nil && v.GitVersion == cfg.NewVersion, nil
	}, func() string { return sb.UnitLog(cp, "kube-apiserver", 3000) })
	// The controller manager and scheduler exit while the API server
	// restarts, and their units start them again.
	waitFor(t, "controller manager and scheduler active", func() (bool, error) {
		out, err := sshOutput(cp.Name, "systemctl is-active kube-controller-manager kube-scheduler")
		return err == nil && out == "active\nactive\n", nil
	}, func() string { return sb.UnitLog(cp, "kube-controller-manager", 2000) })
	waitFor(t, "every node Ready", func() (bool, error) {
		for _, m := range sb.Nodes() {
			if !sandbox.NodeReady(getNode(t, m.Name)) {
				return false, nil
			}
		}
		return true, nil
	})
}

// The control plane goes first, in place: new binaries, the same
// certificates and etcd data; nodes stay Ready and no container restarts.
func TestControlPlaneInPlace(t *testing.T) {
	ctx := context.Background()
	before, err := client.CoreV1().Pods(sandbox.WorkloadNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	upgradeControlPlane(t)
	for _, c := range []string{"kube-controller-manager", "kube-scheduler"} {
		out := ssh(t, "cp-1", "/usr/local/bin/"+c+" --version; systemctl is-active "+c, nil)
		if out != "Kubernetes "+cfg.NewVersion+"\nactive\n" {
			t.Errorf("%s on cp-1: %q", c, out)
		}
	}
	after, err := client.CoreV1().Pods(sandbox.WorkloadNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Items) != len(before.Items) {
		t.Errorf("%d pods before, %d after", len(before.Items), len(after.Items))
	}
	for _, p := range after.Items {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount != 0 {
				t.Errorf("%s/%s restarted %d times", p.Name, cs.Name, cs.RestartCount)
			}
		}
	}
}

// Restarting a kubelet at the same version restarts no container; then
// replacing v1.30.14 by v1.31.4 in place restarts every running container
// on the node (kubernetes#129385, the upstream behaviour kubelift exists
// to remove).
func TestKubeletInPlaceUpstream(t *testing.T) {
	upgradeControlPlane(t)
	m := node(t, "worker-1")
	ns := "upstream"
	// The pods tolerate not-ready for a while, as kubelift makes every pod
	// do before it swaps a kubelet: a kubelet that starts under load
	// reports NotReady for a moment, and the taint manager deletes a pod
	// with no toleration at once (TestEvictionAfterKubeletStops); here
	// only the containers' restarts are measured.
	pods := pinnedPods(t, m, ns, "app", 2, sandbox.NotReadyTolerations())
	ids := runningContainers(t, m, pods)
	if strings.Count(ids, "=") != 4 {
		t.Fatalf("runtime holds %q, want 4 running containers", ids)
	}

	installKubelet(t, m, "", cfg.OldVersion, ns, pods)
	for k, c := range restartCounts(t, ns, pods) {
		if c != 0 {
			t.Errorf("same-version restart: %s restart count %d", k, c)
		}
	}
	if got := runningContainers(t, m, pods); got != ids {
		t.Errorf("same-version restart replaced containers:\nbefore %s\nafter  %s", ids, got)
	}

	installKubelet(t, m, filepath.Join(sb.Binaries.New, "kubelet"), cfg.NewVersion, ns, pods)
	waitFor(t, "every container restarted by the new kubelet", func() (bool, error) {
		for _, c := range restartCounts(t, ns, pods) {
			if c < 1 {
				return false, nil
			}
		}
		return true, nil
	}, kubeletLog(m))
	counts := restartCounts(t, ns, pods)
	if len(counts) != 4 {
		t.Fatalf("restart counts %v, want 4 containers", counts)
	}
	for k, c := range counts {
		if c != 1 {
			t.Errorf("%s restart count %d, want 1", k, c)
		}
	}
	if got := runningContainers(t, m, pods); strings.Count(got, "=") != 4 || sharesAny(got, ids) {
		t.Errorf("containers not replaced:\nbefore %s\nafter  %s", ids, got)
	}
}

func sharesAny(a, b string) bool {
	for _, x := range strings.Fields(a) {
		if strings.Contains(" "+b+" ", " "+x+" ") {
			return true
		}
	}
	return false
}

// The same 1.30 -> 1.31 swap with kubelift's hash-skip kubelet and the
// cache written restarts none.
func TestKubeletInPlaceHashSkip(t *testing.T) {
	upgradeControlPlane(t)
	m := node(t, "worker-2")
	_, file, _, _ := runtime.Caller(0)
	out, err := exec.Command(filepath.Join(filepath.Dir(file), "..", "..", "..", "hack", "build-kubelet.sh"), cfg.NewVersion).Output()
	if err != nil {
		t.Fatalf("hack/build-kubelet.sh %s: %v", cfg.NewVersion, err)
	}
	patched := strings.TrimSpace(string(out))
	ns := "hashskip"
	pods := pinnedPods(t, m, ns, "app", 2, sandbox.NotReadyTolerations())
	ids := runningContainers(t, m, pods)
	cache := &hashskip.File{OldKubeletVersion: cfg.OldVersion, OldHashEra: hashskip.EraJSONWithoutResources, NewKubeletVersion: cfg.NewVersion, UpgradedAt: time.Now()}
	local := filepath.Join(t.TempDir(), "cache.json")
	if err := hashskip.Write(local, cache); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(local)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ssh(t, m.Name, fmt.Sprintf("cat > %[1]s.partial && mv -f %[1]s.partial %[1]s", hashskip.DefaultPath), f)
	installKubelet(t, m, patched, cfg.NewVersion, ns, pods)
	for k, c := range restartCounts(t, ns, pods) {
		if c != 0 {
			t.Errorf("hash-skip swap: %s restart count %d", k, c)
		}
	}
	if got := runningContainers(t, m, pods); got != ids {
		t.Errorf("hash-skip swap replaced containers:\nbefore %s\nafter  %s", ids, got)
	}
	if !strings.Contains(sb.UnitLog(m, "kubelet", 1<<22), "kubelift: container started by kubelet "+cfg.OldVersion+" keeps running") {
		t.Errorf("the hash-skip kubelet logged no skipped comparison")
	}
}

// A kubelet stopped past the grace period: the node goes NotReady, gets
// the NoExecute unreachable taint, and the real controller manager evicts
// the pod without tolerations while the pod with them stays.
func TestEvictionAfterKubeletStops(t *testing.T) {
	ctx := context.Background()
	m := node(t, "worker-3")
	ns := "eviction"
	bare := pinnedPods(t, m, ns, "intolerant", 1, nil)[0]
	tolerant := pinnedPods(t, m, ns, "tolerant", 1, sandbox.NotReadyTolerations())[0]
	p, err := client.CoreV1().Pods(ns).Get(ctx, bare, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.Tolerations) != 0 {
		t.Fatalf("pod %s was given tolerations %v (DefaultTolerationSeconds should be off)", bare, p.Spec.Tolerations)
	}

	ssh(t, m.Name, "systemctl stop kubelet", nil)
	t.Cleanup(func() { ssh(t, m.Name, "systemctl start kubelet", nil) })
	waitFor(t, m.Name+" NotReady with the unreachable NoExecute taint", func() (bool, error) {
		n := getNode(t, m.Name)
		for _, taint := range n.Spec.Taints {
			if taint.Key == corev1.TaintNodeUnreachable && taint.Effect == corev1.TaintEffectNoExecute {
				return !sandbox.NodeReady(n), nil
			}
		}
		return false, nil
	})
	waitFor(t, "pod "+bare+" evicted", func() (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, bare, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && p.DeletionTimestamp != nil, err
	})
	p, err = client.CoreV1().Pods(ns).Get(ctx, tolerant, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.DeletionTimestamp != nil {
		t.Errorf("pod %s with tolerations was evicted too", tolerant)
	}

	ssh(t, m.Name, "systemctl start kubelet", nil)
	waitFor(t, m.Name+" Ready again", func() (bool, error) { return sandbox.NodeReady(getNode(t, m.Name)), nil }, kubeletLog(m))
}

// Removing a label a pod's nodeSelector needs and restarting the kubelet
// fails that pod with reason NodeAffinity: the kubelet re-admits every
// pod when it starts.
func TestNodeAffinityAfterLabelRemoval(t *testing.T) {
	ctx := context.Background()
	m := node(t, "worker-4")
	ns := "affinity"
	patch := func(value string) {
		body := fmt.Sprintf(`{"metadata":{"labels":{"kubelift.io/tier":%s}}}`, value)
		if _, err := client.CoreV1().Nodes().Patch(ctx, m.Name, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch(`"gold"`)
	// Tolerating not-ready: a kubelet that restarts may report NotReady for
	// a moment, and the taint manager would delete a pod without the
	// toleration at once (DefaultTolerationSeconds is off): the pod would
	// be gone, not failed (a run on the real runtime saw it).
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gold-only", Namespace: ns}, Spec: sb.PodSpec(sandbox.NotReadyTolerations())}
	p.Spec.NodeSelector = map[string]string{"kubelift.io/tier": "gold"}
	if err := sandbox.EnsureNamespace(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	if err := sandbox.CreateSelectingPod(ctx, client, p, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, _ := client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{}); got.Spec.NodeName != m.Name {
		t.Fatalf("pod scheduled to %q, want %s (the only gold node)", got.Spec.NodeName, m.Name)
	}
	patch("null")
	// Without a restart nothing happens: the kubelet admits pods once.
	if got, _ := client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{}); got.Status.Phase != corev1.PodRunning {
		t.Fatalf("pod %s is %s before the kubelet restarted", p.Name, got.Status.Phase)
	}
	ssh(t, m.Name, "systemctl restart kubelet", nil)
	waitFor(t, "pod "+p.Name+" Failed with reason NodeAffinity", func() (bool, error) {
		got, err := client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return got.Status.Phase == corev1.PodFailed && got.Status.Reason == "NodeAffinity", nil
	}, func() string {
		got, _ := client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		var lines []string
		for _, l := range strings.Split(sb.UnitLog(m, "kubelet", 1<<22), "\n") {
			if strings.Contains(l, p.Name) && (strings.Contains(l, "Admit") || strings.Contains(l, "Predicate") || strings.Contains(l, "SyncLoop")) {
				lines = append(lines, l)
			}
		}
		return fmt.Sprintf("pod status %s %q; kubelet on %s:\n%s", got.Status.Phase, got.Status.Reason, m.Name, strings.Join(lines, "\n"))
	})
}
