package record

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubelift/kubelift/internal/inplace/release"
)

func verbs(c *fake.Clientset) []string {
	var out []string
	for _, a := range c.Actions() {
		out = append(out, a.GetVerb())
	}
	return out
}

func TestStateWriterPutsWithoutReading(t *testing.T) {
	ctx := context.Background()
	c := fake.NewSimpleClientset()
	w := &Writer{Client: c}
	for i, status := range []string{NodePending, NodeDone, NodeDone} {
		s := &Upgrade{From: "v1.30.14", To: "v1.31.4", State: StateUpgradingKubelets}
		s.Node("worker-1", release.RoleWorker).Status = status
		if err := w.Write(ctx, func() ([]byte, error) { return json.Marshal(s) }); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	// The first write finds nothing and creates; the others only update.
	if got, want := verbs(c), []string{"get", "create", "update", "update"}; !slices.Equal(got, want) {
		t.Errorf("requests %v, want %v", got, want)
	}
	st, err := Read(ctx, c)
	if err != nil || st == nil || st.Nodes[0].Status != NodeDone {
		t.Fatalf("read back %+v, %v", st, err)
	}

	// Someone else wrote in between: one conflict, then a read and a write.
	c.ClearActions()
	conflicts := 1
	c.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, Name, nil)
		}
		return false, nil, nil
	})
	if err := w.Write(ctx, func() ([]byte, error) { return json.Marshal(&Upgrade{State: StateComplete}) }); err != nil {
		t.Fatal(err)
	}
	if got, want := verbs(c), []string{"update", "get", "update"}; !slices.Equal(got, want) {
		t.Errorf("after a conflict: requests %v, want %v", got, want)
	}
	if st, _ := Read(ctx, c); st.State != StateComplete {
		t.Errorf("state %s after the retried write", st.State)
	}
}

// An HA control plane's etcd changing leaders fails a write for a moment
// ("etcdserver: leader changed", an internal error): the write is made
// again, not the run failed (a kubeadm HA story's apply ended at its
// record step on it). An internal error that is an answer is not retried.
func TestWriterWritesAgainWhileEtcdChangesLeader(t *testing.T) {
	ctx := context.Background()
	c := fake.NewSimpleClientset()
	fenced := 0
	w := &Writer{Client: c, Holder: "run-1", Fence: func(context.Context) error { fenced++; return nil }}
	if err := w.Write(ctx, func() ([]byte, error) { return json.Marshal(&Upgrade{Holder: "run-1", State: StateStarted}) }); err != nil {
		t.Fatal(err)
	}
	c.ClearActions()
	fenced = 0
	failures := []error{apierrors.NewInternalError(errors.New("etcdserver: leader changed")), apierrors.NewInternalError(errors.New("etcdserver: leader changed"))}
	c.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if len(failures) > 0 {
			err := failures[0]
			failures = failures[1:]
			return true, nil, err
		}
		return false, nil, nil
	})
	if err := w.Write(ctx, func() ([]byte, error) { return json.Marshal(&Upgrade{Holder: "run-1", State: StateComplete}) }); err != nil {
		t.Fatalf("write through a leader change: %v", err)
	}
	if got, want := verbs(c), []string{"update", "get", "update", "get", "update"}; !slices.Equal(got, want) {
		t.Errorf("requests %v, want %v", got, want)
	}
	if fenced != 3 {
		t.Errorf("the fence was asked %d times, want 3 (once before each attempt)", fenced)
	}
	if st, _ := Read(ctx, c); st.State != StateComplete {
		t.Errorf("state %s after the write", st.State)
	}

	c.ClearActions()
	failures = []error{apierrors.NewInternalError(errors.New(`admission webhook "deny" denied the request`))}
	err := w.Write(ctx, func() ([]byte, error) { return json.Marshal(&Upgrade{Holder: "run-1", State: StateFailed}) })
	if err == nil || !strings.Contains(err.Error(), "admission webhook") {
		t.Fatalf("write refused by a webhook: %v, want its error", err)
	}
	if got := verbs(c); len(got) != 1 {
		t.Errorf("requests %v after a refusal, want the one update", got)
	}
}

