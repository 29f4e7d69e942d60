package driver_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/driver/binary"
	"github.com/kubelift/kubelift/internal/inplace/driver/drivertest"
	"github.com/kubelift/kubelift/internal/inplace/driver/kubeadm"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/release"
	kadm "github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
	"github.com/kubelift/kubelift/internal/waiter"
)

const (
	from = "v1.31.3"
	to   = "v1.31.4"
)

// The named steps of a control-plane node's move, in order, at which the
// fault table makes it fail: the node cannot be reached; what runs cannot
// be read; the lock is lost just before the move; the move itself fails
// (a swap, a kubeadm run); the moved control plane is never healthy; the
// put-back after a failed move fails too.
var steps = []string{"reach", "read", "fence", "move", "health", "put back"}

// outcome is the end state a step's failure must leave.
type outcome struct {
	// rolledBack: the error wraps ErrNodeFailed (the node is back at the
	// old version and says so).
	rolledBack bool
	// moved: the step got as far as a move (the run settles the node
	// after its step); at is the version the control plane runs after.
	moved bool
	at    string
	// says is in the error.
	says string
}

// world is one kind's control-plane node, cp-1, at from, with a failure
// injected at a named step.
type world interface {
	driver() driver.ControlPlane
	// run is the driver's Run for the world's node and the step's fault:
	// the node at from for an upgrade, at to (moved) for an undo.
	run(t *testing.T, fault string, undo bool) *driver.Run
	// at is the version every part of cp-1's control plane runs ("" when
	// they differ or one does not run).
	at(t *testing.T) string
	// want is the end state after a failure at step of an upgrade;
	// wantUndo of an undo.
	want(step string) outcome
	wantUndo(step string) outcome
}

// Both drivers pass the same table: a failure injected at each named
// step of a control-plane node's move leaves the node in the end state
// the driver promises, the error naming the node, its status what the
// error says, and the run told to settle the node exactly when something
// moved.
func TestFaultTable(t *testing.T) {
	for _, w := range []func() world{newBinaryWorld, newKubeadmWorld} {
		for _, step := range steps {
			w := w()
			t.Run(w.driver().Kind()+"/"+step, func(t *testing.T) {
				r := w.run(t, step, false)
				err := w.driver().Upgrade(context.Background(), r, "cp-1", r.Target)
				check(t, w, r, step, err, w.want(step))
			})
		}
	}
}

// Both drivers pass the same table backward: an undo (rollback) of a
// moved control plane that fails at a named step (the fence is the
// run's, before it reaches the node; an undo does not move anything to
// fail) leaves the node as that step left it, the error naming the
// node, and the run told to settle the node exactly when something was
// restored.
func TestUndoFaultTable(t *testing.T) {
	for _, w := range []func() world{newBinaryWorld, newKubeadmWorld} {
		for _, step := range []string{"reach", "read", "put back", "health"} {
			w := w()
			t.Run(w.driver().Kind()+"/"+step, func(t *testing.T) {
				r := w.run(t, step, true)
				err := w.driver().Undo(context.Background(), r, "cp-1")
				check(t, w, r, step, err, w.wantUndo(step))
			})
		}
	}
}

// check holds a failed step's end state to what the driver promises.
func check(t *testing.T, w world, r *driver.Run, step string, err error, want outcome) {
	t.Helper()
	fx := r.Fx.(*drivertest.Effects)
	if err == nil {
		t.Fatalf("a failure at %s was not reported", step)
	}
	if !strings.Contains(err.Error(), "cp-1") || !strings.Contains(err.Error(), want.says) {
		t.Errorf("err = %v, want one naming cp-1 and saying %q", err, want.says)
	}
	if got := errors.Is(err, driver.ErrNodeFailed); got != want.rolledBack {
		t.Errorf("err = %v: rolled back %v, want %v", err, got, want.rolledBack)
	}
	if last := fx.Last("cp-1"); last != "" && !strings.HasPrefix(last, driver.FailedStatus(err)+" ") {
		t.Errorf("cp-1's last status %q, want %s for %v", last, driver.FailedStatus(err), err)
	}
	if moved := len(fx.Moved) > 0; moved != want.moved {
		t.Errorf("marked moved %q, want moved %v", fx.Moved, want.moved)
	}
	if at := w.at(t); at != want.at {
		t.Errorf("the control plane runs %q after a failure at %s, want %q", at, step, want.at)
	}
}

