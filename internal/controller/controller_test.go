package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/upgradeapi"
	"github.com/kubelift/kubelift/internal/upgradelock"
)

// world is a controller over fake clients, its runner played by the test.
type world struct {
	t    *testing.T
	c    *Controller
	dyn  *dynamicfake.FakeDynamicClient
	kube *fake.Clientset
	mu   sync.Mutex
	runs []string      // the Upgrades run, in order
	gate chan struct{} // each run waits for a value (closed: none waits)
	run  func(ctx context.Context, r Run) (Outcome, error)
	now  time.Time
}

func newWorld(t *testing.T, ups ...*upgradeapi.Upgrade) *world {
	t.Helper()
	var objs []runtime.Object
	for i, u := range ups {
		u.APIVersion, u.Kind = upgradeapi.Group+"/"+upgradeapi.Version, upgradeapi.Kind
		u.CreationTimestamp = metav1.NewTime(time.Date(2026, 12, 1, 0, i, 0, 0, time.UTC))
		if u.Generation == 0 {
			u.Generation = 1
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(u)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{upgradeapi.Resource: "UpgradeList"}, objs...)
	w := &world{t: t, dyn: dyn, kube: fake.NewSimpleClientset(), gate: make(chan struct{}), now: time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)}
	w.c = &Controller{Upgrades: upgradeapi.Client{Dynamic: dyn}, Kube: w.kube, Identity: "controller-0", Poll: 5 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: w.clock,
		Run: func(ctx context.Context, r Run) (Outcome, error) {
			w.mu.Lock()
			w.runs = append(w.runs, r.Upgrade.Name)
			run := w.run
			w.mu.Unlock()
			if run != nil {
				return run(ctx, r)
			}
			select {
			case <-w.gate:
			case <-ctx.Done():
				return Outcome{}, ctx.Err()
			}
			return Outcome{From: "v1.30.14", To: r.Upgrade.Spec.Version, Findings: []upgradeapi.Finding{{Severity: "info", Check: "restarts", Message: "none"}}}, nil
		}}
	return w
}

func (w *world) clock() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.now
}

func (w *world) setClock(t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.now = t
}

// start runs the controller until the test ends.
func (w *world) start() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.c.Reconcile(ctx)
	}()
	w.t.Cleanup(func() { cancel(); <-done })
}

func (w *world) get(name string) *upgradeapi.Upgrade {
	w.t.Helper()
	u, err := w.c.Upgrades.Get(context.Background(), name)
	if err != nil || u == nil {
		w.t.Fatalf("upgrade %s: %v", name, err)
	}
	return u
}

// until waits (bounded) for cond on the Upgrade name.
func (w *world) until(name, what string, cond func(*upgradeapi.Upgrade) bool) *upgradeapi.Upgrade {
	w.t.Helper()
	for end := time.Now().Add(10 * time.Second); ; {
		u := w.get(name)
		if cond(u) {
			return u
		}
		if time.Now().After(end) {
			w.t.Fatalf("upgrade %s never %s: %+v", name, what, u.Status)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// looks waits (bounded) until the controller has read the Upgrades n
// more times: passes of its loop, or of a hold, have gone by.
func (w *world) looks(n int) {
	w.t.Helper()
	count := func() int {
		c := 0
		for _, a := range w.dyn.Actions() {
			if a.GetVerb() == "get" || a.GetVerb() == "list" {
				c++
			}
		}
		return c
	}
	want := count() + n
	for end := time.Now().Add(10 * time.Second); count() < want; {
		if time.Now().After(end) {
			w.t.Fatalf("the controller did not look at the Upgrades %d more times", n)
		}
		time.Sleep(time.Millisecond)
	}
}

// recv receives from ch, bounded.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s", what)
	}
	panic("unreachable")
}

// update writes u's spec as the API server does: a new generation.
func (w *world) update(u *upgradeapi.Upgrade) {
	w.t.Helper()
	u.Generation++
	if _, err := w.c.Upgrades.Update(context.Background(), u); err != nil {
		w.t.Fatal(err)
	}
}

func phase(p string) func(*upgradeapi.Upgrade) bool {
	return func(u *upgradeapi.Upgrade) bool { return u.Status.Phase == p }
}

func (w *world) ran() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.runs...)
}

