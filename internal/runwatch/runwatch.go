// Package runwatch follows an upgrade as it happens, from the cluster
// alone: its record (kube-system/kubelift-upgrade, with each node's
// timeline) and the Events kubelift posts on Nodes, as a stream of
// changes (a node entering a step, a node's status, the upgrade's
// state), until the upgrade ends. Any machine with the kubeconfig can
// follow a run another machine, or the controller, drives.
package runwatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubelift/kubelift/internal/inplace/record"
)

// Kinds of Change.
const (
	KindState = "state" // the upgrade's state
	KindStep  = "step"  // a node entered a step
	KindNode  = "node"  // a node's status
	KindEvent = "event" // an Event kubelift posted on a Node
)

// Change is one thing that happened.
type Change struct {
	At   time.Time `json:"at"`
	Kind string    `json:"kind"`
	// State is the upgrade's (KindState), From and To its versions.
	State    string `json:"state,omitempty"`
	From     string `json:"from,omitempty"`
	To       string `json:"to,omitempty"`
	Node     string `json:"node,omitempty"`
	Step     string `json:"step,omitempty"`
	Status   string `json:"status,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
	Done     int    `json:"done"`
	Total    int    `json:"total"`
	Finished bool   `json:"finished,omitempty"`
}

// Ended says whether the record's state is an end: complete, failed or
// rolled back.
func Ended(u *record.Upgrade) bool {
	switch u.State {
	case record.StateComplete, record.StateFailed, record.StateRolledBack:
		return true
	}
	return false
}

// Diff is what changed from before to after, in order: the state (last
// when it is an end), per node the steps entered (each span new since
// before), then its status. before nil is everything so far; a record of another upgrade
// (another start) counts as new.
func Diff(before, after *record.Upgrade) []Change {
	if before != nil && !before.Started.Equal(after.Started) {
		before = nil
	}
	done, total := Progress(after)
	var out []Change
	var state []Change
	if before == nil || before.State != after.State || before.LastError != after.LastError {
		state = append(state, Change{At: after.Updated, Kind: KindState, State: after.State, From: after.From, To: after.To, Message: after.LastError,
			Done: done, Total: total, Finished: Ended(after)})
	}
	if !Ended(after) { // an end is said after what led to it
		out, state = state, nil
	}
	was := map[string]*record.Node{}
	if before != nil {
		for i := range before.Nodes {
			was[before.Nodes[i].Name] = &before.Nodes[i]
		}
	}
	for i := range after.Nodes {
		n := &after.Nodes[i]
		p := was[n.Name]
		seen := 0
		if p != nil {
			seen = len(p.Spans)
		}
		steps := after.Timeline(n)
		for _, s := range steps[min(seen, len(steps)):] {
			out = append(out, Change{At: s.Start, Kind: KindStep, Node: n.Name, Step: s.Name, Status: record.NodeUpgrading, Done: done, Total: total})
		}
		if p == nil || p.Status != n.Status || p.LastError != n.LastError {
			if p == nil && n.Status == record.NodePending {
				continue // nothing happened to it yet
			}
			out = append(out, Change{At: n.Updated, Kind: KindNode, Node: n.Name, Status: n.Status, Step: n.Step, Message: n.LastError, Done: done, Total: total})
		}
	}
	return append(out, state...)
}

// Progress is the nodes the upgrade is done with (upgraded, or not
// selected) of all.
func Progress(u *record.Upgrade) (done, total int) {
	for _, n := range u.Nodes {
		if n.Status == record.NodeDone || n.Status == record.NodeSkipped {
			done++
		}
	}
	return done, len(u.Nodes)
}

// maxPending bounds the Events kept before the first record is seen.
const maxPending = 10000

// Options narrow what Follow waits for.
type Options struct {
	// To, when set, is the version the upgrade followed goes to: a
	// record of another upgrade (the one before an Upgrade the
	// controller has not begun yet) is waited past, not taken for it.
	To string
}

// Follow watches the record and kubelift's Node Events (one LIST, then
// a WATCH, each; they come back after an API server restart) and gives
// emit every change, until the record ends: from the upgrade's start, so
// that a watch begun late shows every step. With no record it waits for
// one. It returns the record as it ended. emit is called from Follow's
// goroutine, never under a lock the watches take.
func Follow(ctx context.Context, c kubernetes.Interface, opts Options, emit func(Change)) (*record.Upgrade, error) {
	// One read first: a watch that may not read the record says so now,
	// not by waiting for ever.
	if _, err := c.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, record.Name, metav1.GetOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("configmap kube-system/%s: %w", record.Name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu      sync.Mutex
		last    *record.Upgrade
		queue   []Change
		wake    = make(chan struct{}, 1)
		ended   *record.Upgrade
		failed  error
		pending []*corev1.Event // Events before the record said when the upgrade started
		posted  = map[string]bool{}
	)
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	// postEvent and onRecord run under mu: they queue changes.
	postEvent := func(ev *corev1.Event) {
		at := ev.LastTimestamp.Time
		if at.IsZero() {
			at = ev.EventTime.Time
		}
		key := string(ev.UID) + "/" + ev.ResourceVersion
		if ev.Source.Component != "kubelift" || ev.InvolvedObject.Kind != "Node" || posted[key] || at.Before(last.Started) {
			return
		}
		posted[key] = true
		done, total := Progress(last)
		queue = append(queue, Change{At: at, Kind: KindEvent, Node: ev.InvolvedObject.Name, Reason: ev.Reason, Message: ev.Message, Done: done, Total: total})
	}
	onRecord := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok || cm.Name != record.Name {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		defer signal()
		u, err := record.Decode(cm)
		if err == nil && u.TimelineError != "" {
			err = errors.New(u.TimelineError)
		}
		if err != nil {
			failed = err
			return
		}
		if opts.To != "" && u.To != opts.To {
			return // another upgrade's record
		}
		queue = append(queue, Diff(last, u)...)
		last = u
		for _, ev := range pending {
			postEvent(ev)
		}
		pending = nil
		if Ended(u) {
			ended = u
		}
	}
	onDelete := func(any) {
		mu.Lock()
		defer mu.Unlock()
		failed = fmt.Errorf("configmap kube-system/%s: deleted while watched", record.Name)
		signal()
	}
	onEvent := func(obj any) {
		ev, ok := obj.(*corev1.Event)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if last == nil {
			if len(pending) < maxPending {
				pending = append(pending, ev)
			}
			return
		}
		postEvent(ev)
		signal()
	}
	records := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(metav1.NamespaceSystem),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", record.Name).String()
		}))
	events := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(metav1.NamespaceDefault),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("source", "kubelift").String()
		}))
	if _, err := records.Core().V1().ConfigMaps().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onRecord, UpdateFunc: func(_, n any) { onRecord(n) }, DeleteFunc: onDelete,
	}); err != nil {
		return nil, err
	}
	if _, err := events.Core().V1().Events().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onEvent, UpdateFunc: func(_, n any) { onEvent(n) },
	}); err != nil {
		return nil, err
	}
	// Events that come before the record's first sight wait for it
	// (pending); a watch that may not list Events follows the record alone.
	events.Start(ctx.Done())
	records.Start(ctx.Done())
	defer func() {
		cancel()
		events.Shutdown()
		records.Shutdown()
	}()
	for {
		select {
		case <-wake:
		case <-ctx.Done():
			mu.Lock()
			u := last
			mu.Unlock()
			if u == nil {
				return nil, fmt.Errorf("no upgrade recorded in configmap kube-system/%s: %w", record.Name, ctx.Err())
			}
			return u, ctx.Err()
		}
		mu.Lock()
		out, end, err := queue, ended, failed
		queue = nil
		mu.Unlock()
		for _, ch := range out {
			emit(ch)
		}
		switch {
		case err != nil:
			return nil, err
		case end != nil:
			return end, nil
		}
	}
}