// common are the Run's fields both worlds share.
func common(t *testing.T, fx *drivertest.Effects, clk waiter.Waiter) *driver.Run {
	v, err := catalog.ParseVersion(to)
	if err != nil {
		t.Fatal(err)
	}
	target := &release.Release{Version: v, Manifest: &bundle.Manifest{KubernetesVersion: to}}
	for _, f := range append([]string{"kubeadm"}, release.ControlPlaneFiles...) {
		target.Manifest.Files = append(target.Manifest.Files, bundle.File{Name: f, Arch: "amd64", SHA256: strings.Repeat("a", 64)})
	}
	nodes := []preflight.NodeState{{Name: "cp-1", Role: release.RoleControlPlane, Arch: "amd64", Kubelet: from, Components: map[string]string{}}}
	for _, c := range release.ControlPlaneFiles {
		nodes[0].Components[c] = from
	}
	fx.Wait, fx.StageDir, fx.BackupDir = clk, release.DefaultStageDir, release.DefaultBackupDir
	fx.Facts = map[string]*nodefacts.Facts{"cp-1": {Components: map[string]string{"kubelet": from}}}
	return &driver.Run{Log: slog.New(slog.DiscardHandler), Wait: clk, Target: target, Fx: fx,
		Plan:  &preflight.Plan{From: []string{from}, Nodes: nodes},
		Facts: fx.Facts, Addresses: map[string]nodeaccess.Address{"cp-1": {Name: "cp-1", Role: release.RoleControlPlane}},
		StageDir: release.DefaultStageDir, BackupDir: release.DefaultBackupDir, Now: time.Now, Started: 1764000000,
		ReadyTimeout: time.Minute, HealthWindow: 5 * time.Second}
}

// lockLost fails Fence from its second call on: OnNode's own fence
// passes, the one just before the move does not.
func lockLost(fx *drivertest.Effects) {
	fx.FenceFrom, fx.FenceErr = 2, errors.New("the upgrade lock was lost")
}

// binaryWorld is a binary control-plane node: each part a unit whose
// program the fake node swaps, restores, and runs.
type binaryWorld struct {
	mu                 sync.Mutex
	running, installed map[string]string
	node               *fakenode.Node
	fault              string
	// broken is the version whose process never comes up, at fault
	// "health": the one the step moves to.
	broken string
}

func newBinaryWorld() world {
	return &binaryWorld{running: map[string]string{}, installed: map[string]string{}}
}

func (*binaryWorld) driver() driver.ControlPlane { return binary.Driver{} }

func (w *binaryWorld) run(t *testing.T, fault string, undo bool) *driver.Run {
	w.fault, w.broken = fault, to
	at := from
	if undo {
		at, w.broken = to, from
	}
	for _, c := range release.ControlPlaneFiles {
		w.running[c], w.installed[c] = at, at
	}
	fx := &drivertest.Effects{Nodes: map[string]nodeaccess.Node{}}
	r := common(t, fx, waiter.Waiter{Clock: drivertest.SteppingClock(t, time.Second)})
	w.node = &fakenode.Node{Scripts: map[string]fakenode.Handler{
		nodescript.Running.Name:   w.runningScript,
		nodescript.Installed.Name: func(args []string) (string, error) { return w.get(w.installed, path.Base(args[0])), nil },
		nodescript.Backup.Name:    func([]string) (string, error) { return "", nil },
		nodescript.Swap.Name: func(args []string) (string, error) {
			w.set(args[3], path.Base(path.Dir(args[0])))
			if fault == "move" || fault == "put back" {
				return "", errors.New("exit 1: systemctl restart failed")
			}
			return "", nil
		},
		nodescript.Restore.Name: func(args []string) (string, error) {
			if fault == "put back" {
				return "", errors.New("exit 66: no backup")
			}
			w.set(args[2], path.Base(args[0]))
			return "", nil
		},
	}}
	if fault != "reach" {
		fx.Nodes["cp-1"] = w.node
	}
	if fault == "fence" {
		lockLost(fx)
	}
	return r
}

