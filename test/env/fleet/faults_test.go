package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/drain"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/upgradelock"
)

// faultRun is one apply on a fresh fleet, with the options the failure
// tests share; change adjusts them.
type faultRun struct {
	w      *testWorld
	target *release.Release
	src    *memSource
	opts   inplace.ApplyOptions
}

// newKwokRun is a fault run whose Nodes KWOK plays (a kubelet restart
// comes back at the new version), until the test ends or cancel.
func newKwokRun(t *testing.T) (*faultRun, context.Context, context.CancelFunc) {
	r := newFaultRun(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	kwok(ctx, t, r.w.client)
	return r, ctx, cancel
}

func newFaultRun(t *testing.T) *faultRun {
	t.Helper()
	target, src, bins := newTarget(t, mustCatalog(t))
	w := newWorld(t, bins)
	return &faultRun{w: w, target: target, src: src, opts: inplace.ApplyOptions{
		Plan: preflight.PlanOptions{Client: w.client, Target: target, Catalog: w.cat, Connector: w.dialer, Inventory: w.inv, Parallel: 3, HealthWindow: 200 * time.Millisecond,
			MaxUnavailable: "1", Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))},
		Source: src, CacheDir: t.TempDir(), Settle: time.Millisecond, ReadyTimeout: 5 * time.Second, LockDuration: 3 * time.Second,
	}}
}

func (r *faultRun) apply(ctx context.Context) (*inplace.ApplyResult, error) {
	return inplace.Apply(ctx, r.opts)
}

// played counts the commands a handler played on a node.
func (r *faultRun) played(node, handler string) int {
	n := 0
	for _, c := range r.w.fleet.Stats().Nodes[node].Commands {
		if c.Handler == handler {
			n++
		}
	}
	return n
}

