package e2e

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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/pkg/hashskip"
	"github.com/kubelift/kubelift/test/env/kube"
)

// node is one sandbox node: a network namespace, the CRI stand-in, and a
// kubelet that can be swapped, each kubelet in its own mount namespace.
type node struct {
	t        *testing.T
	name     string
	dir      string
	ns       *kube.NetNS
	api      *kube.APIServer
	client   kubernetes.Interface
	cri      string
	kubelet  *kube.Kubelet
	skipFile string
}

// swap replaces the kubelet binary and restarts it, as "replace
// /usr/local/bin/kubelet; systemctl restart kubelet" does, and waits until
// the Node is Ready at version.
func (n *node) swap(bin, version string) {
	n.t.Helper()
	if n.kubelet != nil {
		n.kubelet.Stop()
	}
	k, err := kube.StartKubelet(kube.KubeletOptions{Binary: bin, NodeName: n.name, Dir: n.dir, Kubeconfig: n.api.Kubeconfig,
		CRIEndpoint: n.cri, NetNS: n.ns, Env: []string{hashskip.PathEnv + "=" + n.skipFile}})
	if err != nil {
		n.t.Fatal(err)
	}
	n.kubelet = k
	n.waitFor("node "+n.name+" Ready at "+version, func() (bool, error) {
		nd, err := n.client.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		ready := false
		for _, c := range nd.Status.Conditions {
			ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
		}
		return ready && nd.Status.NodeInfo.KubeletVersion == version, nil
	})
}

// waitFor polls cond (bounded: 3 minutes) and fails with the kubelet's log.
func (n *node) waitFor(what string, cond func() (bool, error)) {
	n.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ok, err := cond()
		if err != nil {
			n.t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(n.kubelet.LogPath)
			if len(log) > 6000 {
				log = log[len(log)-6000:]
			}
			n.t.Fatalf("gave up waiting for %s\nkubelet %s, log %s tail:\n%s", what, n.kubelet.State(), n.kubelet.LogPath, log)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (n *node) createPods(prefix string, count int) []string {
	n.t.Helper()
	no := false
	var names []string
	for i := 0; i < count; i++ {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i), Namespace: "default"},
			Spec: corev1.PodSpec{
				NodeName:                     n.name,
				AutomountServiceAccountToken: &no,
				Containers: []corev1.Container{
					{Name: "app", Image: "registry.corp/library/app:v1", Args: []string{"serve", "--port=8080"}, Ports: []corev1.ContainerPort{{ContainerPort: 8080}}},
					{Name: "sidecar", Image: "registry.corp/library/proxy:v2", Env: []corev1.EnvVar{{Name: "A", Value: "<b>&"}}},
				},
			},
		}
		if _, err := n.client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			n.t.Fatal(err)
		}
		names = append(names, p.Name)
	}
	n.waitFor(prefix+" pods running", func() (bool, error) {
		for _, name := range names {
			p, err := n.client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			running := 0
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Running != nil {
					running++
				}
			}
			if running != len(p.Spec.Containers) {
				return false, nil
			}
		}
		return true, nil
	})
	return names
}

func (n *node) deletePods(names []string) {
	n.t.Helper()
	zero := int64(0)
	for _, name := range names {
		_ = n.client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	n.waitFor("pods and their containers gone", func() (bool, error) {
		for _, name := range names {
			if _, err := n.client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, err
			}
		}
		rcs, err := kube.RuntimeContainers(context.Background(), n.cri)
		if err != nil {
			return false, err
		}
		for _, rc := range rcs {
			for _, name := range names {
				if rc.Running && rc.Pod == name {
					return false, nil
				}
			}
		}
		return true, nil
	})
}

// restartCounts maps "pod/container" to the kubelet's restart count.
func (n *node) restartCounts(names []string) map[string]int32 {
	n.t.Helper()
	out := map[string]int32{}
	for _, name := range names {
		p, err := n.client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			n.t.Fatal(err)
		}
		for _, cs := range p.Status.ContainerStatuses {
			out[name+"/"+cs.Name] = cs.RestartCount
		}
	}
	return out
}