// runningScript says what a part's unit runs: nothing for a part moved
// when the moved control plane is never healthy.
func (w *binaryWorld) runningScript(args []string) (string, error) {
	if w.fault == "read" {
		return "", errors.New("exit 69: systemctl show failed")
	}
	v := w.get(w.running, args[0])
	if v == w.broken && w.fault == "health" {
		return "", nil // crashing on the version it moved to
	}
	return "Kubernetes " + v + "\npid 4242\n", nil
}

func (w *binaryWorld) get(m map[string]string, k string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return m[k]
}

func (w *binaryWorld) set(comp, v string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.running[comp], w.installed[comp] = v, v
}

func (w *binaryWorld) at(*testing.T) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	v := w.running[release.ControlPlaneFiles[0]]
	for _, c := range release.ControlPlaneFiles {
		if w.running[c] != v {
			return ""
		}
	}
	return v
}

// A binary part that fails after its swap is put back; only one whose
// put-back fails too stays moved.
func (*binaryWorld) want(step string) outcome {
	return map[string]outcome{
		"reach":    {at: from, says: "unreachable"},
		"read":     {at: from, says: "systemctl show failed"},
		"fence":    {at: from, says: "not swapped: the upgrade lock was lost"},
		"move":     {rolledBack: true, moved: true, at: from, says: "rolled back to " + from},
		"health":   {rolledBack: true, moved: true, at: from, says: "kube-apiserver not healthy at " + to},
		"put back": {moved: true, says: "rollback of kube-apiserver failed too"},
	}[step]
}

// An undo goes newest part first: the scheduler is where it stops.
func (*binaryWorld) wantUndo(step string) outcome {
	return map[string]outcome{
		"reach":    {at: to, says: "unreachable"},
		"read":     {at: to, says: "cannot tell whether kube-scheduler moved"},
		"put back": {moved: true, at: to, says: "restore kube-scheduler: exit 66"},
		"health":   {moved: true, at: "", says: "kube-scheduler not healthy at " + from},
	}[step]
}

// kubeadmWorld is a kubeadm control-plane node: its static pods' mirror
// pods in a fake API, moved by a fake kubeadm run.
type kubeadmWorld struct {
	client *fake.Clientset
	// etcdDown is how many more reads of the pods see the node's etcd
	// member not Ready (kubeadm restarted it, or put it back).
	etcdDown int
}

func newKubeadmWorld() world { return &kubeadmWorld{} }

func (*kubeadmWorld) driver() driver.ControlPlane { return kubeadm.New(&kadm.Config{LocalEtcd: true}) }