// state reads the recorded upgrade.
func (r *faultRun) state(t *testing.T) *record.Upgrade {
	t.Helper()
	st, err := record.Read(context.Background(), r.w.client)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// nodeEntry is a node's entry in the recorded state.
func nodeEntry(st *record.Upgrade, name string) record.Node {
	for _, n := range st.Nodes {
		if n.Name == name {
			return n
		}
	}
	return record.Node{}
}

// noCordonOfOurs: no Node is left cordoned by kubelift.
func (r *faultRun) noCordonOfOurs(t *testing.T) {
	t.Helper()
	for _, s := range specs {
		n, err := r.w.client.CoreV1().Nodes().Get(context.Background(), s.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Annotations[drain.AnnotationCordoned] != "" {
			t.Errorf("%s left cordoned by the run (unschedulable %v)", s.Name, n.Spec.Unschedulable)
		}
	}
}

// The failure-injection table, in the style of kubeadm's
// staticpods_test.go: a fault at each step of apply, and the end state it
// must leave: the failed node restored or untouched, nothing left
// cordoned, the state upgrade-failed with the reason, the error naming
// the node and step.
func TestApplyFaultAtEachStep(t *testing.T) {
	for _, tc := range []struct {
		name string
		// inject sets the fault up on the fleet; api on the API server.
		inject func(f *Fleet)
		api    func(c *fake.Clientset)
		// wantErr are parts of the error.
		wantErr []string
		// failedNode, when set, is the node the state says failed, with
		// status.
		failedNode, status string
		// check the end state.
		check func(t *testing.T, r *faultRun)
	}{
		{
			name:    "staging a file fails: no node is touched",
			inject:  func(f *Fleet) { f.Fail("worker-1", "stage file", 1, -1) },
			wantErr: []string{"stage", "worker-1", "injected failure"},
			check: func(t *testing.T, r *faultRun) {
				for _, s := range specs {
					if n := r.played(s.Name, "back up") + r.played(s.Name, "swap"); n != 0 {
						t.Errorf("%s: %d backups and swaps after staging failed", s.Name, n)
					}
				}
				if st := r.state(t); st != nil {
					t.Errorf("a state was recorded before anything was done: %+v", st)
				}
			},
		},
		{
			name:    "the etcd snapshot fails: the control plane is not touched",
			inject:  func(f *Fleet) { f.Fail("cp-1", "etcd snapshot", 1, 1) },
			wantErr: []string{"back up etcd", "node cp-1", "--skip-etcd-backup"},
			check: func(t *testing.T, r *faultRun) {
				if n := r.played("cp-1", "swap"); n != 0 {
					t.Errorf("%d swaps after the snapshot failed", n)
				}
				if v := r.w.fleet.Running("cp-1", "kube-apiserver"); v != oldVersion {
					t.Errorf("cp-1 kube-apiserver runs %s", v)
				}
			},
		},
		{
			name:       "backing up the API server fails: it is not swapped",
			inject:     func(f *Fleet) { f.Fail("cp-1", "back up", 1, 1) },
			wantErr:    []string{"node cp-1", "back up kube-apiserver", "injected failure"},
			failedNode: "cp-1", status: record.NodeFailed,
			check: func(t *testing.T, r *faultRun) {
				if n := r.played("cp-1", "swap"); n != 0 {
					t.Errorf("%d swaps after the backup failed", n)
				}
				if v := r.w.fleet.Running("cp-1", "kube-apiserver"); v != oldVersion {
					t.Errorf("cp-1 kube-apiserver runs %s", v)
				}
			},
		},
		{
			name:       "swapping the API server fails: it is restored",
			inject:     func(f *Fleet) { f.Fail("cp-1", "swap", 1, 1) },
			wantErr:    []string{"node cp-1", "swap kube-apiserver", "rolled back to " + oldVersion},
			failedNode: "cp-1", status: record.NodeRolledBack,
			check: func(t *testing.T, r *faultRun) {
				if n := r.played("cp-1", "restore"); n != 1 {
					t.Errorf("%d restores on cp-1", n)
				}
				if v := r.w.fleet.Running("cp-1", "kube-apiserver"); v != oldVersion {
					t.Errorf("cp-1 kube-apiserver runs %s", v)
				}
			},
		},
		{
			name:       "a node's running version cannot be read: it is not touched",
			inject:     func(f *Fleet) { f.Fail("worker-2", "running version", 255, -1) },
			wantErr:    []string{"node worker-2", "read kubelet's version", "injected failure"},
			failedNode: "worker-2", status: record.NodeFailed,
			check: func(t *testing.T, r *faultRun) {
				if n := r.played("worker-2", "back up") + r.played("worker-2", "swap"); n != 0 {
					t.Errorf("worker-2: %d backups and swaps", n)
				}
				if v := r.w.fleet.Running("worker-2", "kubelet"); v != oldVersion {
					t.Errorf("worker-2 kubelet runs %s", v)
				}
				if v := r.w.fleet.Running("worker-1", "kubelet"); v != newVersion {
					t.Errorf("worker-1, before it in the window, runs %s", v)
				}
			},
		},
		{
			name:       "writing the hash-skip file fails: the kubelet is not swapped",
			inject:     func(f *Fleet) { f.Fail("worker-1", "write hash-skip", 1, 1) },
			wantErr:    []string{"node worker-1", "write the hash-skip file"},
			failedNode: "worker-1", status: record.NodeFailed,
			check: func(t *testing.T, r *faultRun) {
				if n := r.played("worker-1", "swap"); n != 0 {
					t.Errorf("worker-1: %d swaps", n)
				}
			},
		},
		{
			name:    "recording the state fails: no node is touched",
			inject:  func(*Fleet) {},
			api:     func(c *fake.Clientset) { c.PrependReactor("create", "configmaps", refuse) },
			wantErr: []string{"record", "refused by the test"},
			check: func(t *testing.T, r *faultRun) {
				for _, s := range specs {
					if n := r.played(s.Name, "back up") + r.played(s.Name, "etcd snapshot"); n != 0 {
						t.Errorf("%s: %d backups", s.Name, n)
					}
				}
			},
		},
		{
			name:    "adding tolerations fails: nothing restarts",
			inject:  func(*Fleet) {},
			api:     func(c *fake.Clientset) { c.PrependReactor("patch", "pods", refuse) },
			wantErr: []string{"workloads", "add tolerations", "refused by the test"},
			check: func(t *testing.T, r *faultRun) {
				for _, s := range specs {
					if v := r.w.fleet.Running(s.Name, "kubelet"); v != oldVersion {
						t.Errorf("%s kubelet runs %s", s.Name, v)
					}
				}
				// The tolerations come before any component restarts.
				if v := r.w.fleet.Running("cp-1", "kube-apiserver"); v != oldVersion {
					t.Errorf("cp-1 kube-apiserver runs %s: the control plane moved before the pods had their tolerations", v)
				}
			},
		},
		{
			name:   "marking a node done fails: it stays upgraded, the run stops, a re-run marks it",
			inject: func(*Fleet) {},
			api: func(c *fake.Clientset) {
				c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
					if pa, ok := a.(k8stesting.PatchAction); ok && pa.GetName() == "worker-1" && strings.Contains(string(pa.GetPatch()), inplace.AnnotationUpgradedTo) {
						return true, nil, errors.New("refused by the test")
					}
					return false, nil, nil
				})
			},
			wantErr:    []string{"node worker-1: mark done", "refused by the test"},
			failedNode: "worker-1", status: record.NodeFailed,
			check: func(t *testing.T, r *faultRun) {
				if v := r.w.fleet.Running("worker-1", "kubelet"); v != newVersion {
					t.Errorf("worker-1 kubelet runs %s", v)
				}
				if n := r.played("worker-1", "restore"); n != 0 {
					t.Errorf("worker-1 restored %d times: a node that works is not rolled back for an annotation", n)
				}
			},
		},
		{
			name:   "a restarted kubelet never becomes Ready: the wait times out and the node is restored",
			inject: func(*Fleet) {},
			api: func(c *fake.Clientset) {
				// The Node's Ready at the new version is never stored (the
				// kubelet stand-in is told it was): it stays NotReady until
				// the old kubelet is back.
				c.PrependReactor("update", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
					ua, ok := a.(k8stesting.UpdateAction)
					if !ok || a.GetSubresource() != "status" {
						return false, nil, nil
					}
					n, ok := ua.GetObject().(*corev1.Node)
					if ok && n.Name == "worker-1" && n.Status.NodeInfo.KubeletVersion == newVersion && nodeReady(n) {
						return true, n, nil
					}
					return false, nil, nil
				})
			},
			wantErr:    []string{"node worker-1 not Ready at " + newVersion + " within 5s", "rolled back to " + oldVersion},
			failedNode: "worker-1", status: record.NodeRolledBack,
			check: func(t *testing.T, r *faultRun) {
				if n := r.played("worker-1", "restore"); n != 1 {
					t.Errorf("worker-1: %d restores", n)
				}
				if v := r.w.fleet.Running("worker-1", "kubelet"); v != oldVersion {
					t.Errorf("worker-1 kubelet runs %s", v)
				}
				if n := r.played("worker-2", "swap"); n != 0 {
					t.Errorf("the run went on to worker-2 (%d swaps)", n)
				}
			},
		},
		{
			name:       "containers restarted under the new kubelet: it stays (a rollback would restart them again)",
			inject:     func(f *Fleet) { f.RestartContainers("worker-1") },
			wantErr:    []string{"node worker-1", "containers restarted", "stays at " + newVersion},
			failedNode: "worker-1", status: record.NodeFailed,
			check: func(t *testing.T, r *faultRun) {
				if n := r.played("worker-1", "restore"); n != 0 {
					t.Errorf("worker-1: %d restores: the rollback restarted the containers a second time", n)
				}
				if v := r.w.fleet.Running("worker-1", "kubelet"); v != newVersion {
					t.Errorf("worker-1 kubelet runs %s", v)
				}
				if n := r.played("worker-2", "swap"); n != 0 {
					t.Errorf("the run went on to worker-2 (%d swaps)", n)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ctx, _ := newKwokRun(t)
			tc.inject(r.w.fleet)
			if tc.api != nil {
				tc.api(r.w.client)
			}
			_, err := r.apply(ctx)
			if err == nil {
				t.Fatal("apply succeeded")
			}
			for _, part := range tc.wantErr {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("error %q lacks %q", err, part)
				}
			}
			if st := r.state(t); st != nil {
				if st.State != record.StateFailed || st.LastError == "" {
					t.Errorf("state %s, last error %q", st.State, st.LastError)
				}
				if tc.failedNode != "" {
					if e := nodeEntry(st, tc.failedNode); e.Status != tc.status || e.LastError == "" {
						t.Errorf("%s recorded %q (%q), want %s", tc.failedNode, e.Status, e.LastError, tc.status)
					}
				}
			}
			r.noCordonOfOurs(t)
			tc.check(t, r)
		})
	}
}

