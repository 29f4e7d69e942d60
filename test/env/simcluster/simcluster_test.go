package simcluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/kubelift/kubelift/test/env/kube"
	"github.com/kubelift/kubelift/test/env/simcluster"
)

const (
	from, to   = "v1.30.14", "v1.31.4"
	host       = "127.1.9.1" // apart from test/stories/scale's 127.1.0.1
	delay      = 10 * time.Second
	jitter     = 3 * time.Second
	nodes      = 20
	perNode    = 3
	noTolEvery = 4
)

func address(i int) string { return fmt.Sprintf("127.2.0.%d", i+1) }

func TestCluster(t *testing.T) {
	// The builds get what a cold machine needs: there they queue behind
	// the other packages' builds of the same releases (a cold run gave
	// 10 minutes for both and killed KWOK's build). The cluster's start
	// keeps its own bound.
	builds, cancelBuilds := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancelBuilds()
	bin, err := kube.Binaries(builds, from, "kube-apiserver", "kube-controller-manager")
	if err != nil {
		t.Fatal(err)
	}
	kwok, err := simcluster.KwokBinary(builds)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := simcluster.Start(ctx, simcluster.Options{Dir: t.TempDir(), KubeBin: bin, Host: host, Kwok: kwok,
		RestartDelay: delay, RestartJitter: jitter,
		// Heartbeats every 2 s: were one able to bring a restarting node
		// back, the restart below would see it.
		HeartbeatInterval: 2 * time.Second,
		Log:               t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	pids := c.Pids()
	t.Cleanup(func() {
		c.Stop()
		for name, pid := range pids {
			if err := syscall.Kill(pid, 0); err == nil {
				t.Errorf("%s (pid %d) still running after Stop", name, pid)
			}
		}
	})
	if want := "https://" + host + ":"; len(c.URL) < len(want) || c.URL[:len(want)] != want {
		t.Errorf("URL = %s, want it on %s", c.URL, host)
	}

	var ns []simcluster.Node
	for i := 0; i < nodes; i++ {
		ns = append(ns, simcluster.Node{Name: fmt.Sprintf("node-%02d", i), Address: address(i),
			ControlPlane: i == 0, KubeletVersion: from, Labels: map[string]string{"pool": "a"}})
	}
	if err := c.AddNodes(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Run("nodes", func(t *testing.T) {
		list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != nodes {
			t.Fatalf("%d nodes, want %d", len(list.Items), nodes)
		}
		for i, n := range list.Items { // sorted by name, as created
			if !simcluster.NodeReady(&n) {
				t.Errorf("%s not Ready: %+v", n.Name, n.Status.Conditions)
			}
			if v := n.Status.NodeInfo.KubeletVersion; v != from {
				t.Errorf("%s: kubeletVersion %s, want %s", n.Name, v, from)
			}
			if ip := internalIP(&n); ip != address(i) {
				t.Errorf("%s: InternalIP %q, want %s", n.Name, ip, address(i))
			}
			_, cp := n.Labels["node-role.kubernetes.io/control-plane"]
			if cp != (i == 0) || n.Labels["pool"] != "a" {
				t.Errorf("%s: labels %v", n.Name, n.Labels)
			}
		}
	})

	if err := c.AddPods(ctx, perNode, noTolEvery); err != nil {
		t.Fatal(err)
	}
	t.Run("pods", func(t *testing.T) {
		list, err := c.Client.CoreV1().Pods(simcluster.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != nodes*perNode {
			t.Fatalf("%d pods, want %d", len(list.Items), nodes*perNode)
		}
		without := 0
		for _, p := range list.Items {
			if !simcluster.PodRunning(&p) || p.Status.PodIP == "" {
				t.Errorf("%s: %s, pod IP %q", p.Name, p.Status.Phase, p.Status.PodIP)
			}
			switch p.Labels[simcluster.TolerationsLabel] {
			case "none":
				without++
				if len(p.Spec.Tolerations) != 0 {
					t.Errorf("%s: tolerations %+v, want none", p.Name, p.Spec.Tolerations)
				}
			default:
				if !tolerates(&p, corev1.TaintNodeNotReady) || !tolerates(&p, corev1.TaintNodeUnreachable) {
					t.Errorf("%s: tolerations %+v, want not-ready and unreachable for 300s", p.Name, p.Spec.Tolerations)
				}
			}
		}
		if want := nodes * perNode / noTolEvery; without != want {
			t.Errorf("%d pods without tolerations, want %d", without, want)
		}
	})

	t.Run("restart", func(t *testing.T) {
		const name = "node-05"
		// The fleet's own client, as kubelift's would be: its requests are
		// the audit log's to find.
		cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		cfg.UserAgent = "kubelift-test"
		fleet := kubernetes.NewForConfigOrDie(cfg)

		byName := fields.OneTermEqualSelector("metadata.name", name).String()
		lw := &cache.ListWatch{
			ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
				o.FieldSelector = byName
				return c.Client.CoreV1().Nodes().List(ctx, o)
			},
			WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
				o.FieldSelector = byName
				return c.Client.CoreV1().Nodes().Watch(ctx, o)
			},
		}
		patched := make(chan struct{})
		var restarting, ready time.Time
		tainted, flipped := false, false
		go func() {
			defer close(patched)
			_, err := fleet.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType,
				simcluster.RestartingStatusPatch(to, time.Now()), metav1.PatchOptions{}, "status")
			if err != nil {
				t.Errorf("patch: %v", err)
			}
		}()
		seenRestarting := false
		_, err = watchtools.UntilWithSync(ctx, lw, &corev1.Node{}, nil, func(ev watch.Event) (bool, error) {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				return false, nil
			}
			r := readyCondition(n)
			if r == nil {
				return false, nil
			}
			switch {
			case r.Reason == simcluster.ReasonKubeletRestarting:
				seenRestarting = true
				restarting = r.LastTransitionTime.Time
				if r.Status != corev1.ConditionFalse || n.Status.NodeInfo.KubeletVersion != to {
					return false, fmt.Errorf("restarting node: Ready %s, kubelet %s", r.Status, n.Status.NodeInfo.KubeletVersion)
				}
				if hasTaint(n, corev1.TaintNodeNotReady, corev1.TaintEffectNoExecute) {
					tainted = true
				}
			case seenRestarting && r.Status == corev1.ConditionTrue:
				if r.Reason != "KubeletReady" {
					flipped = true
				}
				ready = r.LastTransitionTime.Time
				// Done once the controller-manager took its taint off again.
				return n.Status.NodeInfo.KubeletVersion == to && !hasTaint(n, corev1.TaintNodeNotReady, ""), nil
			}
			return false, nil
		})
		<-patched
		if err != nil {
			t.Fatalf("waiting for %s to restart at %s: %v", name, to, err)
		}
		if flipped {
			t.Errorf("%s became Ready through another stage than node-restart", name)
		}
		if !tainted {
			t.Errorf("the controller-manager never tainted %s %s:NoExecute while it was NotReady", name, corev1.TaintNodeNotReady)
		}
		t.Logf("%s restarting at %s, Ready at %s (%s later)", name, restarting.Format(time.TimeOnly), ready.Format(time.TimeOnly), ready.Sub(restarting))
		if got := ready.Sub(restarting); got < delay {
			t.Errorf("%s Ready at %s, %s after its restart at %s: want at least %s", name, ready, got, restarting, delay)
		}
		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v := n.Status.NodeInfo.KubeletVersion; v != to || internalIP(n) != address(5) {
			t.Errorf("%s after restart: kubelet %s, InternalIP %s", name, v, internalIP(n))
		}

		events, err := c.AuditRequests("kubelift-test")
		if err != nil {
			t.Fatal(err)
		}
		if len(events) != 1 || events[0].Verb != "patch" || events[0].Resource != "nodes" || events[0].Subresource != "status" ||
			events[0].Name != name || events[0].Code != 200 || events[0].Time.IsZero() {
			t.Errorf("audit events of kubelift-test: %+v, want one patch of nodes/status %s", events, name)
		}
	})

	t.Run("audit", func(t *testing.T) {
		all, err := c.AuditRequests("")
		if err != nil {
			t.Fatal(err)
		}
		creates := 0
		for _, e := range all {
			if e.User == "kwok" || e.User == "system:kube-controller-manager" {
				t.Fatalf("audit log has the simulation's own request %+v", e)
			}
			if e.UserAgent == "simcluster" && e.Verb == "create" && e.Resource == "nodes" {
				creates++
			}
		}
		if creates != nodes {
			t.Errorf("audit log has %d node creates by simcluster, want %d", creates, nodes)
		}
	})
	if t.Failed() {
		for _, f := range []string{"kwok.log", "kube-controller-manager.log"} {
			b, _ := os.ReadFile(filepath.Join(filepath.Dir(c.AuditLog), f))
			if len(b) > 3000 {
				b = b[len(b)-3000:]
			}
			t.Logf("%s:\n%s", f, b)
		}
	}
}

func internalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

func readyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func hasTaint(n *corev1.Node, key string, effect corev1.TaintEffect) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key && (effect == "" || t.Effect == effect) {
			return true
		}
	}
	return false
}

func tolerates(p *corev1.Pod, key string) bool {
	for _, t := range p.Spec.Tolerations {
		if t.Key == key && t.Operator == corev1.TolerationOpExists && t.Effect == corev1.TaintEffectNoExecute &&
			t.TolerationSeconds != nil && *t.TolerationSeconds == 300 {
			return true
		}
	}
	return false
}
