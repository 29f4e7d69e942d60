package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/test/env/prober"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

// Running lists a node's running containers (ID -> namespace/pod/name),
// read over SSH.
func (h *Harness) Running(t *testing.T, node string) map[string]string {
	t.Helper()
	cs, err := kubeletcompat.ParseCrictl([]byte(h.SSH(t, node, "crictl ps -o json")))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range cs {
		if c.Running {
			out[c.ID] = c.Namespace + "/" + c.Pod + "/" + c.Name
		}
	}
	return out
}

// Tasks lists a node's running containerd tasks in the k8s.io namespace
// (task ID, the container's, -> its process's PID), read over SSH from
// containerd itself (ctr): what a container keeps when it is not
// restarted, whichever containerd serves it.
func (h *Harness) Tasks(t *testing.T, node string) map[string]int {
	t.Helper()
	tasks, err := parseTasks(h.SSH(t, node, "ctr -n k8s.io tasks ls"))
	if err != nil {
		t.Fatalf("%s: ctr tasks ls: %v", node, err)
	}
	return tasks
}

// parseTasks reads ctr tasks ls as the product does
// (kubeletcompat.ParseTasks: a RUNNING task with PID 0 is not running),
// but only from output that starts with ctr's header: an empty or
// foreign answer would be an empty map, and a test comparing two of them
// would pass on nothing.
func parseTasks(out string) (map[string]int, error) {
	first, _, _ := strings.Cut(out, "\n")
	if f := strings.Fields(first); len(f) != 3 || f[0] != "TASK" || f[1] != "PID" || f[2] != "STATUS" {
		return nil, fmt.Errorf("header %q, want TASK PID STATUS", first)
	}
	return kubeletcompat.ParseTasks([]byte(out))
}

// RunningVersion reads the version of comp's running process on node of a
// binary sandbox, over SSH ("" and the error while it is not running, e.g.
// restarting).
func (h *Harness) RunningVersion(node, comp string) (string, error) {
	out, err := h.TrySSH(node, fmt.Sprintf("pid=$(systemctl show %s -p MainPID | sed -n 's/^MainPID=//p'); /proc/$pid/exe --version", comp))
	return strings.TrimPrefix(strings.TrimSpace(out), "Kubernetes "), err
}

// MainPID reads the pid of comp's main process on node, over SSH (0 when
// it does not run).
func (h *Harness) MainPID(t *testing.T, node, comp string) int {
	t.Helper()
	out := h.SSH(t, node, fmt.Sprintf("systemctl show %s -p MainPID | sed -n 's/^MainPID=//p'", comp))
	var pid int
	if _, err := fmt.Sscan(strings.TrimSpace(out), &pid); err != nil {
		t.Fatalf("%s: %s's MainPID %q: %v", node, comp, out, err)
	}
	return pid
}

// SteadyControlPlane checks on a binary sandbox, as soon as a command said
// it was done, that every control-plane part runs version, and that each
// is still the same process a minute later (an API server's restart makes
// a leading controller manager or scheduler exit a few seconds on).
func (h *Harness) SteadyControlPlane(t *testing.T, version string) {
	t.Helper()
	pids := map[string]int{}
	for _, m := range h.SB.Nodes() {
		if m.Role != "control-plane" {
			continue
		}
		for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			got, err := h.RunningVersion(m.Name, c)
			if err != nil || got != version {
				t.Errorf("%s: %s runs %q (%v) when the command returned, want %s", m.Name, c, got, err, version)
			}
			pids[m.Name+"/"+c] = h.MainPID(t, m.Name, c)
		}
	}
	time.Sleep(time.Minute)
	for key, pid := range pids {
		node, c, _ := strings.Cut(key, "/")
		if now := h.MainPID(t, node, c); now != pid || pid == 0 {
			t.Errorf("%s: %s was process %d when the command returned, a minute later %d", node, c, pid, now)
		}
	}
}

// Shop lists the running shop containers on every node of the sandbox
// (ID -> "NODE namespace/pod/name").
func (h *Harness) Shop(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range h.SB.Nodes() {
		for id, what := range h.Running(t, m.Name) {
			if strings.HasPrefix(what, sandbox.WorkloadNamespace+"/") {
				out[id] = m.Name + " " + what
			}
		}
	}
	return out
}

// HashSkipShopPod returns the first running shop pod that ok accepts,
// after checking over SSH that the hash-skip file is on its node (an
// image set in place is judged while it is there).
func (h *Harness) HashSkipShopPod(t *testing.T, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	pods, err := h.Client.CoreV1().Pods(sandbox.WorkloadNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase != corev1.PodRunning || !ok(p) {
			continue
		}
		if out := h.SSH(t, p.Spec.NodeName, "test -e /var/lib/kubelet/kubelift-hash-skip.json && echo present || echo absent"); out != "present\n" {
			t.Fatalf("%s's hash-skip file: %s", p.Spec.NodeName, out)
		}
		return p
	}
	t.Fatal("no running shop pod of the kind wanted")
	return nil
}

