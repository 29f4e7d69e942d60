package scale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/test/env/fleet"
	"github.com/kubelift/kubelift/test/env/simcluster"
)

// The simulation this test runs on: 50 workers and a control-plane node.
const (
	workers     = 50
	podsPerNode = 4
	noTolEvery  = 3
)

var env *Env

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kubelift-scale-")
	if err != nil {
		panic(err)
	}
	env, err = Up(context.Background(), Options{Dir: dir, Workers: workers, PodsPerNode: podsPerNode, NoTolerationsEvery: noTolEvery,
		RestartDelay: time.Second, RestartJitter: 2 * time.Second, Agent: true,
		Log: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "scale: "+format+"\n", args...) }})
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	env.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}

// unavailable watches the workers and remembers the most that were not
// Ready at once.
type unavailable struct {
	mu       sync.Mutex
	notReady map[string]bool
	max      int
}

func (u *unavailable) see(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok || n.Name == "cp-1" {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if simcluster.NodeReady(n) {
		delete(u.notReady, n.Name)
	} else {
		u.notReady[n.Name] = true
	}
	u.max = max(u.max, len(u.notReady))
}

// Planned through the nodes' agents (kubelift's agent loop for every
// node, answering step requests through the real API server), the
// upgrade is the one planned over SSH: the same nodes, steps, window and
// findings; and the plan leaves no agent pod or step request behind.
func TestPlanThroughAgentsIsTheSSHPlan(t *testing.T) {
	ctx := context.Background()
	stop, err := env.ServeAgents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	pw := env.Registry.Password + "\n"
	plan := func(via string, args ...string) map[string]json.RawMessage {
		t.Helper()
		r := env.Upgrade(ctx, pw, args...)
		var m map[string]json.RawMessage
		if (r.Code != 0 && r.Code != 4) || json.Unmarshal([]byte(r.Stdout), &m) != nil {
			t.Fatalf("plan %s: exit %d\n%s\n%s", via, r.Code, r.Stdout, lastLines(r.Stderr, 40))
		}
		return m
	}
	overSSH := plan("over SSH", append(append([]string{"plan", "--to", To, "--key", env.Key, "-o", "json"}, env.RegistryFlags()...), env.NodeFlags()...)...)
	overAgents := plan("--via agent", env.AgentArgs("plan", "-o", "json")...)
	// Each says how it would stage: over SSH, sent by this machine (the
	// fleet's nodes have no curl to pull with); through agents, it cannot
	// (agent mode stages from the registry only), which blocks the plan,
	// naming each node.
	agentsStage := 0
	for _, m := range []map[string]json.RawMessage{overSSH, overAgents} {
		var nodes []map[string]any
		var findings []map[string]any
		if err := errors.Join(json.Unmarshal(m["nodes"], &nodes), json.Unmarshal(m["findings"], &findings)); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			delete(n, "stagePath")
			delete(n, "stagePathReason")
		}
		kept := findings[:0]
		for _, f := range findings {
			if f["check"] != "staged" {
				kept = append(kept, f)
				continue
			}
			if m["agents"] != nil && f["severity"] == "blocking" && strings.Contains(fmt.Sprint(f["message"]), "apply cannot get them there: node ") {
				agentsStage++
			}
		}
		m["nodes"], _ = json.Marshal(nodes)
		m["findings"], _ = json.Marshal(kept)
	}
	if agentsStage != workers+1 {
		t.Errorf("plan --via agent blocks %d nodes' staging, want every node's (%d): none can pull", agentsStage, workers+1)
	}
	for _, k := range []string{"nodes", "steps", "window", "findings", "coreDNS"} {
		if a, b := string(overSSH[k]), string(overAgents[k]); a != b {
			t.Errorf("plan's %s over SSH:\n%s\nthrough agents:\n%s", k, a, b)
		}
	}
	if len(overSSH["nodes"]) < workers*10 {
		t.Errorf("plan's nodes: %s", overSSH["nodes"])
	}
	if _, ok := overAgents["agents"]; !ok {
		t.Error("plan --via agent -o json does not say what agent mode makes")
	}
	if got := env.Fleet.Stats().Commands["facts"]; got < 2*(workers+1) {
		t.Errorf("the fleet played facts %d times, want at least twice per node (%d)", got, 2*(workers+1))
	}
	// Deleted: gone, or going (KWOK, the nodes' kubelet here, ends a
	// pod's grace when it gets to it; FC55 listed one still going).
	pods, err := env.Cluster.Client.CoreV1().Pods("kubelift-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			t.Errorf("after the plan: agent pod %s (node %s, run %s, made %s, %s) left", p.Name, p.Spec.NodeName, p.Labels["kubelift.dev/run"], p.CreationTimestamp, p.Status.Phase)
		}
	}
	secrets, err := env.Cluster.Client.CoreV1().Secrets("kubelift-system").List(ctx, metav1.ListOptions{FieldSelector: "type=kubelift.dev/step"})
	if err != nil || len(secrets.Items) != 0 {
		t.Errorf("after the plan: %v step requests left, %v", len(secrets.Items), err)
	}
}