func (w *world) events() []string {
	w.t.Helper()
	l, err := w.kube.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, e := range l.Items {
		out = append(out, e.InvolvedObject.Name+" "+e.Reason)
	}
	return out
}

// twoNodes is a run of worker-1 and worker-2, each sent on nodes once
// the run's hold lets it go; worker-2 is held only once between is
// closed.
func twoNodes(nodes chan<- string, between <-chan struct{}) func(context.Context, Run) (Outcome, error) {
	return func(ctx context.Context, r Run) (Outcome, error) {
		for i, n := range []string{"worker-1", "worker-2"} {
			if i > 0 {
				<-between
			}
			if err := r.Hold(ctx, n); err != nil {
				return Outcome{}, err
			}
			nodes <- n
		}
		return Outcome{}, nil
	}
}

func upgrade(name string) *upgradeapi.Upgrade {
	return &upgradeapi.Upgrade{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: upgradeapi.Spec{Version: "v1.31.4"}}
}

// One Upgrade runs at a time, the oldest first; the other says it waits
// for it, and runs when it is done.
func TestOneAtATime(t *testing.T) {
	w := newWorld(t, upgrade("first"), upgrade("second"))
	w.start()
	u := w.until("first", "ran", phase(upgradeapi.Running))
	if u.Status.Controller != "controller-0" || u.Status.Started == nil || u.Status.ObservedGeneration != 1 {
		t.Errorf("running: %+v", u.Status)
	}
	s := w.until("second", "waited", phase(upgradeapi.Waiting))
	if s.Status.WaitingFor != "first" || !strings.Contains(s.Status.Message, "one upgrade runs at a time") {
		t.Errorf("waiting: %+v", s.Status)
	}
	// Written while first runs, it is told it waits too.
	late := upgrade("late")
	late.CreationTimestamp = metav1.NewTime(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
	if _, err := w.c.Upgrades.Create(context.Background(), late); err != nil {
		t.Fatal(err)
	}
	w.until("late", "waited", func(u *upgradeapi.Upgrade) bool {
		return u.Status.Phase == upgradeapi.Waiting && u.Status.WaitingFor == "first"
	})
	w.gate <- struct{}{}
	u = w.until("first", "completed", phase(upgradeapi.Complete))
	if u.Status.Completed == nil || len(u.Status.Findings) != 1 || u.Status.From != "v1.30.14" {
		t.Errorf("complete: %+v", u.Status)
	}
	w.until("second", "ran", phase(upgradeapi.Running))
	close(w.gate)
	w.until("late", "completed", phase(upgradeapi.Complete))
	if got := w.ran(); strings.Join(got, ",") != "first,second,late" {
		t.Errorf("ran %v, want first, second, late, each once", got)
	}
	evs := strings.Join(w.events(), "; ")
	for _, want := range []string{"first Running", "first Complete", "second Complete"} {
		if !strings.Contains(evs, want) {
			t.Errorf("events %s: no %q", evs, want)
		}
	}
}

// A controller that takes over runs first the Upgrade the one before
// it left running, though another is older.
func TestResumesTheStartedUpgrade(t *testing.T) {
	started := upgrade("started")
	started.Status.Phase = upgradeapi.Running
	w := newWorld(t, upgrade("older"), started)
	close(w.gate)
	w.start()
	w.until("older", "completed", phase(upgradeapi.Complete))
	if got := w.ran(); strings.Join(got, ",") != "started,older" {
		t.Errorf("ran %v, want the started upgrade first", got)
	}
}

// A failed run names the node, its step and the reason, from the
// record; it is not run again until its spec changes.
func TestFailureNamesTheNode(t *testing.T) {
	w := newWorld(t, upgrade("v1.31.4"))
	st := &record.Upgrade{From: "v1.30.14", To: "v1.31.4", State: record.StateFailed, Updated: w.clock().Add(time.Minute)} // written by the run
	st.Node("cp-1", "control-plane").Status = record.NodeDone
	n := st.Node("worker-1", "worker")
	n.Status, n.Step, n.LastError = record.NodeRolledBack, "kubelet", "wait Ready: not Ready within 5m0s"
	if err := record.Write(context.Background(), w.kube, st); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cp-1", "worker-1"} {
		if _, err := w.kube.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: map[string]string{"cp-1": "v1.31.4", "worker-1": "v1.30.14"}[name]}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w.run = func(context.Context, Run) (Outcome, error) {
		return Outcome{}, errors.New("node worker-1: kubelet: rolled back")
	}
	w.start()
	u := w.until("v1.31.4", "failed", phase(upgradeapi.Failed))
	want := upgradeapi.FailedAction{Node: "worker-1", Step: "kubelet", Reason: "wait Ready: not Ready within 5m0s"}
	if u.Status.LastError == nil || *u.Status.LastError != want || u.Status.Current != "worker-1" || u.Status.Progress != "1/2" {
		t.Fatalf("failed: %+v, last error %+v", u.Status, u.Status.LastError)
	}
	if !strings.Contains(strings.Join(w.events(), ";"), "v1.31.4 Failed") {
		t.Errorf("no Failed event: %v", w.events())
	}
	w.looks(20) // passes go by: a failed upgrade is not run again by itself
	if got := w.ran(); len(got) != 1 {
		t.Fatalf("ran %v, want once", got)
	}
	// The next attempt (a new generation) retries it.
	w.mu.Lock()
	w.run = nil
	w.mu.Unlock()
	close(w.gate)
	u.Spec.Attempt = 1
	w.update(u)
	u = w.until("v1.31.4", "completed", phase(upgradeapi.Complete))
	if u.Status.ObservedGeneration != 2 || u.Status.LastError != nil || len(w.ran()) != 2 {
		t.Errorf("retried: %+v, ran %v", u.Status, w.ran())
	}
}