func (w *kubeadmWorld) move(version string, ready bool) error {
	for _, c := range release.ControlPlaneFiles {
		if _, err := w.client.CoreV1().Pods("kube-system").Update(context.Background(), drivertest.MirrorPod(c, version, ready), metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

func (w *kubeadmWorld) run(t *testing.T, fault string, undo bool) *driver.Run {
	at := from
	if undo {
		at = to
	}
	objs := []runtime.Object{drivertest.MirrorPod("etcd", "3.5.15-0", true)}
	for _, c := range release.ControlPlaneFiles {
		objs = append(objs, drivertest.MirrorPod(c, at, true))
	}
	for _, c := range driver.LeaderComponents {
		holder, now := "elsewhere", metav1.NowMicro()
		objs = append(objs, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: c},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &now}})
	}
	w.client = fake.NewClientset(objs...)
	if fault == "read" {
		w.client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("etcdserver: request timed out")
		})
	}
	// etcd's member comes back a few reads after kubeadm put it back: the
	// control plane is not back before it is.
	w.client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if w.etcdDown > 0 {
			w.etcdDown--
			pod := drivertest.MirrorPod("etcd", "3.5.15-0", w.etcdDown == 0)
			if err := w.client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), pod, pod.Namespace); err != nil {
				return true, nil, err
			}
		}
		return false, nil, nil
	})
	status := "exit 0\n"
	node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
		nodescript.Exists.Name:    func([]string) (string, error) { return "no\n", nil },
		nodescript.CheckFile.Name: func([]string) (string, error) { return "", nil },
		nodescript.KubeadmStart.Name: func([]string) (string, error) {
			switch fault {
			case "move": // kubeadm puts back what it moved itself, etcd too
				status = "exit 1\n[upgrade/apply] FATAL: couldn't upgrade control plane\n"
				w.etcdDown = 5
			case "put back": // ... and what it put back never comes up
				status = "exit 1\n[upgrade/apply] FATAL: couldn't upgrade control plane\n"
				return "started\n", w.move(to, false)
			case "health": // kubeadm succeeds, the control plane is never Ready
				return "started\n", w.move(to, false)
			default:
				return "started\n", w.move(to, true)
			}
			return "started\n", nil
		},
		nodescript.KubeadmStatus.Name: func([]string) (string, error) { return status, nil },
		nodescript.KubeadmManifests.Name: func([]string) (string, error) {
			if fault == "read" {
				return "", errors.New("exit 66: cannot read")
			}
			return manifests(at), nil
		},
		nodescript.KubeadmRestoreManifest.Name: func([]string) (string, error) {
			if fault == "put back" {
				return "", errors.New("exit 74: cannot write")
			}
			return "", w.move(from, fault != "health")
		},
	}}
	fx := &drivertest.Effects{Nodes: map[string]nodeaccess.Node{}}
	if fault != "reach" {
		fx.Nodes["cp-1"] = node
	}
	if fault == "fence" {
		lockLost(fx)
	}
	r := common(t, fx, waiter.Waiter{Clock: drivertest.SteppingClock(t, 2*time.Second)})
	r.Client = w.client
	return r
}

func (w *kubeadmWorld) at(t *testing.T) string {
	pods, err := w.client.Tracker().List(corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod"), "kube-system")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, p := range pods.(*corev1.PodList).Items {
		c, v, err := preflight.StaticComponent(&p)
		if err != nil || !cluster.PodReady(&p) {
			return "" // etcd among them
		}
		if c != "" {
			got[v] = true
		}
	}
	if len(got) != 1 {
		return fmt.Sprint(got)
	}
	for v := range got {
		return v
	}
	return ""
}

// manifests is what kubeadm-manifests prints on a node whose static
// pods run version, kubeadm's backup of them at from beside.
func manifests(version string) string {
	var b strings.Builder
	for _, f := range []struct{ dir, version string }{{kadm.ManifestDir, version}, {kadm.TmpDir + "/kubeadm-backup-manifests-2026-11-25-10-00-00", from}} {
		for _, c := range release.ControlPlaneFiles {
			pod := fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\n  namespace: kube-system\nspec:\n  containers:\n  - name: %s\n    image: reg/library/%s:%s\n", c, c, c, f.version)
			fmt.Fprintf(&b, "file %s/%s.yaml\n%s\n", f.dir, c, base64.StdEncoding.EncodeToString([]byte(pod)))
		}
	}
	return b.String()
}

// An undo puts every manifest kubeadm kept back, then waits.
func (*kubeadmWorld) wantUndo(step string) outcome {
	return map[string]outcome{
		"reach":    {at: to, says: "unreachable"},
		"read":     {at: to, says: "read the static pod manifests"},
		"put back": {moved: true, at: to, says: "restore kube-scheduler's manifest"},
		"health":   {moved: true, at: "", says: "the control plane is not Ready at " + from},
	}[step]
}

// kubeadm puts back what a failed run moved, and kubelift waits for it
// there; a run kubeadm calls a success but whose control plane never
// comes up is left as it is (no guess at what to put back), failed.
func (*kubeadmWorld) want(step string) outcome {
	return map[string]outcome{
		"reach":    {at: from, says: "unreachable"},
		"read":     {at: from, says: "list its control-plane pods"},
		"fence":    {at: from, says: "kubeadm not started: the upgrade lock was lost"},
		"move":     {rolledBack: true, moved: true, at: from, says: "kubeadm put node cp-1's control plane back at " + from},
		"health":   {moved: true, at: "", says: "the control plane is not Ready at " + to},
		"put back": {moved: true, at: "", says: "the control plane is not back at " + from},
	}[step]
}