// The engine's sliding window never has more workers down than
// --max-unavailable, uses the window (more than one at once), and moves
// every node exactly once, with the tolerations added first so the
// controller manager's not-ready taint evicts nothing.
func TestApplyKeepsWithinMaxUnavailableAndFinishesEveryNode(t *testing.T) {
	ctx := context.Background()
	c := env.Cluster.Client
	podsBefore, err := c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := workers * podsPerNode; len(podsBefore.Items) < want {
		t.Fatalf("%d pods before the upgrade, want %d", len(podsBefore.Items), want)
	}
	withoutTolerations := 0
	for _, p := range podsBefore.Items {
		if !tolerates(p) {
			withoutTolerations++
		}
	}
	if withoutTolerations == 0 {
		t.Fatal("every pod tolerates not-ready already: the toleration patch would not be exercised")
	}

	u := &unavailable{notReady: map[string]bool{}}
	inf := informers.NewSharedInformerFactory(c, 0)
	if _, err := inf.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: u.see, UpdateFunc: func(_, n any) { u.see(n) }}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	inf.Start(stop)
	inf.WaitForCacheSync(stop)

	const window = 5
	r := env.Upgrade(ctx, env.Registry.Password+"\n", env.ApplyArgs("--max-unavailable", fmt.Sprint(window), "--settle", "1s", "--parallel", "25", "-o", "json")...)
	if r.Code != 0 {
		t.Fatalf("apply: exit %d\n%s", r.Code, lastLines(r.Stderr, 60))
	}
	var res inplace.ApplyResult
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		t.Fatalf("apply -o json: %v\n%s", err, r.Stdout)
	}
	if res.State == nil || res.State.State != record.StateComplete {
		t.Errorf("apply ended in state %+v", res.State)
	}
	u.mu.Lock()
	most := u.max
	u.mu.Unlock()
	if most > window {
		t.Errorf("%d workers were not Ready at once, more than --max-unavailable %d", most, window)
	}
	if most < 2 {
		t.Errorf("at most %d worker was down at once: the window of %d was never used", most, window)
	}

	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != workers+1 {
		t.Fatalf("%d Nodes", len(nodes.Items))
	}
	stats := env.Fleet.Stats()
	// In flight, as the nodes saw it: from a worker's kubelet backup to
	// the end of its last crictl ps (the verification after the restart).
	inFlight := mostAtOnce(t, stats)
	if inFlight > window {
		t.Errorf("%d workers were in flight at once, more than --max-unavailable %d", inFlight, window)
	}
	if inFlight < 2 {
		t.Errorf("at most %d worker was in flight at once: the window of %d was never used", inFlight, window)
	}
	for _, n := range nodes.Items {
		if n.Status.NodeInfo.KubeletVersion != To || !simcluster.NodeReady(&n) || n.Annotations[inplace.AnnotationUpgradedTo] != To {
			t.Errorf("%s: kubelet %s, ready %v, annotated %q", n.Name, n.Status.NodeInfo.KubeletVersion, simcluster.NodeReady(&n), n.Annotations[inplace.AnnotationUpgradedTo])
		}
		if got := stats.Nodes[n.Name].KubeletRestarts(); got != 1 {
			t.Errorf("%s: kubelet restarted %d times, want once", n.Name, got)
		}
	}
	podsAfter, err := c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uids := map[string]bool{}
	for _, p := range podsAfter.Items {
		uids[string(p.UID)] = true
		if !tolerates(p) {
			t.Errorf("%s/%s still lacks the not-ready/unreachable tolerations", p.Namespace, p.Name)
		}
	}
	for _, p := range podsBefore.Items {
		if !uids[string(p.UID)] {
			t.Errorf("pod %s/%s is gone", p.Namespace, p.Name)
		}
	}
	if len(res.Patched) != withoutTolerations {
		t.Errorf("apply patched %d pods' tolerations, %d lacked them", len(res.Patched), withoutTolerations)
	}

	// Again: nothing to do, and no node touched.
	r = env.Upgrade(ctx, env.Registry.Password+"\n", env.ApplyArgs("-o", "json")...)
	if r.Code != 0 {
		t.Fatalf("second apply: exit %d\n%s", r.Code, lastLines(r.Stderr, 40))
	}
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil || !res.NothingToDo {
		t.Errorf("second apply did something: %v\n%s", err, lastLines(r.Stdout, 20))
	}
	for name, ns := range env.Fleet.Stats().Nodes {
		if got := ns.KubeletRestarts(); got != 1 {
			t.Errorf("%s: kubelet restarted %d times after the second apply", name, got)
		}
	}
}

// mostAtOnce is the most workers whose upgrade (first "back up" to last
// "crictl ps" on the node) overlapped.
func mostAtOnce(t *testing.T, stats fleet.Stats) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for name, ns := range stats.Nodes {
		if name == "cp-1" {
			continue
		}
		var from, to time.Time
		for _, c := range ns.Commands {
			if c.Handler == "back up" && from.IsZero() {
				from = c.Began
			}
			if c.Handler == "crictl ps" {
				to = c.Ended
			}
		}
		if from.IsZero() || !to.After(from) {
			t.Errorf("%s: no backup followed by crictl ps among its commands", name)
			continue
		}
		edges = append(edges, edge{from, 1}, edge{to, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at.Equal(edges[j].at) {
			return edges[i].delta < edges[j].delta // an end before a start at the same instant
		}
		return edges[i].at.Before(edges[j].at)
	})
	most, now := 0, 0
	for _, e := range edges {
		now += e.delta
		most = max(most, now)
	}
	return most
}

// tolerates says whether p carries both NoExecute tolerations the
// controller manager's taints need.
func tolerates(p corev1.Pod) bool {
	need := map[string]bool{"node.kubernetes.io/not-ready": true, "node.kubernetes.io/unreachable": true}
	for _, t := range p.Spec.Tolerations {
		if t.Effect == corev1.TaintEffectNoExecute || t.Effect == "" {
			delete(need, t.Key)
		}
	}
	return len(need) == 0
}