// A paused Upgrade, or one outside its window, does not start; unpaused
// (a new generation: paused is in the spec) it runs, once, not started
// again for the change; the window opening lets it start.
func TestHoldBeforeTheStart(t *testing.T) {
	u := upgrade("v1.31.4")
	u.Spec.Paused = true
	w := newWorld(t, u)
	close(w.gate)
	w.start()
	p := w.until("v1.31.4", "paused", phase(upgradeapi.Paused))
	if p.Status.Message != "holds before it starts: spec.paused" {
		t.Errorf("paused: %q", p.Status.Message)
	}
	w.looks(10)
	if got := w.ran(); len(got) != 0 {
		t.Fatalf("a paused upgrade ran: %v", got)
	}
	// Unpaused, but outside its window: it still holds.
	p.Spec.Paused = false
	p.Spec.Window = &upgradeapi.MaintenanceWindow{Start: "22:00", End: "04:00"}
	w.update(p)
	w.until("v1.31.4", "said its window", func(u *upgradeapi.Upgrade) bool {
		return u.Status.Message == "holds before it starts: outside its window (22:00-04:00 UTC, every day)"
	})
	w.looks(10)
	if got := w.ran(); len(got) != 0 {
		t.Fatalf("an upgrade out of its window ran: %v", got)
	}
	w.setClock(time.Date(2026, 12, 5, 23, 0, 0, 0, time.UTC))
	u = w.until("v1.31.4", "completed", phase(upgradeapi.Complete))
	if got := w.ran(); len(got) != 1 || u.Status.ObservedGeneration != u.Generation || u.Generation != 2 {
		t.Errorf("ran %v, observed generation %d of %d: want once, at generation 2 (the change held it, not changed what it ran)", got, u.Status.ObservedGeneration, u.Generation)
	}
	evs := strings.Join(w.events(), "; ")
	for _, want := range []string{"v1.31.4 Paused", "v1.31.4 Resumed"} {
		if !strings.Contains(evs, want) {
			t.Errorf("events %s: no %q", evs, want)
		}
	}
}