// refuse is a fake API server's answer to a request the test refuses.
// drainable makes the world's pods drainable: owned by ReplicaSets, and
// deleted on their eviction, as the real API server does when no budget
// refuses.
func (r *faultRun) drainable(ctx context.Context, t *testing.T) {
	t.Helper()
	r.w.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := a.(k8stesting.CreateAction)
		if !ok || a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev, ok := ca.GetObject().(*policyv1.Eviction)
		if !ok {
			return false, nil, nil
		}
		return true, nil, r.w.client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), ev.Namespace, ev.Name)
	})
	for _, name := range []string{"web", "db"} {
		p, err := r.w.client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		yes := true
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name, UID: "rs-" + p.UID, Controller: &yes}}
		if _, err := r.w.client.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// leaders plays the controller manager's and scheduler's leader election
// on node: each one's Lease is renewed every 100 ms while its unit runs
// there, and not while it does not.
func (r *faultRun) leaders(ctx context.Context, t *testing.T, node string) {
	t.Helper()
	leases := r.w.client.CoordinationV1().Leases("kube-system")
	done, stop := make(chan struct{}), make(chan struct{})
	// Stopped and waited for when the test ends, whatever ctx is then.
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for _, comp := range []string{"kube-controller-manager", "kube-scheduler"} {
				if r.w.fleet.Running(node, comp) == "" {
					continue
				}
				holder, now, secs := node+"_"+comp, metav1.NewMicroTime(time.Now()), int32(15)
				l, err := leases.Get(ctx, comp, metav1.GetOptions{})
				if err != nil {
					_, _ = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: comp, Namespace: "kube-system"},
						Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &now, LeaseDurationSeconds: &secs}}, metav1.CreateOptions{})
					continue
				}
				l.Spec.HolderIdentity, l.Spec.RenewTime = &holder, &now
				_, _ = leases.Update(ctx, l, metav1.UpdateOptions{})
			}
			select {
			case <-ctx.Done():
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
}

func refuse(k8stesting.Action) (bool, runtime.Object, error) {
	return true, nil, errors.New("refused by the test")
}

