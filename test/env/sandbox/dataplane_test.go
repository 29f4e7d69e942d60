package sandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/test/env/kube"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

// The nodes' runtime is real: containerd reports itself to the API, an
// operator's crictl and ctr work over SSH without flags, images come from
// the private registry, and a pod reaches pods on other nodes by their
// addresses.
func TestRealDataPlane(t *testing.T) {
	ctx := context.Background()
	want := "containerd://" + strings.TrimPrefix(kube.ContainerdVersion, "v")
	for _, m := range sb.Nodes() {
		if got := getNode(t, m.Name).Status.NodeInfo.ContainerRuntimeVersion; got != want {
			t.Errorf("node %s runtime %q, want %q", m.Name, got, want)
		}
	}

	w := node(t, "worker-1")
	if out := ssh(t, w.Name, "crictl version", nil); !strings.Contains(out, "RuntimeName:  containerd") {
		t.Errorf("crictl version on %s:\n%s", w.Name, out)
	}
	if out := ssh(t, w.Name, "ctr -n k8s.io tasks ls", nil); !strings.Contains(out, "RUNNING") {
		t.Errorf("ctr -n k8s.io tasks ls on %s lists no running task:\n%s", w.Name, out)
	}
	if out := ssh(t, w.Name, "crictl images", nil); !strings.Contains(out, "registry.k8s.io/pause") {
		t.Errorf("crictl images on %s has no pause image (pulled through the mirror):\n%s", w.Name, out)
	}

	pods, err := client.CoreV1().Pods(sandbox.WorkloadNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := sb.Registry.Address + "/library/"
	byNode := map[string][]corev1.Pod{}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
		for _, cs := range p.Status.ContainerStatuses {
			if !strings.HasPrefix(cs.ImageID, reg) {
				t.Errorf("%s/%s: imageID %q, not from the private registry %s", p.Name, cs.Name, cs.ImageID, reg)
			}
		}
	}

	// From a pod on worker-1 (inside its network namespace), every running
	// pod on another worker answers with its name.
	from := byNode[w.Name]
	if len(from) == 0 {
		t.Fatalf("no running pod on %s", w.Name)
	}
	netns := podNetNS(t, w, from[0])
	asked := 0
	for nodeName, ps := range byNode {
		if nodeName == w.Name || !strings.HasPrefix(nodeName, "worker-") {
			continue
		}
		for _, p := range ps {
			out, err := sshOutput(w.Name, fmt.Sprintf("nsenter --net=%s curl -sS -m 5 http://%s:8080/", netns, p.Status.PodIP))
			if err != nil || strings.TrimSpace(out) != p.Name {
				t.Errorf("from pod %s on %s to pod %s (%s) on %s: %q, %v", from[0].Name, w.Name, p.Name, p.Status.PodIP, nodeName, out, err)
			}
			asked++
		}
	}
	if asked == 0 {
		t.Fatalf("no running pod on a worker other than %s: %v", w.Name, byNode)
	}

	// The Service shop/api, through each node's kube-proxy: from every
	// worker and from a pod, its ClusterIP answers with the names of api
	// pods, and its replicas run on different workers.
	svc, err := client.CoreV1().Services(sandbox.WorkloadNamespace).Get(ctx, sandbox.APIService, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	api := map[string]string{} // pod -> node
	for nodeName, ps := range byNode {
		for _, p := range ps {
			if p.Labels["app"] == "api" {
				api[p.Name] = nodeName
			}
		}
	}
	if nodes := map[string]bool{}; len(api) < 3 {
		t.Errorf("api pods %v: want at least 3", api)
	} else {
		for _, n := range api {
			nodes[n] = true
		}
		if len(nodes) != len(api) {
			t.Errorf("api pods %v: not spread one per worker", api)
		}
	}
	answered := map[string]bool{}
	ask := func(where, prefix string) {
		for i := 0; i < 6; i++ {
			out, err := sshOutput(w.Name, prefix+"curl -sS -m 5 http://"+svc.Spec.ClusterIP+"/")
			name := strings.TrimSpace(out)
			if _, ok := api[name]; err != nil || !ok {
				t.Errorf("from %s to service %s (%s): %q, %v", where, sandbox.APIService, svc.Spec.ClusterIP, out, err)
				return
			}
			answered[name] = true
		}
	}
	ask("pod "+from[0].Name, "nsenter --net="+netns+" ")
	for _, m := range sb.Nodes() {
		if m.Role != "worker" {
			continue
		}
		for i := 0; i < 6; i++ {
			out, err := sshOutput(m.Name, "curl -sS -m 5 http://"+svc.Spec.ClusterIP+"/")
			if _, ok := api[strings.TrimSpace(out)]; err != nil || !ok {
				t.Errorf("from node %s to service %s (%s): %q, %v", m.Name, sandbox.APIService, svc.Spec.ClusterIP, out, err)
				break
			}
			answered[strings.TrimSpace(out)] = true
		}
		if out, err := sshOutput(m.Name, "curl -sS -m 5 http://127.0.0.1:10249/metrics"); err != nil || !strings.Contains(out, "kubeproxy_sync_proxy_rules_duration_seconds") {
			t.Errorf("kube-proxy metrics on %s at 127.0.0.1:10249: %v\n%.300s", m.Name, err, out)
		}
	}
	if len(answered) < 2 {
		t.Errorf("service %s: only %v answered of %v", sandbox.APIService, answered, api)
	}
}

// podNetNS is the network namespace path of pod's sandbox on node m, as
// crictl reports it there.
func podNetNS(t *testing.T, m sandbox.Machine, p corev1.Pod) string {
	t.Helper()
	id := strings.TrimSpace(ssh(t, m.Name, fmt.Sprintf("crictl pods -q --name '^%s$' --namespace %s --state ready", p.Name, p.Namespace), nil))
	if id == "" || strings.Contains(id, "\n") {
		t.Fatalf("crictl pods on %s for %s: %q", m.Name, p.Name, id)
	}
	var info struct {
		Info struct {
			RuntimeSpec struct {
				Linux struct {
					Namespaces []struct{ Type, Path string }
				}
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(ssh(t, m.Name, "crictl inspectp -o json "+id, nil)), &info); err != nil {
		t.Fatalf("crictl inspectp %s on %s: %v", id, m.Name, err)
	}
	for _, ns := range info.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			return ns.Path
		}
	}
	t.Fatalf("crictl inspectp %s on %s: no network namespace path", id, m.Name)
	return ""
}