// Paused mid-run, the run holds before its next node (the node in
// flight finishes), says so, and goes on, not started again, when
// unpaused.
func TestPausedMidRun(t *testing.T) {
	w := newWorld(t, upgrade("v1.31.4"))
	nodes, paused := make(chan string), make(chan struct{})
	w.run = twoNodes(nodes, paused) // worker-1 is in flight when it is paused
	w.start()
	if n := recv(t, nodes, "first node"); n != "worker-1" {
		t.Fatalf("first node %s", n)
	}
	u := w.get("v1.31.4")
	u.Spec.Paused = true
	w.update(u)
	close(paused)
	p := w.until("v1.31.4", "paused", phase(upgradeapi.Paused))
	if p.Status.Message != "holds before node worker-2: spec.paused" {
		t.Errorf("paused: %q", p.Status.Message)
	}
	w.looks(10)
	select {
	case n := <-nodes:
		t.Fatalf("%s went while paused", n)
	default:
	}
	p.Spec.Paused = false
	w.update(p)
	if n := recv(t, nodes, "next node"); n != "worker-2" {
		t.Fatalf("next node %s", n)
	}
	w.until("v1.31.4", "completed", phase(upgradeapi.Complete))
	if got := w.ran(); len(got) != 1 {
		t.Errorf("ran %v: pausing started the run again", got)
	}
}

// A window that closes while a run goes holds it before its next node.
func TestWindowClosesMidRun(t *testing.T) {
	u := upgrade("v1.31.4")
	u.Spec.Window = &upgradeapi.MaintenanceWindow{Start: "09:00", End: "17:00"}
	w := newWorld(t, u)
	nodes, closed := make(chan string), make(chan struct{})
	w.run = twoNodes(nodes, closed) // worker-1 is in flight when the window closes
	w.start()
	if n := recv(t, nodes, "first node"); n != "worker-1" {
		t.Fatalf("first node %s", n)
	}
	w.setClock(time.Date(2026, 12, 5, 17, 30, 0, 0, time.UTC)) // closed
	close(closed)
	p := w.until("v1.31.4", "paused", phase(upgradeapi.Paused))
	if !strings.Contains(p.Status.Message, "holds before node worker-2: outside its window") {
		t.Errorf("paused: %q", p.Status.Message)
	}
	w.looks(10)
	select {
	case n := <-nodes:
		t.Fatalf("%s went with the window closed", n)
	default:
	}
	w.setClock(time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)) // open again the next day
	if n := recv(t, nodes, "next node"); n != "worker-2" {
		t.Fatalf("next node %s", n)
	}
	w.until("v1.31.4", "completed", phase(upgradeapi.Complete))
}

// A changed spec stops the run before its next node; it runs again with
// the new spec, and is not marked failed.
func TestSpecChangeRunsAgain(t *testing.T) {
	w := newWorld(t, upgrade("v1.31.4"))
	var settles []string
	changed := make(chan struct{})
	w.run = func(ctx context.Context, r Run) (Outcome, error) {
		w.mu.Lock()
		settles = append(settles, r.Upgrade.Spec.Settle)
		n := len(settles)
		w.mu.Unlock()
		if n == 1 {
			<-changed
		}
		return Outcome{}, r.Hold(ctx, "worker-1")
	}
	w.start()
	u := w.until("v1.31.4", "ran", phase(upgradeapi.Running))
	u.Spec.Settle = "1m"
	w.update(u)
	close(changed)
	u = w.until("v1.31.4", "completed", phase(upgradeapi.Complete))
	w.mu.Lock()
	defer w.mu.Unlock()
	if fmt.Sprint(settles) != "[ 1m]" || u.Status.ObservedGeneration != 2 {
		t.Errorf("runs with settle %q, observed generation %d: want the first spec, then the changed one", settles, u.Status.ObservedGeneration)
	}
	if !strings.Contains(strings.Join(w.events(), ";"), "SpecChanged") {
		t.Errorf("no SpecChanged event: %v", w.events())
	}
}

// The run's record is copied into the status as it goes: each node's
// status, step and kubelet, the progress and the node in flight.
func TestMirrorRecord(t *testing.T) {
	st := &record.Status{Upgrade: &record.Upgrade{From: "v1.30.14", To: "v1.31.4", Updated: time.Now()},
		Kubelets: map[string]string{"cp-1": "v1.31.4", "worker-1": "v1.30.14", "worker-2": "v1.30.14"}}
	st.Node("cp-1", "control-plane").Status = record.NodeDone
	n := st.Node("worker-1", "worker")
	n.Status, n.Step = record.NodeUpgrading, "kubelet"
	st.Node("worker-2", "worker")
	var s upgradeapi.Status
	mirrorRecord(&s, st)
	if s.Progress != "1/3" || s.Current != "worker-1" || len(s.Nodes) != 3 || s.Nodes[1].Step != "kubelet" || s.Nodes[0].Version != "v1.31.4" {
		t.Fatalf("mirrored: %+v", s)
	}
}