// A cancel (or any failure) after a node was cordoned and drained, while
// its kubelet settles, leaves no cordon of the run behind; a node the
// operator cordoned stays cordoned.
func TestApplyCancelledWhileSettlingUncordons(t *testing.T) {
	r, ctx, cancel := newKwokRun(t)
	r.opts.Drain, r.opts.Settle = true, time.Minute
	r.drainable(ctx, t)
	// worker-2 cordoned by its operator, before the run.
	n, err := r.w.client.CoreV1().Nodes().Get(ctx, "worker-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Unschedulable = true
	if _, err := r.w.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Cancel once cp-1's kubelet swap was played: the run is in its
	// settle pause, its node cordoned.
	go func() {
		for ctx.Err() == nil && r.played("cp-1", "swap") < 4 {
			time.Sleep(20 * time.Millisecond)
		}
		for ctx.Err() == nil {
			n, err := r.w.client.CoreV1().Nodes().Get(ctx, "cp-1", metav1.GetOptions{})
			if err == nil && n.Spec.Unschedulable && n.Annotations[drain.AnnotationCordoned] == "true" {
				time.Sleep(200 * time.Millisecond) // into the settle pause
				cancel()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	_, err = r.apply(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("apply: %v", err)
	}
	r.noCordonOfOurs(t)
	for name, want := range map[string]bool{"cp-1": false, "worker-2": true} {
		n, err := r.w.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Spec.Unschedulable != want {
			t.Errorf("%s unschedulable %v, want %v", name, n.Spec.Unschedulable, want)
		}
	}
}

// Losing the upgrade lock to another holder stops the run, saying so;
// the run writes no record after that (the record is the new holder's).
func TestApplyStopsOnLostLock(t *testing.T) {
	r, ctx, _ := newKwokRun(t)
	r.opts.Settle = 30 * time.Second
	go func() {
		for ctx.Err() == nil && r.played("cp-1", "swap") < 4 {
			time.Sleep(20 * time.Millisecond)
		}
		leases := r.w.client.CoordinationV1().Leases("kube-system")
		l, err := leases.Get(ctx, upgradelock.Name, metav1.GetOptions{})
		if err != nil {
			return
		}
		other, now := "someone-else", metav1.NewMicroTime(time.Now())
		l.Spec = coordinationv1.LeaseSpec{HolderIdentity: &other, LeaseDurationSeconds: l.Spec.LeaseDurationSeconds, RenewTime: &now, AcquireTime: &now}
		_, _ = leases.Update(ctx, l, metav1.UpdateOptions{})
	}()
	_, err := r.apply(ctx)
	if err == nil || !strings.Contains(err.Error(), "lost the upgrade lock") {
		t.Fatalf("apply: %v", err)
	}
	if st := r.state(t); st == nil || st.State == record.StateFailed || st.State == record.StateComplete || st.LastError != "" {
		t.Errorf("the record was written after the lock was lost: %+v", st)
	}
}

// A rollback that cannot read what a node runs stops, naming the node:
// it never reports a node it could not read as rolled back. (The apply
// before it failed at the API server's swap and restored it: no API
// server moved, so a rollback is allowed.)
func TestRollbackStopsOnUnreadableNode(t *testing.T) {
	r, ctx, _ := newKwokRun(t)
	r.w.fleet.Fail("cp-1", "swap", 1, 1)
	if _, err := r.apply(ctx); !errors.Is(err, inplace.ErrNodeFailed) {
		t.Fatalf("apply: %v", err)
	}
	r.w.fleet.Fail("worker-2", "running version", 255, -1)
	res, err := inplace.Rollback(ctx, r.opts)
	if err == nil || !strings.Contains(err.Error(), "node worker-2: cannot tell whether kubelet moved") {
		t.Fatalf("rollback: %v", err)
	}
	st := r.state(t)
	if e := nodeEntry(st, "worker-2"); e.Status == record.NodeRolledBack {
		t.Errorf("worker-2, unread, recorded %s", e.Status)
	}
	if st.State != record.StateFailed || !strings.Contains(st.LastError, "worker-2") {
		t.Errorf("state %s (%s)", st.State, st.LastError)
	}
	if res == nil || res.State == nil || res.State.State == record.StateRolledBack {
		t.Errorf("rollback reported %+v", res)
	}
}

// A part the run moved that no longer runs is rolled back by what its
// unit would start, not skipped as "never moved": here cp-1's new API
// server exits at once (a flag its release removed), and apply's own
// restore of it failed (as when a run is killed right after the swap).
// The rollback says rolled back only once the old version runs again.
func TestRollbackRestoresAPartThatDoesNotRun(t *testing.T) {
	r, ctx, _ := newKwokRun(t)
	r.opts.ReadyTimeout = time.Second
	r.w.fleet.CrashAt("cp-1", "kube-apiserver", newVersion)
	r.w.fleet.Fail("cp-1", "restore", 1, 1)
	if _, err := r.apply(ctx); err == nil || !strings.Contains(err.Error(), "rollback of kube-apiserver failed too") {
		t.Fatalf("apply: %v", err)
	}
	if v := r.w.fleet.Running("cp-1", "kube-apiserver"); v != "" {
		t.Fatalf("cp-1 kube-apiserver runs %q after the failed apply, want nothing", v)
	}
	// worker-1 as a run killed after its drain leaves it; worker-2
	// cordoned by hand.
	for node, patch := range map[string]string{
		"worker-1": `{"spec":{"unschedulable":true},"metadata":{"annotations":{"` + drain.AnnotationCordoned + `":"true"}}}`,
		"worker-2": `{"spec":{"unschedulable":true}}`,
	} {
		if _, err := r.w.client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := inplace.Rollback(ctx, r.opts)
	if err != nil {
		t.Fatalf("rollback: %v", err)
	}
	if v := r.w.fleet.Running("cp-1", "kube-apiserver"); v != oldVersion {
		t.Errorf("cp-1 kube-apiserver runs %q after the rollback, want %s", v, oldVersion)
	}
	if n := r.played("cp-1", "program version"); n == 0 {
		t.Error("the stopped API server's program was never read")
	}
	r.noCordonOfOurs(t)
	for node, want := range map[string]bool{"worker-1": false, "worker-2": true} {
		if n, err := r.w.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil || n.Spec.Unschedulable != want {
			t.Errorf("%s after the rollback: unschedulable %v (%v), want %v", node, n.Spec.Unschedulable, err, want)
		}
	}
	if res.State == nil || res.State.State != record.StateRolledBack {
		t.Errorf("rollback reported %+v", res.State)
	}
}

// A dry run walks every step and changes nothing: only scripts that read
// are played, no state or annotation is written, and the result lists
// each change with its node script.
func TestApplyDryRunChangesNothing(t *testing.T) {
	r := newFaultRun(t)
	ctx := context.Background()
	r.opts.DryRun = true
	res, err := r.apply(ctx)
	if err != nil {
		t.Fatalf("dry run: %v", err)
	}
	for name, n := range r.w.fleet.Stats().Commands {
		switch name {
		case "facts", "running version", "crictl ps":
		default:
			if n > 0 {
				t.Errorf("a dry run played %d %q", n, name)
			}
		}
	}
	if st := r.state(t); st != nil {
		t.Errorf("a dry run recorded a state: %+v", st)
	}
	nodes, err := r.w.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if len(n.Annotations) > 0 {
			t.Errorf("%s annotated: %v", n.Name, n.Annotations)
		}
	}
	want := map[string]bool{}
	for _, a := range res.DryRun {
		script, _, _ := strings.Cut(a.Command, " ")
		want[a.Step+" "+a.Node+" "+script] = true
	}
	for _, k := range []string{"stage worker-1 kubelift-stage-file", "back up etcd cp-1 kubelift-etcd-snapshot", "control plane cp-1 kubelift-backup",
		"control plane cp-1 kubelift-swap", "kubelets cp-1 kubelift-write-file", "kubelets worker-2 kubelift-swap"} {
		if !want[k] {
			t.Errorf("the dry run does not list %q: %+v", k, res.DryRun)
		}
	}
	if len(res.Patched) != 2 {
		t.Errorf("tolerations it would add: %v", res.Patched)
	}
}

// nodeReady: the Node's Ready condition is True.
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// A kube-proxy that does not come up at the target (crashing on a flag
// its release removed) is put back at the old version; the node's
// kubelet stays at the target (within the skew) and the run stops with
// the node failed. Once kube-proxy is fixed, apply again moves it and
// leaves the kubelet alone.
func TestApplyRollsBackKubeProxy(t *testing.T) {
	r, ctx, _ := newKwokRun(t)
	r.opts.ReadyTimeout = time.Second
	r.w.fleet.CrashAt("worker-1", "kube-proxy", newVersion)
	_, err := r.apply(ctx)
	if !errors.Is(err, inplace.ErrNodeFailed) || !strings.Contains(err.Error(), "kube-proxy") {
		t.Fatalf("apply: %v", err)
	}
	if v := r.w.fleet.Running("worker-1", "kube-proxy"); v != oldVersion {
		t.Errorf("worker-1 kube-proxy runs %q, want %s (put back)", v, oldVersion)
	}
	if sum, _ := r.w.fleet.File("worker-1", "/usr/local/bin/kube-proxy"); sum != OldBinarySHA("kube-proxy", oldVersion) {
		t.Errorf("worker-1 kube-proxy binary %s, want the old one", sum)
	}
	if v := r.w.fleet.Running("worker-1", "kubelet"); v != newVersion {
		t.Errorf("worker-1 kubelet runs %q, want %s (it stays)", v, newVersion)
	}
	if v := r.w.fleet.Running("cp-1", "kube-proxy"); v != newVersion {
		t.Errorf("cp-1 kube-proxy runs %q, want %s (moved before worker-1)", v, newVersion)
	}
	restarts := func(unit string) int {
		n := 0
		for _, x := range r.w.fleet.Stats().Nodes["worker-1"].Restarts {
			if x.Unit == unit {
				n++
			}
		}
		return n
	}
	kubelets, proxies := restarts("kubelet"), restarts("kube-proxy")
	r.w.fleet.CrashAt("worker-1", "kube-proxy", "") // fixed
	res, err := r.apply(ctx)
	if err != nil {
		t.Fatalf("apply again: %v", err)
	}
	if res.State == nil || res.State.State != record.StateComplete {
		t.Errorf("state %+v", res.State)
	}
	if v := r.w.fleet.Running("worker-1", "kube-proxy"); v != newVersion {
		t.Errorf("worker-1 kube-proxy runs %q after apply again", v)
	}
	if k, p := restarts("kubelet")-kubelets, restarts("kube-proxy")-proxies; k != 0 || p != 1 {
		t.Errorf("apply again restarted the kubelet %d times and kube-proxy %d times on worker-1, want 0 and 1", k, p)
	}
}

// throughOwnAPIServer is a client over the same cluster as c, through an
// API server of its own that down takes away (every request refused as
// by a server that is gone), as an admin whose kubeconfig names one API
// server of several sees it.
func throughOwnAPIServer(c *fake.Clientset) (*fake.Clientset, *atomic.Bool) {
	own := fake.NewClientset()
	own.Resources = c.Resources
	own.ReactionChain, own.WatchReactionChain = nil, nil
	own.AddReactor("*", "*", k8stesting.ObjectReaction(c.Tracker()))
	own.AddWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := c.Tracker().Watch(a.GetResource(), a.GetNamespace())
		return err == nil, w, err
	})
	down := &atomic.Bool{}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	own.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return down.Load(), nil, refused
	})
	own.PrependWatchReactor("*", func(k8stesting.Action) (bool, watch.Interface, error) {
		return down.Load(), nil, refused
	})
	return own, down
}

