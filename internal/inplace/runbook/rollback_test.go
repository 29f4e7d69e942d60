package runbook

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/drain"
	"github.com/kubelift/kubelift/internal/inplace/driver/drivertest"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
	"github.com/kubelift/kubelift/internal/waiter"
)

// A node's rollback ends once the old kubelet is alive: its Lease renewed
// (or made) after the put-back, not only the Node Ready at the old
// version. A new kubelet that never started posted nothing, so the
// Node's Ready is the old kubelet's last word, stale; a rollback that
// trusted it uncordoned a node whose kubelet was down, and the node
// controller marked it NotReady after (docs/runbook.md). A kubelet that
// renews nothing fails the rollback, naming the node, and the node stays
// cordoned.
func TestRollbackWaitsForALiveKubelet(t *testing.T) {
	ctx := context.Background()
	renewedAt := func(s int) *coordinationv1.Lease {
		at := metav1.NewMicroTime(time.Date(2026, 11, 25, 0, 0, s, 0, time.UTC))
		holder := "worker-1"
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Namespace: corev1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &at}}
	}
	for _, tc := range []struct {
		name  string
		lease func(get int) *coordinationv1.Lease // the Lease the n-th Get finds (nil: none)
		want  string                              // in the error besides the cause
		alive bool
		err   error // what every Get answers instead
	}{
		{name: "renewed", lease: func(get int) *coordinationv1.Lease { return renewedAt(10 * get) }, alive: true},
		{name: "made by the kubelet it starts", lease: func(get int) *coordinationv1.Lease {
			if get < 3 {
				return nil
			}
			return renewedAt(get)
		}, alive: true},
		{name: "never renewed", lease: func(int) *coordinationv1.Lease { return renewedAt(0) },
			want: "node worker-1: no kubelet renewed its Lease within 40s"},
		// A kubelet whose Lease lasts 120 s renews every 30 s: waited for
		// that long.
		{name: "a long lease, never renewed", lease: func(int) *coordinationv1.Lease {
			l := renewedAt(0)
			secs := int32(120)
			l.Spec.LeaseDurationSeconds = &secs
			return l
		}, want: "node worker-1: no kubelet renewed its Lease within 2m0s"},
		{name: "none", lease: func(int) *coordinationv1.Lease { return nil },
			want: "lease kube-node-lease/worker-1: none yet"},
		// The API server, not the kubelet, is what failed: said so.
		{name: "unreadable", lease: func(int) *coordinationv1.Lease { return nil }, err: apierrors.NewServiceUnavailable("etcd is down"),
			want: "node worker-1: its Lease could not be read within 40s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Annotations: map[string]string{drain.AnnotationCordoned: "true"}},
				Spec: corev1.NodeSpec{Unschedulable: true}}
			n.Status.NodeInfo.KubeletVersion = "v1.30.14" // the new kubelet never posted
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
			client := fake.NewClientset(n)
			var gets atomic.Int32
			client.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
				l := tc.lease(int(gets.Add(1)))
				if tc.err != nil {
					return true, nil, tc.err
				}
				if l == nil {
					return true, nil, apierrors.NewNotFound(coordinationv1.Resource("leases"), "worker-1")
				}
				return true, l, nil
			})
			node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
				nodescript.Restore.Name: func([]string) (string, error) { return "", nil },
				nodescript.Running.Name: func([]string) (string, error) { return "Kubernetes v1.30.14\npid 4242\n", nil },
				nodescript.Exists.Name:  backups(t, false, false),
			}}
			o := &nodeops.Ops{Node: node, Name: "worker-1", From: "v1.30.14", To: "v1.31.4", StageDir: "/s", BackupDir: "/b", Facts: &nodefacts.Facts{}}
			wait := waiter.Waiter{Clock: drivertest.SteppingClock(t, time.Second)}
			watch, err := cluster.WatchNodes(ctx, client, wait)
			if err != nil {
				t.Fatal(err)
			}
			defer watch.Close()
			r := &upgradeRun{res: &ApplyResult{}, client: client, log: slog.New(slog.DiscardHandler), watch: watch,
				target: &release.Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 4}}, wait: wait,
				opts: ApplyOptions{ReadyTimeout: 10 * time.Second, Plan: preflight.PlanOptions{Now: time.Now}}}
			k := &kubeletRun{o: o, name: "worker-1", to: "v1.31.4"}
			err = r.rollbackNode(ctx, k, errors.New("node worker-1 not Ready at v1.31.4"))
			if err == nil || !strings.Contains(err.Error(), "node worker-1 not Ready at v1.31.4") {
				t.Fatalf("rollback: %v, want the cause", err)
			}
			if tc.alive && !strings.Contains(err.Error(), "rolled back to v1.30.14") {
				t.Errorf("rollback: %v, want rolled back", err)
			}
			if !tc.alive && (strings.Contains(err.Error(), "rolled back to") || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("rollback: %v, want %q and no rolled back", err, tc.want)
			}
			got, err := client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Spec.Unschedulable == tc.alive {
				t.Errorf("after the rollback worker-1 is unschedulable: %v, want %v", got.Spec.Unschedulable, !tc.alive)
			}
		})
	}
}