// A run that is ending (its context done) does not wait out the retries.
func TestWriterStopsRetryingOnceItsContextEnds(t *testing.T) {
	c := fake.NewSimpleClientset()
	ctx, cancel := context.WithCancel(context.Background())
	c.PrependReactor("*", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		cancel() // the run ends while its write is under way
		return true, nil, apierrors.NewServiceUnavailable("starting")
	})
	w := &Writer{Client: c}
	if err := w.Write(ctx, func() ([]byte, error) { return json.Marshal(&Upgrade{State: StateFailed}) }); err == nil {
		t.Fatal("written, want the 503")
	}
	if got := verbs(c); len(got) != 1 {
		t.Errorf("requests %v, want one: none after the context ended", got)
	}
}

// A node's in-flight record and its done mark are written through an
// etcd leader change (the API server's 500 "etcdserver: leader changed"):
// without it the run stops at the node before its swap, or leaves a
// swapped node unmarked.
func TestNodeAnnotationsWrittenThroughALeaderChange(t *testing.T) {
	ctx := context.Background()
	c := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}})
	leaderChanges := 0
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if leaderChanges > 0 {
			leaderChanges--
			return true, nil, apierrors.NewInternalError(errors.New("etcdserver: leader changed"))
		}
		return false, nil, nil
	})
	node := func() *corev1.Node {
		t.Helper()
		n, err := c.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	leaderChanges = 2
	if err := MarkInFlight(ctx, c, "worker-1", &InFlight{From: "v1.31.4"}); err != nil {
		t.Fatalf("in-flight record: %v", err)
	}
	if f, err := InFlightOn(node()); err != nil || f == nil || f.From != "v1.31.4" {
		t.Fatalf("in-flight record read back %+v, %v", f, err)
	}
	leaderChanges = 1
	patch, err := DonePatch("v1.31.14", "sha256:abc")
	if err != nil {
		t.Fatal(err)
	}
	if err := PatchNode(ctx, c, "worker-1", patch); err != nil {
		t.Fatalf("done mark: %v", err)
	}
	if a := node().Annotations; a[AnnotationUpgradedTo] != "v1.31.14" || a[AnnotationInFlight] != "" {
		t.Errorf("annotations after the done mark: %v", a)
	}

	c.ClearActions()
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "worker-1", errors.New("no"))
	})
	if err := ClearInFlight(ctx, c, "worker-1"); !apierrors.IsForbidden(err) {
		t.Fatalf("refused patch: %v, want the refusal", err)
	}
	if got := verbs(c); len(got) != 1 {
		t.Errorf("requests %v after a refusal, want the one patch", got)
	}
}