// The lock fences (docs/runbook.md, "The lock"): run A's API server
// stops answering while A swaps cp-1's API server over SSH; run B,
// through another API server, watches A's lease go unrenewed for its
// duration, takes it over and completes the upgrade. A finishes the node
// step it was in, then stops before its next one, saying it lost the
// lock, and leaves the record as B wrote it.
func TestLockFencesARunThatCannotRenew(t *testing.T) {
	r, ctx, _ := newKwokRun(t)
	clientA, down := throughOwnAPIServer(r.w.client)
	a := r.opts
	a.Holder, a.Plan.Client = "admin-a_0001", clientA
	reached, release := r.w.fleet.Block("cp-1", "swap")
	defer release()
	aDone := make(chan error, 1)
	go func() {
		_, err := inplace.Apply(ctx, a)
		aDone <- err
	}()
	select {
	case <-reached:
	case err := <-aDone:
		t.Fatalf("run A ended before its first swap: %v", err)
	}
	down.Store(true)

	b := r.opts
	b.Holder = "admin-b_0002"
	if _, err := inplace.Apply(ctx, b); err != nil {
		t.Fatalf("run B: %v", err)
	}
	before := map[string]int{}
	for _, s := range specs {
		before[s.Name] = len(r.w.fleet.Stats().Nodes[s.Name].Commands)
	}
	// A's API server answers again, and its swap goes on.
	down.Store(false)
	release()
	var errA error
	select {
	case errA = <-aDone:
	case <-time.After(time.Minute):
		t.Fatal("run A still running a minute after its swap was released")
	}
	if !errors.Is(errA, upgradelock.ErrLost) || !strings.Contains(errA.Error(), "lost the upgrade lock") {
		t.Fatalf("run A: %v", errA)
	}
	// A played its swap and what waits for it, and no step after it.
	for _, s := range specs {
		cmds := r.w.fleet.Stats().Nodes[s.Name].Commands[before[s.Name]:]
		swaps := 0
		for _, c := range cmds {
			switch c.Handler {
			case "swap":
				swaps++
			case "running version":
			default:
				t.Errorf("%s: run A played %q after run B took its lock", s.Name, c.Handler)
			}
		}
		if want := map[bool]int{true: 1, false: 0}[s.Name == "cp-1"]; swaps != want {
			t.Errorf("%s: run A played %d swaps after run B took its lock, want %d (the one it was in)", s.Name, swaps, want)
		}
	}
	st := r.state(t)
	if st.Holder != b.Holder || st.State != record.StateComplete || st.LastError != "" {
		t.Errorf("the record after both runs: holder %s, state %s, error %q; want B's, complete", st.Holder, st.State, st.LastError)
	}
	for _, s := range specs {
		if e := nodeEntry(st, s.Name); e.Status != record.NodeDone {
			t.Errorf("%s recorded %s", s.Name, e.Status)
		}
	}
}