// The cluster's rollback (upgrade rollback) of a node whose new kubelet
// never ran (killed mid-swap, its program the target's) waits for the
// old kubelet the same way: a Lease renewed after the put-back, not the
// Node's Ready, which still says the old version. A kubelet that renews
// nothing fails it, naming the node, and the node is not recorded
// rolled back.
func TestClusterRollbackWaitsForALiveKubelet(t *testing.T) {
	ctx := context.Background()
	for _, renews := range []bool{true, false} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}}
		n.Status.NodeInfo.KubeletVersion = "v1.30.14"
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		client := fake.NewClientset(n)
		var gets atomic.Int32
		client.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			s := 0
			if renews {
				s = int(gets.Add(1))
			}
			at := metav1.NewMicroTime(time.Date(2026, 11, 25, 0, 0, s, 0, time.UTC))
			return true, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Namespace: corev1.NamespaceNodeLease},
				Spec: coordinationv1.LeaseSpec{RenewTime: &at}}, nil
		})
		restored := false
		node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
			nodescript.Running.Name: func([]string) (string, error) {
				if restored {
					return "Kubernetes v1.30.14\npid 4242\n", nil
				}
				return "", nil // the new kubelet exits at once
			},
			nodescript.Installed.Name: func([]string) (string, error) { return "Kubernetes v1.31.4\n", nil },
			nodescript.Restore.Name: func([]string) (string, error) {
				restored = true
				return "", nil
			},
		}}
		wait := waiter.Waiter{Clock: drivertest.SteppingClock(t, time.Second)}
		watch, err := cluster.WatchNodes(ctx, client, wait)
		if err != nil {
			t.Fatal(err)
		}
		r := &upgradeRun{res: &ApplyResult{}, client: client, log: slog.New(slog.DiscardHandler), watch: watch, wait: wait,
			target: &release.Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 4}},
			opts:   ApplyOptions{ReadyTimeout: 10 * time.Second, Plan: preflight.PlanOptions{Connector: fakeConnector{node}, Now: time.Now}},
			plan:   &preflight.Plan{From: []string{"v1.30.14"}}, state: &record.Upgrade{},
			view: &preflight.View{Facts: map[string]*nodefacts.Facts{"worker-1": {}}},
			tgts: map[string]nodeaccess.Address{"worker-1": {Name: "worker-1", Role: release.RoleWorker}}}
		err = r.undoComponent(ctx, "worker-1", "kubelet")
		watch.Close()
		if !restored {
			t.Errorf("renews %v: the old kubelet was not put back", renews)
		}
		status := ""
		if len(r.state.Nodes) > 0 {
			status = r.state.Nodes[0].Status
		}
		if renews && (err != nil || status != record.NodeRolledBack) {
			t.Errorf("a kubelet that renews its Lease: %v, node %q", err, status)
		}
		if !renews && (err == nil || !strings.Contains(err.Error(), "node worker-1: no kubelet renewed its Lease") || status == record.NodeRolledBack) {
			t.Errorf("a kubelet that renews nothing: %v, node %q; want it named and not rolled back", err, status)
		}
	}
}