// An earlier run's record of the same version (written before this
// Upgrade started) is not this Upgrade's failure.
func TestStaleRecordIsNotTheFailure(t *testing.T) {
	w := newWorld(t, upgrade("v1.31.4"))
	st := &record.Upgrade{From: "v1.30.14", To: "v1.31.4", State: record.StateFailed, Updated: w.clock().Add(-time.Hour)}
	n := st.Node("worker-1", "worker")
	n.Status, n.Step, n.LastError = record.NodeRolledBack, "kubelet", "an earlier run's"
	if err := record.Write(context.Background(), w.kube, st); err != nil {
		t.Fatal(err)
	}
	w.run = func(context.Context, Run) (Outcome, error) {
		return Outcome{}, errors.New("plan: blocked by 1 finding")
	}
	w.start()
	u := w.until("v1.31.4", "failed", phase(upgradeapi.Failed))
	want := upgradeapi.FailedAction{Reason: "plan: blocked by 1 finding"}
	if u.Status.LastError == nil || *u.Status.LastError != want || u.Status.Current != "" || len(u.Status.Nodes) != 0 {
		t.Errorf("failed: %+v, last error %+v", u.Status, u.Status.LastError)
	}
}

// Another run holding the upgrade lock (the last leader's, stopping) is
// not a failure: the next pass runs it again.
func TestLockedIsNotAFailure(t *testing.T) {
	w := newWorld(t, upgrade("v1.31.4"))
	w.c.LockedBackoff = 20 * time.Millisecond
	tries := 0
	w.run = func(context.Context, Run) (Outcome, error) {
		if tries++; tries == 1 {
			return Outcome{}, fmt.Errorf("lock: %w", &upgradelock.LockedError{Holder: "controller-1_abc"})
		}
		return Outcome{}, nil
	}
	failed := false
	w.dyn.PrependReactor("update", "upgrades", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if u, ok := a.(k8stesting.UpdateAction).GetObject().(*unstructured.Unstructured); ok {
			if p, _, _ := unstructured.NestedString(u.Object, "status", "phase"); p == upgradeapi.Failed {
				failed = true
			}
		}
		return false, nil, nil
	})
	w.start()
	w.until("v1.31.4", "completed", phase(upgradeapi.Complete))
	if failed || tries != 2 {
		t.Errorf("written Failed %v, tries %d: want never, and a second try", failed, tries)
	}
	if !strings.Contains(strings.Join(w.events(), ";"), "v1.31.4 Locked") {
		t.Errorf("no Locked event: %v", w.events())
	}
}

// Stopping (the pod deleted), the run stops before its next node, the
// Upgrade not failed and left running for the next leader, and no other
// Upgrade is started.
func TestStoppingHandsOverAtANodeBoundary(t *testing.T) {
	w := newWorld(t, upgrade("v1.31.4"), upgrade("next"))
	stopping := make(chan struct{})
	w.c.Stopping = stopping
	nodes := make(chan string)
	held := make(chan error, 1)
	w.run = func(ctx context.Context, r Run) (Outcome, error) {
		if err := r.Hold(ctx, "worker-1"); err != nil {
			return Outcome{}, err
		}
		nodes <- "worker-1"
		<-stopping // worker-1 in flight when the pod is deleted
		err := r.Hold(ctx, "worker-2")
		held <- err
		return Outcome{}, fmt.Errorf("node worker-2: pre-hook: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan error, 1)
	go func() { ended <- w.c.Reconcile(ctx) }()
	recv(t, nodes, "first node")
	close(stopping)
	if err := recv(t, held, "hold before worker-2"); !errors.Is(err, errStopping) {
		t.Fatalf("hold while stopping: %v", err)
	}
	if err := recv(t, ended, "Reconcile's end"); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if u := w.get("v1.31.4"); u.Status.Phase != upgradeapi.Running {
		t.Errorf("handed over: %s %q, want Running for the next leader", u.Status.Phase, u.Status.Message)
	}
	if got := w.ran(); len(got) != 1 {
		t.Errorf("ran %v: want the one, and no other started", got)
	}
}