// A panic in a node's step (here its post-hook, after the kubelet was
// swapped) fails that node like any error: it is rolled back, recorded
// with the panic, its cordon undone, and the lock released; the process
// lives on to say so.
func TestApplyRecoversAPanicInANodeStep(t *testing.T) {
	r, ctx, _ := newKwokRun(t)
	r.opts.Drain = true
	r.drainable(ctx, t)
	r.opts.Hook = func(_ context.Context, phase, node, _, _ string) error {
		if phase == "post" && node == "worker-1" {
			var m map[string]int
			m["boom"]++ // a nil map: the kind of bug a panic is
		}
		return nil
	}
	_, err := r.apply(ctx)
	if !errors.Is(err, inplace.ErrPanic) || !strings.Contains(err.Error(), "node worker-1") || !errors.Is(err, inplace.ErrNodeFailed) {
		t.Fatalf("apply: %v", err)
	}
	if v := r.w.fleet.Running("worker-1", "kubelet"); v != oldVersion {
		t.Errorf("worker-1's kubelet runs %s after the panic, want %s (rolled back)", v, oldVersion)
	}
	if e := nodeEntry(r.state(t), "worker-1"); e.Status != record.NodeRolledBack || !strings.Contains(e.LastError, "panic") {
		t.Errorf("worker-1 recorded %s (%s)", e.Status, e.LastError)
	}
	r.noCordonOfOurs(t)
	l, err := r.w.client.CoordinationV1().Leases("kube-system").Get(ctx, upgradelock.Name, metav1.GetOptions{})
	if err != nil || (l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "") {
		t.Errorf("the lock after the run: %v %+v", err, l.Spec)
	}
}