// SetProxyImage sets the image of shop pod pod's proxy container in place
// (a Pod's image is mutable: OpenKruise and `kubectl set image pod/...` do
// it) to the app's image, the same program under another name, and waits
// up to 2 minutes for the kubelet to act on it: that container restarted
// once more, under a new ID, Ready. It returns the container's old ID.
func (h *Harness) SetProxyImage(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	ctx := context.Background()
	idx := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == "proxy" })
	if idx < 0 {
		t.Fatalf("pod %s has no proxy container", pod.Name)
	}
	var oldID string
	var restarts int32
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == "proxy" {
			oldID, restarts = strings.TrimPrefix(cs.ContainerID, "containerd://"), cs.RestartCount
		}
	}
	if _, ok := h.Running(t, pod.Spec.NodeName)[oldID]; oldID == "" || !ok {
		t.Fatalf("%s's proxy container %q is not running on %s", pod.Name, oldID, pod.Spec.NodeName)
	}
	image := h.SB.Registry.Address + "/" + sandbox.ShopAppImage
	at := fmt.Sprintf("/spec/containers/%d", idx)
	patch, err := json.Marshal([]map[string]string{{"op": "test", "path": at + "/name", "value": "proxy"}, {"op": "replace", "path": at + "/image", "value": image}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 2*time.Minute, func() (bool, string) {
		p, err := h.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		// (The runtime may name the image by another tag of the same
		// digest: the restart and the new container say it.)
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == "proxy" {
				id := strings.TrimPrefix(cs.ContainerID, "containerd://")
				return cs.Ready && cs.RestartCount == restarts+1 && id != oldID && p.Spec.Containers[idx].Image == image,
					fmt.Sprintf("proxy: restarts %d, container %s, ready %v", cs.RestartCount, id, cs.Ready)
			}
		}
		return false, "no proxy container status"
	})
	return oldID
}

// Probe starts the prober on what a user judges the sandbox's
// availability by (sandbox.ProbeTargets: the shop Service from every
// worker, every shop pod), 10 requests a second each and one held stream;
// it is stopped when the test ends, if not before (Stop gives the verdict).
func (h *Harness) Probe(t *testing.T) *prober.Prober {
	t.Helper()
	targets, err := h.SB.ProbeTargets(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p, err := prober.Start(context.Background(), prober.Config{Targets: targets, Rate: 10, Streams: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	return p
}

// Status is `upgrade status -o json`: the upgrade the cluster records.
func (h *Harness) Status(t *testing.T) *record.Upgrade {
	t.Helper()
	r := h.Upgrade(t, "", "status", "-o", "json")
	var st record.Upgrade
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil || r.Code != 0 {
		t.Fatalf("status: exit %d, %v\n%s%s", r.Code, err, r.Stdout, r.Stderr)
	}
	return &st
}

// Node reads a Node.
func (h *Harness) Node(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := h.Client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// WaitFor polls cond, bounded by 3 minutes.
func WaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// judge is availability as a user judges it: it logs the prober's
// table and fails t for every request that failed and every held
// connection that broke (the first 20 named), or when the prober measured
// nothing (fewer than 4 targets, or no request).
func judge(t *testing.T, res *prober.Result) {
	t.Helper()
	var table strings.Builder
	_ = res.WriteTable(&table)
	t.Logf("availability over %s:\n%s", res.Ended.Sub(res.Started).Round(time.Second), table.String())
	for i, f := range res.Failures {
		if i == 20 {
			t.Errorf("... %d failures in all", len(res.Failures))
			break
		}
		t.Errorf("%s %s at %s: %s", f.Target, f.Kind, f.At.Format("15:04:05.000"), f.Error)
	}
	requests := 0
	for _, tr := range res.Targets {
		requests += tr.Requests
	}
	if len(res.Targets) < 4 || requests == 0 {
		t.Errorf("the prober probed %d targets with %d requests: it measured nothing", len(res.Targets), requests)
	}
}

// CoreDNSAsDeployed checks what a CoreDNS roll changes while it runs is
// as the sandbox deployed it (sandbox.Config.CoreDNS): the Deployment's
// strategy (at most one replica unavailable) and minReadySeconds (none),
// the kube-dns Service's selector (k8s-app=kube-dns only).
func (h *Harness) CoreDNSAsDeployed(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	d, err := h.Client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ru := d.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "1" || d.Spec.MinReadySeconds != 0 {
		t.Errorf("CoreDNS's Deployment after its roll: strategy %+v, minReadySeconds %d; want maxUnavailable 1 and none, as deployed", d.Spec.Strategy, d.Spec.MinReadySeconds)
	}
	svc, err := h.Client.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(svc.Spec.Selector); got != "map[k8s-app:kube-dns]" {
		t.Errorf("the kube-dns Service after CoreDNS's roll selects %s, want k8s-app=kube-dns only", got)
	}
}
