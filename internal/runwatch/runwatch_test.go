package runwatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/inplace/record"
)

// Follow shows every step from the upgrade's start (a watch begun late
// included), each node's end and kubelift's Events, in order, and
// returns when the record ends.
func TestFollow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := fake.NewSimpleClientset()
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	u := &record.Upgrade{From: "v1.30.14", To: "v1.31.14", State: record.StateUpgradingKubelets, Started: t0, Updated: at(1)}
	u.SetNode("w-1", "worker", record.NodeUpgrading, record.StepKubelet, nil, at(1))
	u.Begin("w-1", "worker", "drain", at(1))
	u.SetNode("w-2", "worker", record.NodePending, "", nil, at(1))
	if err := record.Write(ctx, c, u); err != nil {
		t.Fatal(err)
	}
	old := record.NodeEvent("w-1", "UpgradingKubelet", "before this upgrade", t0.Add(-time.Hour))
	old.Name, old.UID = "old", "uid-old"
	ev := record.NodeEvent("w-1", "UpgradingKubelet", "kubelift: kubelet v1.30.14 -> v1.31.14", at(1))
	ev.Name, ev.UID = "now", "uid-now"
	for _, e := range []any{old, ev} {
		if _, err := c.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, e.(*corev1.Event), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	var lines []string
	seen := make(chan struct{}, 100)
	done := make(chan error, 1)
	go func() {
		got, err := Follow(ctx, c, Options{}, func(ch Change) {
			mu.Lock()
			lines = append(lines, fmt.Sprintf("%s %s %s%s%s%s %d/%d", ch.Kind, ch.Node, ch.State, stepOf(ch), ch.Reason, nodeStatus(ch), ch.Done, ch.Total))
			mu.Unlock()
			seen <- struct{}{}
		})
		if err == nil && got.State != record.StateComplete {
			err = fmt.Errorf("ended %s", got.State)
		}
		done <- err
	}()
	// The first sight: state, w-1's drain, its Event.
	for range 4 {
		select {
		case <-seen:
		case <-ctx.Done():
			t.Fatal("no first changes")
		}
	}
	// An Event while it goes (of its own UID: each is shown once).
	late := record.NodeEvent("w-2", "UpgradingKubelet", "kubelift: kubelet v1.30.14 -> v1.31.14", at(5))
	late.Name, late.UID = "late", "uid-late"
	if _, err := c.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-seen:
	case <-ctx.Done():
		t.Fatal("the Event posted while it goes was not shown")
	}
	u.Begin("w-1", "worker", "swap", at(2))
	u.Begin("w-1", "worker", "uncordon", at(3))
	u.SetNode("w-1", "worker", record.NodeDone, "", nil, at(4))
	u.SetNode("w-2", "worker", record.NodeUpgrading, record.StepKubelet, nil, at(5))
	u.Begin("w-2", "worker", "drain", at(5))
	u.SetNode("w-2", "worker", record.NodeDone, "", nil, at(6))
	u.State, u.Updated = record.StateComplete, at(7)
	if err := record.Write(ctx, c, u); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want := []string{
		"state  upgrading-kubelets 0/2", "step w-1 drain 0/2", "node w-1 upgrading 0/2", "event w-1 UpgradingKubelet 0/2", "event w-2 UpgradingKubelet 0/2",
		"step w-1 swap 2/2", "step w-1 uncordon 2/2", "node w-1 upgraded 2/2",
		"step w-2 drain 2/2", "node w-2 upgraded 2/2", "state  upgrade-complete 2/2",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("changes\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// A record that does not parse ends the watch, naming it; no record
// waits, until the context ends.
func TestFollowRefuses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := fake.NewSimpleClientset()
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	if _, err := Follow(short, c, Options{}, func(Change) {}); err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no upgrade recorded") {
		t.Errorf("no record: %v", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.Name, Namespace: "kube-system"},
		Data: map[string]string{"state.json": `{"steps":["drain"],"nodes":[{"name":"w-1","spans":[[7,0,5]]}]}`}}
	if _, err := c.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Follow(ctx, c, Options{}, func(Change) {}); err == nil || !strings.Contains(err.Error(), "node w-1: spans[0]") {
		t.Errorf("a bad record: %v", err)
	}
}

func nodeStatus(ch Change) string {
	if ch.Kind == KindNode {
		return ch.Status
	}
	return ""
}

func stepOf(ch Change) string {
	if ch.Kind == KindStep {
		return ch.Step
	}
	return ""
}

// Follow with To waits past another upgrade's record, an ended one
// included (the one before an Upgrade the controller has not begun).
func TestFollowTo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := fake.NewSimpleClientset()
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	prev := &record.Upgrade{From: "v1.29.15", To: "v1.30.14", State: record.StateComplete, Started: t0, Updated: t0}
	if err := record.Write(ctx, c, prev); err != nil {
		t.Fatal(err)
	}
	done := make(chan *record.Upgrade, 1)
	go func() {
		u, _ := Follow(ctx, c, Options{To: "v1.31.14"}, func(Change) {})
		done <- u
	}()
	select {
	case u := <-done:
		t.Fatalf("the watch ended on the upgrade to %s", u.To)
	case <-time.After(500 * time.Millisecond):
	}
	next := &record.Upgrade{From: "v1.30.14", To: "v1.31.14", State: record.StateComplete, Started: t0.Add(time.Hour), Updated: t0.Add(time.Hour)}
	if err := record.Write(ctx, c, next); err != nil {
		t.Fatal(err)
	}
	if u := <-done; u == nil || u.To != "v1.31.14" {
		t.Errorf("ended on %+v", u)
	}
}