// A node cordoned by hand between kubelift's read of it and its cordon
// patch stays the operator's: the patch is conditional on the Node as
// read, the conflict is read again, and the node is neither marked as
// kubelift's nor uncordoned at the end. (The fake API server keeps no
// resourceVersions: the reactor plays the real one's answer to a patch
// carrying a stale one.)
func TestCordonByHandMeanwhileStaysTheOperators(t *testing.T) {
	r, ctx, _ := newKwokRun(t)
	r.opts.Drain = true
	r.drainable(ctx, t)
	var raced atomic.Bool
	r.w.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa, ok := a.(k8stesting.PatchAction)
		if !ok || pa.GetName() != "worker-1" || !strings.Contains(string(pa.GetPatch()), `"unschedulable":true`) || raced.Swap(true) {
			return false, nil, nil
		}
		// The operator's kubectl cordon lands first.
		n, err := r.w.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", "worker-1")
		if err != nil {
			return true, nil, err
		}
		node := n.(*corev1.Node).DeepCopy()
		node.Spec.Unschedulable = true
		if err := r.w.client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), node, ""); err != nil {
			return true, nil, err
		}
		if strings.Contains(string(pa.GetPatch()), `"resourceVersion"`) {
			return true, nil, apierrors.NewConflict(corev1.Resource("nodes"), "worker-1", errors.New("the object has been modified"))
		}
		return false, nil, nil // an unconditional patch goes through, over the operator's cordon
	})
	if _, err := r.apply(ctx); err != nil {
		t.Fatalf("apply: %v", err)
	}
	if !raced.Load() {
		t.Fatal("worker-1 was never cordoned by the run")
	}
	n, err := r.w.client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !n.Spec.Unschedulable || n.Annotations[drain.AnnotationCordoned] != "" {
		t.Errorf("worker-1 after the run: unschedulable %v, annotations %v; want the operator's cordon, unmarked", n.Spec.Unschedulable, n.Annotations)
	}
}

// A rollback ends only on a control plane whose every part runs the old
// version, the same process a health window later: restoring cp-1's API
// server stops the controller manager and the scheduler there (leaders
// that lost their leases, in units with no Restart=). The rollback starts
// them again and waits, instead of saying "rolled back" over parts that
// do not run.
func TestRollbackEndsWithEveryPartRunning(t *testing.T) {
	r, ctx, _ := newKwokRun(t)
	r.opts.ReadyTimeout = time.Second
	r.w.fleet.CrashAt("cp-1", "kube-apiserver", newVersion)
	r.w.fleet.Fail("cp-1", "restore", 1, 1)
	if _, err := r.apply(ctx); err == nil {
		t.Fatal("apply passed with an API server that cannot start")
	}
	r.opts.ReadyTimeout = 5 * time.Second
	for _, unit := range []string{"kube-controller-manager", "kube-scheduler"} {
		r.w.fleet.StopWhenRestarted("cp-1", unit, "kube-apiserver")
	}
	r.leaders(ctx, t, "cp-1")
	res, err := inplace.Rollback(ctx, r.opts)
	if err != nil {
		t.Fatalf("rollback: %v", err)
	}
	for _, unit := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if v := r.w.fleet.Running("cp-1", unit); v != oldVersion {
			t.Errorf("cp-1 %s runs %q after the rollback said %s, want %s", unit, v, res.State.State, oldVersion)
		}
	}
	if n := r.played("cp-1", "start"); n != 2 {
		t.Errorf("%d units started on cp-1, want 2 (the controller manager and the scheduler)", n)
	}
}