// predict runs kubeletcompat on the API's pods and the runtime's own
// records, as the engine will.
func (n *node) predict(target string, cache *hashskip.File) []kubeletcompat.Prediction {
	n.t.Helper()
	cat, _ := catalog.Default()
	h, err := kubeletcompat.NewHasher(cat, target)
	if err != nil {
		n.t.Fatal(err)
	}
	pods, err := n.client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	rcs, err := kube.RuntimeContainers(context.Background(), n.cri)
	if err != nil {
		n.t.Fatal(err)
	}
	preds, err := kubeletcompat.Predict(pods.Items, map[string][]kubeletcompat.RuntimeContainer{n.name: rcs},
		kubeletcompat.PredictOptions{Target: h, Cache: cache})
	if err != nil {
		n.t.Fatal(err)
	}
	return preds
}

func (n *node) waitEvaluated(names []string) {
	n.t.Helper()
	n.waitFor("the kubelet to evaluate every pod", func() (bool, error) {
		for _, name := range names {
			if n.kubelet.LogContains("computePodActions got for pod", `pod="default/`+name+`"`) == 0 {
				return false, nil
			}
		}
		return true, nil
	})
}

// TestKubeletSwapAndHashSkip is kubernetes#129385 reproduced with upstream
// kubelets, and removed: swapping v1.30.14 for v1.31.4 in place restarts
// every container; with the hash-skip kubelet and the cache written it
// restarts none; after convergence the cache goes and a restart at the same
// version restarts none. kubeletcompat's prediction must equal what the
// real kubelet does, container by container, with and without the cache.
func TestKubeletSwapAndHashSkip(t *testing.T) {
	ctx := context.Background()
	newBin, err := kube.Binaries(ctx, "v1.31.4", "kube-apiserver", "kubelet")
	if err != nil {
		t.Fatal(err)
	}
	oldBin, err := kube.Binaries(ctx, "v1.30.14", "kubelet")
	if err != nil {
		t.Fatal(err)
	}
	_, file, _, _ := runtime.Caller(0)
	out, err := exec.Command(filepath.Join(filepath.Dir(file), "..", "..", "..", "hack", "build-kubelet.sh"), "v1.31.4").Output()
	if err != nil {
		t.Fatalf("build-kubelet.sh: %v", err)
	}
	patched := strings.TrimSpace(string(out))

	dir := t.TempDir()
	// Runs before the directory is removed (cleanups run last first), so
	// the removal can never cross into a mount a kubelet left.
	t.Cleanup(func() {
		if err := kube.UnmountUnder(dir); err != nil {
			t.Error(err)
		}
	})
	ns, err := kube.NewNetNS(fmt.Sprintf("kl-e2e-%d", os.Getpid()), "10.123.45.2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Delete)
	api, err := kube.StartAPIServer(ctx, filepath.Join(dir, "apiserver"), newBin, kube.APIServerOptions{NetNS: ns,
		ExtraArgs: []string{"--disable-admission-plugins=ServiceAccount"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Stop)
	cfg, err := clientcmd.BuildConfigFromFlags("", api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dial = ns.DialContext
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cri, err := startCRI(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, name: "worker-1", dir: filepath.Join(dir, "worker-1"), ns: ns, api: api, client: client, cri: cri,
		skipFile: filepath.Join(dir, "worker-1", "root", "kubelift-hash-skip.json")} // where /var/lib/kubelet/kubelift-hash-skip.json is on a node
	t.Cleanup(func() {
		if n.kubelet != nil {
			n.kubelet.Stop()
		}
	})

	// 1. Upstream: 1.30.14 -> 1.31.4 restarts every container, as predicted.
	n.swap(filepath.Join(oldBin, "kubelet"), "v1.30.14")
	podsA := n.createPods("a", 2)
	predA := n.predict("v1.31.4", nil)
	n.swap(filepath.Join(newBin, "kubelet"), "v1.31.4")
	n.waitFor("every container of the a pods restarted", func() (bool, error) {
		for _, c := range n.restartCounts(podsA) {
			if c < 1 {
				return false, nil
			}
		}
		return true, nil
	})
	counts := n.restartCounts(podsA)
	if len(predA) != 4 || len(counts) != 4 {
		t.Fatalf("predicted %+v, observed %v", predA, counts)
	}
	for _, p := range predA {
		if got := counts[p.Pod+"/"+p.Container]; p.Restart != (got == 1) {
			t.Errorf("upstream swap, %s/%s: predicted restart %v, kubelet restart count %d", p.Pod, p.Container, p.Restart, got)
		}
	}
	n.deletePods(podsA)

	// 2. kubelift: the same swap with the hash-skip kubelet and the cache.
	n.swap(filepath.Join(oldBin, "kubelet"), "v1.30.14")
	podsB := n.createPods("b", 2)
	before, err := kube.RuntimeContainers(ctx, cri)
	if err != nil {
		t.Fatal(err)
	}
	cache := &hashskip.File{OldKubeletVersion: "v1.30.14", OldHashEra: hashskip.EraJSONWithoutResources, NewKubeletVersion: "v1.31.4", UpgradedAt: time.Now()}
	if err := hashskip.Write(n.skipFile, cache); err != nil {
		t.Fatal(err)
	}
	predB := n.predict("v1.31.4", cache)
	n.swap(patched, "v1.31.4")
	if _, err := os.Stat(n.skipFile); err != nil {
		t.Fatalf("the hash-skip file is gone after the kubelet started: %v", err)
	}
	n.waitEvaluated(podsB)
	if n.kubelet.LogContains("kubelift: container started by kubelet v1.30.14 keeps running") == 0 {
		log, _ := os.ReadFile(n.kubelet.LogPath)
		var lines []string
		for _, l := range strings.Split(string(log), "\n") {
			if strings.Contains(l, "kubelift") || strings.Contains(l, "definition changed") || strings.Contains(l, "computePodActions got for pod") && strings.Contains(l, "b-0") {
				lines = append(lines, l)
			}
		}
		if len(lines) > 12 {
			lines = lines[:12]
		}
		t.Errorf("the hash-skip kubelet logged no skipped comparison; its log says:\n%s", strings.Join(lines, "\n"))
	}
	counts = n.restartCounts(podsB)
	if len(predB) != 4 {
		t.Fatalf("predicted %+v", predB)
	}
	for _, p := range predB {
		if got := counts[p.Pod+"/"+p.Container]; p.Restart || !p.Protected || got != 0 {
			t.Errorf("hash-skip swap, %s/%s: predicted restart %v protected %v, kubelet restart count %d", p.Pod, p.Container, p.Restart, p.Protected, got)
		}
	}
	after, err := kube.RuntimeContainers(ctx, cri)
	if err != nil {
		t.Fatal(err)
	}
	if kube.RunningIDs(before, podsB) != kube.RunningIDs(after, podsB) {
		t.Errorf("containers were replaced:\nbefore %s\nafter  %s", kube.RunningIDs(before, podsB), kube.RunningIDs(after, podsB))
	}

	// 3. Convergence: while containers of the 1.30 kubelet run, the cache
	// stays; once only the 1.31 kubelet's run, it goes, and a restart at the
	// same version restarts nothing.
	if converged(n.predict("v1.31.4", nil)) {
		t.Fatal("converged while containers of the 1.30 kubelet still run")
	}
	n.deletePods(podsB)
	podsC := n.createPods("c", 2)
	if !converged(n.predict("v1.31.4", nil)) {
		t.Fatal("not converged with only containers of the 1.31 kubelet running")
	}
	if err := os.Remove(n.skipFile); err != nil {
		t.Fatal(err)
	}
	before, _ = kube.RuntimeContainers(ctx, cri)
	n.swap(patched, "v1.31.4")
	n.waitEvaluated(podsC)
	for k, c := range n.restartCounts(podsC) {
		if c != 0 {
			t.Errorf("same-version restart after convergence restarted %s (%d)", k, c)
		}
	}
	after, _ = kube.RuntimeContainers(ctx, cri)
	if kube.RunningIDs(before, podsC) != kube.RunningIDs(after, podsC) {
		t.Errorf("same-version restart replaced containers")
	}
}

func converged(preds []kubeletcompat.Prediction) bool {
	var hs []hashskip.Hashes
	for _, p := range preds {
		hs = append(hs, hashskip.Hashes{Recorded: kubeletcompat.ParseLabel(p.Recorded), Computed: kubeletcompat.ParseLabel(p.Expected)})
	}
	return hashskip.Converged(hs)
}

// startCRI runs the CRI stand-in (test/env/cri) on a unix socket in dir,
// stopped by pid.
func startCRI(t *testing.T, dir string) (string, error) {
	bin := filepath.Join(binDir, "kubelift-cri")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/kubelift/kubelift/test/env/cri").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build test/env/cri: %v: %s", err, out)
	}
	sock := filepath.Join(dir, "cri.sock")
	endpoint := "unix://" + sock
	cmd := exec.Command(bin, "--endpoint", endpoint)
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		return "", err
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(sock); err == nil {
			return endpoint, nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	return "", fmt.Errorf("CRI stand-in did not create %s", sock)
}
