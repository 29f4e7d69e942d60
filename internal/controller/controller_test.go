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

	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/upgradeapi"
)

// world is a controller over fake clients, its runner played by the test.
type world struct {
	t    *testing.T
	c    *Controller
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
	w := &world{t: t, kube: fake.NewSimpleClientset(), gate: make(chan struct{}), now: time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)}
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
	st := &record.Upgrade{From: "v1.30.14", To: "v1.31.4", State: record.StateFailed, Updated: time.Now()}
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
	time.Sleep(20 * w.c.Poll) // passes go by: a failed upgrade is not run again by itself
	if got := w.ran(); len(got) != 1 {
		t.Fatalf("ran %v, want once", got)
	}
	// A changed spec (a new generation) retries it.
	w.run = nil
	close(w.gate)
	u.Spec.Settle, u.Generation = "30s", 2
	if _, err := w.c.Upgrades.Update(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	u = w.until("v1.31.4", "completed", phase(upgradeapi.Complete))
	if u.Status.ObservedGeneration != 2 || u.Status.LastError != nil || len(w.ran()) != 2 {
		t.Errorf("retried: %+v, ran %v", u.Status, w.ran())
	}
}

// Before each node the run holds while the Upgrade is paused or its
// window closed, saying so; a changed spec stops the run there and runs
// it again with the new spec.
func TestHold(t *testing.T) {
	u := upgrade("v1.31.4")
	u.Spec.Paused = true
	w := newWorld(t, u)
	held := make(chan error, 10)
	w.run = func(ctx context.Context, r Run) (Outcome, error) {
		err := r.Hold(ctx, "worker-3")
		held <- err
		return Outcome{}, err
	}
	w.start()
	p := w.until("v1.31.4", "paused", phase(upgradeapi.Paused))
	if !strings.Contains(p.Status.Message, "holds before node worker-3: spec.paused") {
		t.Errorf("paused: %q", p.Status.Message)
	}
	select {
	case err := <-held:
		t.Fatalf("hold returned while paused: %v", err)
	case <-time.After(20 * w.c.Poll):
	}
	// Unpaused, but outside its window: it still holds.
	p.Spec.Paused = false
	p.Spec.Window = &upgradeapi.MaintenanceWindow{Start: "22:00", End: "04:00"}
	if _, err := w.c.Upgrades.Update(context.Background(), p); err != nil { // the same generation: a test's stand-in for a clock-only change
		t.Fatal(err)
	}
	w.until("v1.31.4", "said its window", func(u *upgradeapi.Upgrade) bool {
		return strings.Contains(u.Status.Message, "outside its window (22:00-04:00 UTC, every day)")
	})
	w.setClock(time.Date(2026, 12, 5, 23, 0, 0, 0, time.UTC))
	if err := <-held; err != nil {
		t.Fatalf("hold in the window: %v", err)
	}
	w.until("v1.31.4", "completed", phase(upgradeapi.Complete))
	evs := strings.Join(w.events(), "; ")
	for _, want := range []string{"v1.31.4 Paused", "v1.31.4 Resumed"} {
		if !strings.Contains(evs, want) {
			t.Errorf("events %s: no %q", evs, want)
		}
	}
}

// A window that closes while a run goes holds it before its next node.
func TestWindowClosesMidRun(t *testing.T) {
	u := upgrade("v1.31.4")
	u.Spec.Window = &upgradeapi.MaintenanceWindow{Start: "09:00", End: "17:00"}
	w := newWorld(t, u)
	nodes, closed := make(chan string), make(chan struct{})
	w.run = func(ctx context.Context, r Run) (Outcome, error) {
		for i, n := range []string{"worker-1", "worker-2"} {
			if i > 0 {
				<-closed // worker-1 is in flight when the window closes
			}
			if err := r.Hold(ctx, n); err != nil {
				return Outcome{}, err
			}
			nodes <- n
		}
		return Outcome{}, nil
	}
	w.start()
	if n := <-nodes; n != "worker-1" {
		t.Fatalf("first node %s", n)
	}
	w.setClock(time.Date(2026, 12, 5, 17, 30, 0, 0, time.UTC)) // closed
	close(closed)
	p := w.until("v1.31.4", "paused", phase(upgradeapi.Paused))
	if !strings.Contains(p.Status.Message, "holds before node worker-2: outside its window") {
		t.Errorf("paused: %q", p.Status.Message)
	}
	select {
	case n := <-nodes:
		t.Fatalf("%s went with the window closed", n)
	case <-time.After(20 * w.c.Poll):
	}
	w.setClock(time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)) // open again the next day
	if n := <-nodes; n != "worker-2" {
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
	u.Spec.Settle, u.Generation = "1m", 2
	if _, err := w.c.Upgrades.Update(context.Background(), u); err != nil {
		t.Fatal(err)
	}
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
