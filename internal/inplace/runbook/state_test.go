package runbook

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/verify"
	"github.com/kubelift/kubelift/internal/nodeaccess"
)

func verbs(c *fake.Clientset) []string {
	var out []string
	for _, a := range c.Actions() {
		out = append(out, a.GetVerb())
	}
	return out
}

// A hundred nodes reporting at once cost a handful of writes, the last
// word is stored by the time flushing stops, and nothing is written after.
func TestNodeUpdatesAreCoalesced(t *testing.T) {
	ctx := context.Background()
	c := fake.NewSimpleClientset()
	r := &upgradeRun{client: c, log: slog.New(slog.DiscardHandler), tgts: map[string]nodeaccess.Address{}, state: &record.Upgrade{State: record.StateUpgradingKubelets}}
	r.opts.Plan.Now = time.Now
	if err := r.save(ctx); err != nil {
		t.Fatal(err)
	}
	stop := r.startFlushing(ctx)
	for i := 0; i < 100; i++ {
		r.setNode(ctx, fmt.Sprintf("worker-%03d", i), record.NodeDone, "", nil)
	}
	// The loop itself stores them (within a flush interval or two).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if st, _ := record.Read(ctx, c); st != nil && len(st.Nodes) == 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the flush loop did not store the 100 nodes")
		}
	}
	stop()
	writes := func() int {
		n := 0
		for _, v := range verbs(c) {
			if v == "update" || v == "create" {
				n++
			}
		}
		return n
	}
	if w := writes(); w > 10 {
		t.Errorf("%d writes for 100 node updates", w)
	}
	st, err := record.Read(ctx, c)
	if err != nil || len(st.Nodes) != 100 {
		t.Fatalf("stored %d nodes (%v)", len(st.Nodes), err)
	}
	before := writes()
	r.setNode(ctx, "late", record.NodeDone, "", nil)
	if w := writes(); w != before {
		t.Errorf("a write after flushing stopped (%d, was %d)", w, before)
	}
}

// The in-flight record a run leaves on a Node reads back as written, and
// one a Node was given by somebody else is refused, naming node and
// annotation, rather than verified against.
func TestInFlightRecord(t *testing.T) {
	f := verify.InFlight("v1.30.14", map[string]nodeops.Container{"abc123": {What: "shop/api/app", PID: 42}},
		map[types.UID]verify.Pod{"0e6f-11": {Name: "shop/api", Phase: corev1.PodRunning}})
	v, err := f.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := record.DecodeInFlight("worker-1", v)
	if err != nil {
		t.Fatal(err)
	}
	before, pods := verify.FromInFlight(got)
	if got.From != "v1.30.14" || before["abc123"] != (nodeops.Container{What: "shop/api/app", PID: 42}) || pods["0e6f-11"].Name != "shop/api" {
		t.Fatalf("read back: %+v, %v", got, err)
	}
	forged := func(mutate func(*record.InFlight)) string {
		g := *f
		g.Containers = map[string]record.InFlightContainer{"abc123": {What: "x"}}
		mutate(&g)
		s, err := g.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for name, value := range map[string]string{
		"not base64":         "%%%",
		"not gzip":           "aGVsbG8=",
		"a from not version": forged(func(g *record.InFlight) { g.From = "$(reboot)" }),
		"a container id":     forged(func(g *record.InFlight) { g.Containers = map[string]record.InFlightContainer{"../../x": {}} }),
		"a pod uid":          forged(func(g *record.InFlight) { g.Pods = map[types.UID]record.InFlightPod{"a b": {}} }),
	} {
		if _, err := record.DecodeInFlight("worker-1", value); err == nil || !strings.Contains(err.Error(), "node worker-1: annotation "+record.AnnotationInFlight) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A run held back before a node (ErrNotStarted: a controller's pause or
// stop) leaves the record's state as it was; any other error fails it.
func TestHeldBackIsNoFailure(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("kubelets: node worker-2: pre-hook: %w: stopping", driver.ErrNotStarted), record.StateUpgradingKubelets},
		{fmt.Errorf("kubelets: node worker-2: swap: exit status 1"), record.StateFailed},
	} {
		c := fake.NewSimpleClientset()
		r := &upgradeRun{client: c, log: slog.New(slog.DiscardHandler), tgts: map[string]nodeaccess.Address{}, state: &record.Upgrade{State: record.StateUpgradingKubelets}}
		r.opts.Plan.Now = time.Now
		r.fail(ctx, tc.err)
		st, err := record.Read(ctx, c)
		if err != nil || st == nil || st.State != tc.want {
			t.Errorf("after %v: %+v, %v; want state %s", tc.err, st, err, tc.want)
		}
	}
}

// The walk records each node step it enters in the record's timeline,
// with the clock's times; the node's end ends the last.
func TestWalkRecordsTimeline(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	now := t0
	r := &upgradeRun{client: fake.NewSimpleClientset(), log: slog.New(slog.DiscardHandler), tgts: map[string]nodeaccess.Address{"w-1": {Role: "worker"}},
		state: &record.Upgrade{State: record.StateUpgradingKubelets, Started: t0}}
	r.opts.Plan.Now = func() time.Time { return now }
	step := func(name string, took time.Duration, err error) nodeStep {
		return nodeStep{name: name, do: func(context.Context, *kubeletRun) error { now = now.Add(took); return err }}
	}
	boom := fmt.Errorf("node w-1: swap: boom")
	err := r.walk(ctx, &kubeletRun{name: "w-1"}, []nodeStep{step("drain", 2*time.Second, nil), step("swap", 3*time.Second, boom), step("uncordon", time.Second, nil)})
	if err != boom {
		t.Fatalf("walk: %v", err)
	}
	r.setNode(ctx, "w-1", record.NodeFailed, record.StepKubelet, err)
	n := r.state.Node("w-1", "worker")
	var got []string
	for _, s := range r.state.Timeline(n) {
		got = append(got, fmt.Sprintf("%s@%s+%s", s.Name, s.Start.Sub(t0), s.End.Sub(s.Start)))
	}
	if strings.Join(got, " ") != "drain@0s+2s swap@2s+3s" {
		t.Errorf("timeline %v", got)
	}
}