// A node's steps are spans of the record's timeline: entered, ended by
// the next or by the node's end, written as [step, start ms, duration
// ms] and read back with their names and times.
func TestTimeline(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	s := &Upgrade{From: "v1.30.14", To: "v1.31.14", Started: t0}
	s.SetNode("cp-1", "control-plane", NodeUpgrading, "kube-apiserver to v1.31.14", nil, at(100))
	s.SetNode("cp-1", "control-plane", NodeUpgrading, "kube-apiserver to v1.31.14", nil, at(150)) // goes on
	s.SetNode("cp-1", "control-plane", NodePending, "control plane at v1.31.14", nil, at(900))
	s.SetNode("w-1", "worker", NodeUpgrading, StepKubelet, nil, at(1000)) // the walk's spans, not one of its own
	s.Begin("w-1", "worker", "drain", at(1000))
	s.Begin("w-1", "worker", "swap", at(1500))
	s.SetNode("w-1", "worker", NodeUpgrading, "kube-proxy", nil, at(2000))
	s.Begin("w-1", "worker", "kube-proxy", at(2100)) // the same step: goes on
	s.Begin("w-1", "worker", "uncordon", at(2500))
	s.SetNode("w-1", "worker", NodeFailed, StepKubelet, errors.New("boom"), at(2600))

	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"spans":[[1,1000,500],[2,1500,500],[3,2000,500],[4,2500,100]]`) {
		t.Errorf("written as %s", data)
	}
	got, err := Decode(&corev1.ConfigMap{Data: map[string]string{"state.json": string(data)}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range got.Nodes {
		for _, st := range got.Timeline(&n) {
			names = append(names, fmt.Sprintf("%s %s %d+%d", n.Name, st.Name, st.Start.Sub(t0).Milliseconds(), st.Duration(time.Time{}).Milliseconds()))
		}
	}
	want := "cp-1 kube-apiserver to v1.31.14 100+800,w-1 drain 1000+500,w-1 swap 1500+500,w-1 kube-proxy 2000+500,w-1 uncordon 2500+100"
	if strings.Join(names, ",") != want {
		t.Errorf("timeline\n got %s\nwant %s", strings.Join(names, ","), want)
	}

	// What the API returns is not trusted: a timeline that does not
	// parse is dropped, saying why (a resume and a rollback go on without
	// it; watch and report refuse it).
	for _, bad := range []string{
		`{"steps":["drain"],"nodes":[{"name":"w-1","status":"upgraded","spans":[[1,0,5]]}]}`,
		`{"steps":["drain"],"nodes":[{"name":"w-1","status":"upgraded","spans":[[0,-5,5]]}]}`,
		`{"steps":["drain"],"nodes":[{"name":"w-1","status":"upgraded","spans":[[0,0,-1],[0,5,5]]}]}`,
		`{"steps":[""],"nodes":[{"name":"w-1","status":"upgraded","spans":[[0,0,5]]}]}`,
		`{"steps":["drain"],"nodes":[{"name":"w-1","status":"upgraded","spans":[[0,0,1000000000000000]]}]}`,
	} {
		u, err := Decode(&corev1.ConfigMap{Data: map[string]string{"state.json": bad}})
		if err != nil || !strings.Contains(u.TimelineError, "node w-1: spans[") && !strings.Contains(u.TimelineError, "steps[0]") || len(u.Nodes[0].Spans) != 0 ||
			u.Nodes[0].Status != NodeDone {
			t.Errorf("%s: want the timeline dropped, got %+v %v", bad, u, err)
		}
	}
	if _, err := Decode(&corev1.ConfigMap{Data: map[string]string{"state.json": `{"steps":["drain"],"nodes":[{"name":"w-1","spans":[["drain",0,5]]}]}`}}); err == nil {
		t.Error("a span that is not three numbers was read")
	}
}

// A thousand nodes' record with every node's 19 kubelet steps and the
// plan's nodes fits the ConfigMap with its timeline; past the bound the
// record sheds the plan's nodes, then the timelines, never the nodes'
// states. A node's spans are bounded.
func TestRecordSize(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	steps := []string{"pre-hook", "announce", "drain", "prepare", "back up and record", "record in flight", "hash-skip file", "snapshot workloads", "tools", "runtime", "swap",
		"wait Ready", "verify", "post-hook", "kube-proxy", "settle", "workload gate", "uncordon", "mark done"}
	build := func(nodes int) *Upgrade {
		u := &Upgrade{From: "v1.30.14", To: "v1.31.14", Started: t0, State: StateComplete, Plan: &Plan{}}
		for i := range nodes {
			name := fmt.Sprintf("worker-%04d.pool-a.region-1.corp.example", i)
			u.Plan.Nodes = append(u.Plan.Nodes, PlannedNode{Name: name, Role: "worker", Kubelet: "v1.30.14", Runtime: "containerd://2.3.7"})
			u.SetNode(name, "worker", NodeUpgrading, StepKubelet, nil, t0.Add(time.Duration(i)*time.Second))
			for k, s := range steps {
				u.Begin(name, "worker", s, t0.Add(time.Duration(i)*time.Second+time.Duration(k)*1234*time.Millisecond))
			}
			u.Node(name, "").Containers = &Containers{Before: 12, Kept: 12}
			u.SetNode(name, "worker", NodeDone, "", nil, t0.Add(time.Duration(i+30)*time.Second))
		}
		return u
	}
	data, err := Marshal(build(1000))
	if err != nil || len(data) > MaxSize || !strings.Contains(string(data), `"spans"`) || !strings.Contains(string(data), `"kubelet":"v1.30.14"`) {
		t.Fatalf("1000 nodes: %d bytes (at most %d), timeline and plan kept: %v", len(data), MaxSize, err)
	}
	t.Logf("1000 nodes, 19 steps each, FQDN names: %d bytes", len(data))
	data, err = Marshal(build(3000))
	if err != nil || len(data) > MaxSize || strings.Contains(string(data), `"spans"`) || !strings.Contains(string(data), `"worker-2999.pool-a`) {
		t.Errorf("3000 nodes: %d bytes (at most %d), want the timelines shed and every node kept: %v", len(data), MaxSize, err)
	}
	u := &Upgrade{Started: t0}
	for i := range 500 {
		u.Begin("w-1", "worker", fmt.Sprintf("step %d", i%3), t0.Add(time.Duration(i)*time.Second))
	}
	if n := len(u.Node("w-1", "").Spans); n != maxSpans || u.Timeline(u.Node("w-1", ""))[n-1].Start != t0.Add(499*time.Second) {
		t.Errorf("500 steps entered: %d spans kept, want the newest %d", n, maxSpans)
	}
}