// A run that stops after the last node's kubelet was swapped (here
// cancelled in its settle: a run that dies there leaves the same, less
// the uncordon) leaves the node's in-flight record on the Node; the next
// apply does not take the cluster for done: it finishes that node's
// steps (Ready, verify against the containers recorded before the swap,
// uncordon, mark done) and completes the record.
func TestResumeFinishesANodeLeftAfterItsSwap(t *testing.T) {
	r, ctx, cancel := newKwokRun(t)
	r.opts.Drain, r.opts.Settle = true, 3*time.Second
	r.drainable(ctx, t)
	go func() {
		// Cancelled once worker-2 is Ready at the target: in its settle.
		for ctx.Err() == nil {
			n, err := r.w.client.CoreV1().Nodes().Get(ctx, "worker-2", metav1.GetOptions{})
			if err == nil && n.Status.NodeInfo.KubeletVersion == newVersion && nodeReady(n) {
				time.Sleep(100 * time.Millisecond)
				cancel()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	if _, err := r.apply(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("first apply: %v", err)
	}
	n, err := r.w.client.CoreV1().Nodes().Get(context.Background(), "worker-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Annotations[record.AnnotationInFlight]; !ok || r.w.fleet.Running("worker-2", "kubelet") != newVersion {
		t.Fatalf("after the stop, worker-2 runs kubelet %s, annotations %v: not the state this test is about", r.w.fleet.Running("worker-2", "kubelet"), n.Annotations)
	}
	verifies := r.played("worker-2", "crictl ps")
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	kwok(ctx2, t, r.w.client)
	r.opts.Settle = time.Millisecond
	res, err := r.apply(ctx2)
	if err != nil || res.NothingToDo {
		t.Fatalf("the apply after: %v (nothing to do: %v)", err, res != nil && res.NothingToDo)
	}
	if r.played("worker-2", "crictl ps") == verifies {
		t.Error("worker-2's containers were not read again: not verified")
	}
	n, err = r.w.client.CoreV1().Nodes().Get(context.Background(), "worker-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Annotations[record.AnnotationInFlight]; ok || n.Annotations[inplace.AnnotationUpgradedTo] != newVersion || n.Spec.Unschedulable {
		t.Errorf("worker-2 after the resume: unschedulable %v, annotations %v", n.Spec.Unschedulable, n.Annotations)
	}
	st := r.state(t)
	if st.State != record.StateComplete || nodeEntry(st, "worker-2").Status != record.NodeDone {
		t.Errorf("record after the resume: %s, worker-2 %s", st.State, nodeEntry(st, "worker-2").Status)
	}
	if r.played("worker-2", "swap") != 1 {
		t.Errorf("worker-2's kubelet swapped %d times", r.played("worker-2", "swap"))
	}
}

// Interrupted (Ctrl-C, or a lost lock) while a kubelet's Ready wait runs,
// the run still rolls the node back, and waits for it Ready at the old
// version from live reads of the Node: the run's Node informer stopped
// with it, and its frozen cache used to make the undo wait its whole
// --ready-timeout and report a node that was Ready as not.
func TestInterruptedReadyWaitRollsBackOnLiveState(t *testing.T) {
	r := newFaultRun(t)
	kctx, kcancel := context.WithCancel(context.Background())
	defer kcancel()
	// worker-1's new kubelet never comes up; its old one does.
	kwokHolding(kctx, t, r.w.client, func(node, version string) bool { return node == "worker-1" && version == newVersion })
	r.opts.ReadyTimeout = 20 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			n, err := r.w.client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
			if err == nil && n.Status.NodeInfo.KubeletVersion == newVersion && !nodeReady(n) {
				time.Sleep(300 * time.Millisecond) // in the Ready wait
				cancel()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	_, err := r.apply(ctx)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "rolled back to "+oldVersion) || strings.Contains(err.Error(), "after rollback") {
		t.Fatalf("apply interrupted in worker-1's Ready wait: %v", err)
	}
	if v := r.w.fleet.Running("worker-1", "kubelet"); v != oldVersion {
		t.Errorf("worker-1's kubelet runs %s", v)
	}
}

// The workload gate: a Deployment with a pod on worker-1, fully available
// before worker-1's swap, that is not again within the health window
// after it (its pods failing their readiness probes under the new
// kubelet, say, with every container kept) stops the run at worker-1,
// rolled back, naming it (and not a Deployment with no pod there);
// worker-2 is not touched. The plan lists what the gate watches; with
// --no-workload-gate the same run completes.
func TestWorkloadGateStopsTheRun(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("gate off %v", off), func(t *testing.T) {
			r, ctx, _ := newKwokRun(t)
			r.opts.Plan.NoWorkloadGate = off
			// Deployment default/web, whose pod runs on worker-1 (through its
			// ReplicaSet), and default/other, with no pod on any node here.
			two, yes := int32(2), true
			for _, name := range []string{"web", "other"} {
				dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("dep-" + name)}, Spec: appsv1.DeploymentSpec{Replicas: &two},
					Status: appsv1.DeploymentStatus{Replicas: 2, ReadyReplicas: 2, AvailableReplicas: 2, UpdatedReplicas: 2}}
				if _, err := r.w.client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-5d8f", UID: "rs-web",
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "dep-web", Controller: &yes}}}}
			if _, err := r.w.client.AppsV1().ReplicaSets("default").Create(ctx, rs, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			web, err := r.w.client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			web.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d8f", UID: "rs-web", Controller: &yes}}
			if _, err := r.w.client.CoreV1().Pods("default").Update(ctx, web, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			p, err := inplace.BuildPlan(ctx, r.opts.Plan)
			if err != nil && !errors.Is(err, preflight.ErrBlocked) {
				t.Fatal(err)
			}
			if want := !off; slices.Contains(p.WorkloadGate, "deployment/default/web") != want {
				t.Errorf("the plan's workload gate: %v", p.WorkloadGate)
			}
			// While worker-1's kubelet is swapped, a replica goes
			// unavailable (and the run's informer sees it before the swap
			// ends).
			reached, release := r.w.fleet.Block("worker-1", "swap")
			defer release()
			go func() {
				select {
				case <-reached:
				case <-ctx.Done():
					return
				}
				defer release()
				// Both lose a replica; only web has a pod on worker-1.
				for _, name := range []string{"web", "other"} {
					d, err := r.w.client.AppsV1().Deployments("default").Get(ctx, name, metav1.GetOptions{})
					if err != nil {
						return
					}
					d.Status.AvailableReplicas, d.Status.UnavailableReplicas = 1, 1
					_, _ = r.w.client.AppsV1().Deployments("default").UpdateStatus(ctx, d, metav1.UpdateOptions{})
				}
				time.Sleep(300 * time.Millisecond)
			}()
			_, err = r.apply(ctx)
			if off {
				if err != nil {
					t.Fatalf("apply --no-workload-gate: %v", err)
				}
				return
			}
			if !errors.Is(err, inplace.ErrWorkloadsUnavailable) || !strings.Contains(err.Error(), "deployment/default/web (1 of 2 replicas available)") || !strings.Contains(err.Error(), "node worker-1") ||
				strings.Contains(err.Error(), "deployment/default/other") {
				t.Fatalf("apply: %v", err)
			}
			for node, want := range map[string]string{"worker-1": oldVersion, "worker-2": oldVersion} {
				if v := r.w.fleet.Running(node, "kubelet"); v != want {
					t.Errorf("%s's kubelet runs %s, want %s", node, v, want)
				}
			}
			if n := r.played("worker-2", "swap"); n != 0 {
				t.Errorf("worker-2 swapped %d times after the gate stopped the run", n)
			}
			if e := nodeEntry(r.state(t), "worker-1"); e.Status != record.NodeRolledBack {
				t.Errorf("worker-1 recorded %s", e.Status)
			}
		})
	}
}
