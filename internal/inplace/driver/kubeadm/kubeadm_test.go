package kubeadm

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/driver/drivertest"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/release"
	kadm "github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
	"github.com/kubelift/kubelift/internal/waiter"
)

// A mirror pod's image tag is the component's version; a tag that does not
// parse (a forged manifest) is refused, naming pod and image; pods that
// are not kubeadm's control plane are left out.
func TestStaticComponent(t *testing.T) {
	pod := func(comp, image string, mirror bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: comp + "-cp-1", Labels: map[string]string{"component": comp}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: comp, Image: image}}}}
		if mirror {
			p.Annotations = map[string]string{kubeletcompat.MirrorAnnotation: "abc"}
		}
		return p
	}
	for _, tc := range []struct {
		name            string
		pod             *corev1.Pod
		comp, ver, fail string
	}{
		{"kubeadm's", pod("kube-apiserver", "10.78.0.1:5000/library/kube-apiserver:v1.30.14", true), "kube-apiserver", "v1.30.14", ""},
		{"a registry with a port, no tag", pod("kube-scheduler", "10.78.0.1:5000/library/kube-scheduler", true), "", "", "no tag"},
		{"a forged tag", pod("kube-controller-manager", "r/kube-controller-manager:v1.31.4$(reboot)", true), "", "", `image "r/kube-controller-manager:v1.31.4$(reboot)"`},
		{"not a mirror pod", pod("kube-apiserver", "r/kube-apiserver:v1.30.14", false), "", "", ""},
		{"etcd", pod("etcd", "r/etcd:3.5.15-0", true), "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comp, v, err := preflight.StaticComponent(tc.pod)
			if tc.fail != "" {
				if err == nil || !strings.Contains(err.Error(), tc.fail) || !strings.Contains(err.Error(), "kube-system/"+tc.pod.Name) {
					t.Fatalf("err = %v, want one naming the pod and %q", err, tc.fail)
				}
				return
			}
			if err != nil || comp != tc.comp || v != tc.ver {
				t.Fatalf("got %q %q %v, want %q %q", comp, v, err, tc.comp, tc.ver)
			}
		})
	}
}

// runKubeadm starts kubeadm detached and follows it: running, then its
// exit status; a failure is the node failed with kubeadm's reason; a run
// that vanished without a status is a failure too; a dry run only says
// the command.
func TestRunKubeadm(t *testing.T) {
	const log = "[upgrade/staticpods] Preparing for \"kube-scheduler\" upgrade\n[upgrade/staticpods] Moving new manifest\n" +
		"error execution phase control-plane: couldn't upgrade control plane. kubeadm has tried to recover everything into the earlier state. Errors faced: timed out waiting for the condition\n" +
		"To see the stack trace of this error execute with --v=5 or higher\n"
	// kubeadm before v1.36 gives its health check's Job 15 seconds.
	const health = "[preflight] Running pre-flight checks.\n[upgrade] Running cluster health checks\n[upgrade/health] FATAL: [preflight] Some fatal errors occurred:\n" +
		"\t[ERROR CreateJob]: Job \"upgrade-health-check-mldkx\" in the namespace \"kube-system\" did not complete in 15s: no condition of type Complete\n"
	// ... and the same line after kubeadm began to move static pods is
	// not a health check's (never so, but it must not start kubeadm again).
	const moved = "[upgrade/staticpods] Preparing for \"kube-apiserver\" upgrade\n" + health
	// ... nor one whose Job could not be created (RBAC, admission).
	const created = "[upgrade/health] FATAL: [preflight] Some fatal errors occurred:\n" +
		"\t[ERROR CreateJob]: could not create a Job with the prefix \"upgrade-health-check\" in the namespace \"kube-system\": jobs.batch is forbidden\n"
	for _, tc := range []struct {
		name     string
		statuses []string
		starts   int
		want     string // "" when it succeeds
	}{
		{"succeeds", []string{"running\n", "running\n", "exit 0\n"}, 1, ""},
		{"fails", []string{"running\n", "exit 1\n" + log}, 1, "kubeadm upgrade apply v1.31.4 --yes exited 1: while it moved kube-scheduler: error execution phase control-plane"},
		{"health job late once", []string{"running\n", "exit 1\n" + health, "running\n", "exit 0\n"}, 2, ""},
		{"health job late always", []string{"exit 1\n" + health}, healthJobAttempts, "exited 1: [upgrade/health] FATAL: [preflight] Some fatal errors occurred: | \t[ERROR CreateJob]: Job \"upgrade-health-check-mldkx\" in the namespace \"kube-system\" did not complete in 15s: no condition of type Complete (kubeadm started 4 times)"},
		{"failed after moving", []string{"exit 1\n" + moved}, 1, "exited 1: while it moved kube-apiserver"},
		{"health job not created", []string{"exit 1\n" + created}, 1, `could not create a Job with the prefix "upgrade-health-check"`},
		{"vanishes", []string{"lost\n"}, 1, "stopped without an exit status"},
		{"garbage", []string{"exit x$(reboot)\n"}, 1, `kubeadm status "exit x$(reboot)"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clk := drivertest.SteppingClock(t, 2*time.Second)
			polls, starts := 0, 0
			var started, checked []string
			node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
				nodescript.CheckFile.Name: func(args []string) (string, error) { checked = args; return "", nil },
				nodescript.KubeadmStart.Name: func(args []string) (string, error) {
					started = args
					starts++
					return "started\n", nil
				},
				nodescript.KubeadmStatus.Name: func([]string) (string, error) {
					s := tc.statuses[min(polls, len(tc.statuses)-1)]
					polls++
					return s, nil
				},
			}}
			v, _ := catalog.ParseVersion("v1.31.4")
			r := &driver.Run{StageDir: release.DefaultStageDir, Target: kubeadmTarget(v), Fx: &drivertest.Effects{},
				Wait: waiter.Waiter{Clock: clk}, Log: slog.New(slog.DiscardHandler), Plan: &preflight.Plan{Nodes: []preflight.NodeState{{Name: "cp-1"}}}}
			o := &nodeops.Ops{Node: node, Name: "cp-1", Facts: &nodefacts.Facts{}}
			err := runKubeadm(ctx, r, o, "upgrade-apply-v1.31.4-1", []string{"upgrade", "apply", "v1.31.4", "--yes"})
			if len(checked) != 2 || checked[0] != "/var/lib/kubelift/staged/v1.31.4/kubeadm" || checked[1] != kubeadmSum {
				t.Errorf("check-file %q: the staged kubeadm's sum is not checked before it runs", checked)
			}
			if want := []string{RunDir, "upgrade-apply-v1.31.4-1", "/var/lib/kubelift/staged/v1.31.4/kubeadm", "upgrade", "apply", "v1.31.4", "--yes"}; strings.Join(started, " ") != strings.Join(want, " ") {
				t.Errorf("kubeadm-start %q, want %q", started, want)
			}
			if starts != tc.starts {
				t.Errorf("kubeadm started %d times, want %d", starts, tc.starts)
			}
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "node cp-1") {
				t.Fatalf("err = %v, want one naming cp-1 and %q", err, tc.want)
			}
			// Only an exit status says kubeadm put back what it moved.
			if errors.Is(err, errKubeadmFailed) != strings.Contains(tc.statuses[len(tc.statuses)-1], "exit 1") || errors.Is(err, driver.ErrNodeFailed) {
				t.Errorf("err = %v: kubeadm failed %v, node rolled back %v", err, errors.Is(err, errKubeadmFailed), errors.Is(err, driver.ErrNodeFailed))
			}
		})
	}

	// A staged kubeadm whose sum is not the signed one is never run.
	spoilt := &fakenode.Node{Scripts: map[string]fakenode.Handler{
		nodescript.CheckFile.Name: func([]string) (string, error) { return "", errors.New("exit 65: sha256 differs") },
		nodescript.KubeadmStart.Name: func([]string) (string, error) {
			t.Error("a spoilt kubeadm was started")
			return "started\n", nil
		},
	}}
	v, _ := catalog.ParseVersion("v1.31.4")
	rs := &driver.Run{StageDir: release.DefaultStageDir, Target: kubeadmTarget(v), Fx: &drivertest.Effects{},
		Log: slog.New(slog.DiscardHandler), Plan: &preflight.Plan{Nodes: []preflight.NodeState{{Name: "cp-1"}}}}
	if err := runKubeadm(context.Background(), rs, &nodeops.Ops{Node: spoilt, Name: "cp-1"}, "upgrade-apply-v1.31.4-1", []string{"upgrade", "apply"}); err == nil || !strings.Contains(err.Error(), "check the staged kubeadm") {
		t.Errorf("spoilt kubeadm: %v", err)
	}

	node := &fakenode.Node{Scripts: map[string]fakenode.Handler{}}
	fx := &drivertest.Effects{}
	r := &driver.Run{StageDir: release.DefaultStageDir, Target: &release.Release{Version: v}, Dry: true, Log: slog.New(slog.DiscardHandler), Fx: fx}
	if err := runKubeadm(context.Background(), r, &nodeops.Ops{Node: node, Name: "worker-1"}, "upgrade-node-v1.31.4-1", []string{"upgrade", "node"}); err != nil {
		t.Fatal(err)
	}
	if len(node.Calls()) != 0 || len(fx.Said) != 1 || !strings.HasPrefix(fx.Said[0], "worker-1: kubeadm upgrade node ### kubelift-kubeadm-start /var/lib/kubelift/kubeadm upgrade-node-v1.31.4-1 /var/lib/kubelift/staged/v1.31.4/kubeadm upgrade node") {
		t.Errorf("dry run: calls %v, said %q", node.Calls(), fx.Said)
	}
}

// kubeadmSum is the signed sha256 of kubeadmTarget's kubeadm.
const kubeadmSum = "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"

// kubeadmTarget is a target whose bundle holds a kubeadm for amd64.
func kubeadmTarget(v catalog.Version) *release.Release {
	return &release.Release{Version: v, Manifest: &bundle.Manifest{Files: []bundle.File{{Name: "kubeadm", Arch: "amd64", SHA256: kubeadmSum}}}}
}

// kubeadm's reason is its "error execution phase" line onwards, or its
// last lines.
func TestKubeadmReason(t *testing.T) {
	got := kubeadmReason("a\nb\n[upgrade/apply] FATAL: couldn't upgrade control plane\nc")
	if got != "[upgrade/apply] FATAL: couldn't upgrade control plane | c" {
		t.Errorf("reason %q", got)
	}
	lines := strings.Repeat("x\n", 20) + "last"
	if got := kubeadmReason(lines); !strings.HasSuffix(got, "x | last") || strings.Count(got, "|") != 7 {
		t.Errorf("reason of a long log: %q", got)
	}
}

// manifest is a kubeadm static pod manifest for comp running image.
func manifest(comp, image string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\n  namespace: kube-system\nspec:\n  containers:\n  - name: %s\n    image: %s\n", comp, comp, image)
}

// manifestsOutput is what the node script kubeadm-manifests prints for
// the files given (path -> content), in order.
func manifestsOutput(files ...[2]string) string {
	var b strings.Builder
	for _, f := range files {
		fmt.Fprintf(&b, "file %s\n%s\n", f[0], base64.StdEncoding.EncodeToString([]byte(f[1])))
	}
	return b.String()
}

const (
	newerBackup = "/etc/kubernetes/tmp/kubeadm-backup-manifests-2026-11-25-10-00-00"
	olderBackup = "/etc/kubernetes/tmp/kubeadm-backup-manifests-2026-11-24-10-00-00"
)

// The manifests a rollback restores: for each part at the target the
// newest backup at the old version, scheduler first and etcd last (only
// when its image changed, within one etcd minor); a part at the target
// without a backup, or etcd moved to another minor, is refused.
func TestManifestRestores(t *testing.T) {
	cur := func(version, etcd string) map[string]kadm.Manifest {
		out := map[string]kadm.Manifest{"etcd": {Path: "/etc/kubernetes/manifests/etcd.yaml", Component: "etcd", Image: "reg/library/etcd:" + etcd}}
		for _, c := range release.ControlPlaneFiles {
			out[c] = kadm.Manifest{Path: "/etc/kubernetes/manifests/" + c + ".yaml", Component: c, Image: "reg/library/" + c + ":" + version}
		}
		return out
	}
	backup := func(dir, version, etcd string) map[string]kadm.Manifest {
		out := cur(version, etcd)
		for c, m := range out {
			m.Path = dir + "/" + c + ".yaml"
			out[c] = m
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		current map[string]kadm.Manifest
		backups []map[string]kadm.Manifest
		want    []string // COMPONENT<BACKUP DIR
		refused string
	}{
		{"never moved", cur("v1.31.3", "3.5.15-0"), []map[string]kadm.Manifest{backup(newerBackup, "v1.31.3", "3.5.15-0")}, nil, ""},
		{"moved: the newest backup at the old version", cur("v1.31.4", "3.5.15-0"),
			[]map[string]kadm.Manifest{backup(newerBackup, "v1.31.4", "3.5.15-0"), backup(olderBackup, "v1.31.3", "3.5.15-0")},
			[]string{"kube-scheduler<" + olderBackup, "kube-controller-manager<" + olderBackup, "kube-apiserver<" + olderBackup}, ""},
		{"etcd moved within its minor", cur("v1.31.4", "3.5.16-0"), []map[string]kadm.Manifest{backup(olderBackup, "v1.31.3", "3.5.15-0")},
			[]string{"kube-scheduler<" + olderBackup, "kube-controller-manager<" + olderBackup, "kube-apiserver<" + olderBackup, "etcd<" + olderBackup}, ""},
		{"etcd moved to another minor", cur("v1.31.4", "3.6.4-0"), []map[string]kadm.Manifest{backup(olderBackup, "v1.31.3", "3.5.15-0")}, nil, "another minor of etcd"},
		{"no backup at the old version", cur("v1.31.4", "3.5.15-0"), []map[string]kadm.Manifest{backup(newerBackup, "v1.31.2", "3.5.15-0")}, nil,
			"kube-scheduler runs v1.31.4 and no manifest kubeadm kept in /etc/kubernetes/tmp/kubeadm-backup-manifests-*/ runs v1.31.3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := manifestRestores("cp-1", "v1.31.3", "v1.31.4", tc.current, tc.backups)
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) || !strings.Contains(err.Error(), "node cp-1") {
					t.Fatalf("err = %v, want one naming cp-1 and %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var said []string
			for _, m := range got {
				said = append(said, m.Component+"<"+path.Dir(m.Backup))
				if m.Current != "/etc/kubernetes/manifests/"+m.Component+".yaml" {
					t.Errorf("%s restored over %s", m.Component, m.Current)
				}
			}
			if strings.Join(said, " ") != strings.Join(tc.want, " ") {
				t.Errorf("restores %v, want %v", said, tc.want)
			}
		})
	}
}

// What the node printed is refused when a path is not kubeadm's, a file
// is not base64 or not a Pod, or an image is not a version.
func TestParseManifestsRefuses(t *testing.T) {
	for _, tc := range []struct{ name, out, want string }{
		{"a path outside kubeadm's", manifestsOutput([2]string{"/tmp/x/kube-apiserver.yaml", manifest("kube-apiserver", "r/k:v1.31.4")}), "not one of kubeadm's"},
		{"a backup dir of another name", manifestsOutput([2]string{"/etc/kubernetes/tmp/kubeadm-backup-manifests-$(reboot)/kube-apiserver.yaml", manifest("kube-apiserver", "r/k:v1.31.4")}), "not one of kubeadm's"},
		{"another file", manifestsOutput([2]string{"/etc/kubernetes/manifests/shell.yaml", manifest("shell", "r/k:v1")}), "not one of kubeadm's"},
		{"not base64", "file /etc/kubernetes/manifests/etcd.yaml\n%%%\n", "illegal base64"},
		{"not a Pod", manifestsOutput([2]string{"/etc/kubernetes/manifests/etcd.yaml", "kind: Secret\n"}), `kind "Secret", not a Pod`},
		{"no container of its name", manifestsOutput([2]string{"/etc/kubernetes/manifests/etcd.yaml", manifest("kube-apiserver", "r/k:v1")}), "no container named etcd"},
		{"too large", "toolarge /etc/kubernetes/manifests/etcd.yaml\n", "over 1 MiB"},
		{"a stray line", "PWNED\n", "unexpected line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := parseManifests("cp-1", tc.out)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "node cp-1") {
				t.Fatalf("err = %v, want one naming cp-1 and %q", err, tc.want)
			}
		})
	}
	current, backups, err := parseManifests("cp-1", manifestsOutput(
		[2]string{"/etc/kubernetes/manifests/kube-apiserver.yaml", manifest("kube-apiserver", "r/kube-apiserver:v1.31.4")},
		[2]string{newerBackup + "/kube-apiserver.yaml", manifest("kube-apiserver", "r/kube-apiserver:v1.31.3")},
		[2]string{newerBackup + "/etcd.yaml", manifest("etcd", "r/etcd:3.5.15-0")},
		[2]string{olderBackup + "/kube-apiserver.yaml", manifest("kube-apiserver", "r/kube-apiserver:v1.31.2")}))
	if err != nil {
		t.Fatal(err)
	}
	if len(current) != 1 || len(backups) != 2 || len(backups[0]) != 2 || backups[1]["kube-apiserver"].Image != "r/kube-apiserver:v1.31.2" {
		t.Errorf("current %v, backups %v", current, backups)
	}
}

// Undo on a kubeadm control plane at the target puts kubeadm's backups
// back (the replaced manifests kept), waits for the static pods at the
// old version, then sets kubeadm-config and kube-proxy's image back; one
// that never moved is left as it is, and the cluster's objects that say
// the old version are not touched.
func TestKubeadmUndo(t *testing.T) {
	v, _ := catalog.ParseVersion("v1.31.4")
	for _, tc := range []struct {
		name, at string
		restores int
	}{{"never moved", "v1.31.3", 0}, {"moved", "v1.31.4", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{
				&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kubeadm-config"},
					Data: map[string]string{"ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: " + tc.at + "\nimageRepository: reg/library\n"}},
				&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy"},
					Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kube-proxy", Image: "reg/library/kube-proxy:" + tc.at}}}}}},
			}
			for _, c := range release.ControlPlaneFiles {
				objs = append(objs, drivertest.MirrorPod(c, tc.at, true))
			}
			client := fake.NewClientset(objs...)
			files := [][2]string{{"/etc/kubernetes/manifests/etcd.yaml", manifest("etcd", "reg/library/etcd:3.5.15-0")}}
			for _, c := range release.ControlPlaneFiles {
				files = append(files, [2]string{"/etc/kubernetes/manifests/" + c + ".yaml", manifest(c, "reg/library/"+c+":"+tc.at)})
			}
			files = append(files, [2]string{olderBackup + "/etcd.yaml", manifest("etcd", "reg/library/etcd:3.5.15-0")})
			for _, c := range release.ControlPlaneFiles {
				files = append(files, [2]string{olderBackup + "/" + c + ".yaml", manifest(c, "reg/library/"+c+":v1.31.3")})
			}
			var restored []string
			node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
				nodescript.KubeadmManifests.Name: func([]string) (string, error) { return manifestsOutput(files...), nil },
				nodescript.KubeadmRestoreManifest.Name: func(args []string) (string, error) {
					restored = append(restored, strings.Join(args, " "))
					comp := strings.TrimSuffix(path.Base(args[1]), ".yaml")
					_, err := client.CoreV1().Pods("kube-system").Update(context.Background(), drivertest.MirrorPod(comp, "v1.31.3", true), metav1.UpdateOptions{})
					return "", err
				},
			}}
			started := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
			r := &driver.Run{Client: client, Target: &release.Release{Version: v}, Log: slog.New(slog.DiscardHandler),
				ReadyTimeout: time.Minute, Now: func() time.Time { return started }, Started: started.Unix(),
				Fx:        &drivertest.Effects{Nodes: map[string]nodeaccess.Node{"cp-1": node}},
				Plan:      &preflight.Plan{From: []string{"v1.31.3"}, Nodes: []preflight.NodeState{{Name: "cp-1", Role: release.RoleControlPlane}}},
				Facts:     map[string]*nodefacts.Facts{"cp-1": {}},
				Addresses: map[string]nodeaccess.Address{"cp-1": {Name: "cp-1", Role: release.RoleControlPlane}}}
			if err := (Driver{}).Undo(context.Background(), r, "cp-1"); err != nil {
				t.Fatal(err)
			}
			if len(restored) != tc.restores {
				t.Fatalf("restored %q, want %d manifests", restored, tc.restores)
			}
			if tc.restores > 0 {
				keep := fmt.Sprintf("/etc/kubernetes/tmp/kubelift-rollback-manifests-%d", started.Unix())
				if want := olderBackup + "/kube-scheduler.yaml /etc/kubernetes/manifests/kube-scheduler.yaml " + keep; restored[0] != want {
					t.Errorf("first restore %q, want %q", restored[0], want)
				}
			}
			cm, _ := client.CoreV1().ConfigMaps("kube-system").Get(context.Background(), "kubeadm-config", metav1.GetOptions{})
			ds, _ := client.AppsV1().DaemonSets("kube-system").Get(context.Background(), "kube-proxy", metav1.GetOptions{})
			if !strings.Contains(cm.Data["ClusterConfiguration"], "kubernetesVersion: v1.31.3") || ds.Spec.Template.Spec.Containers[0].Image != "reg/library/kube-proxy:v1.31.3" {
				t.Errorf("kubeadm-config %q, kube-proxy image %s: want both at v1.31.3", cm.Data["ClusterConfiguration"], ds.Spec.Template.Spec.Containers[0].Image)
			}
			writes := 0
			for _, a := range client.Actions() {
				if u, ok := a.(k8stesting.UpdateAction); ok {
					if cm, ok := u.GetObject().(*corev1.ConfigMap); ok && cm.Name == "kubeadm-config" {
						writes++
					}
				}
				if a.GetVerb() == "patch" && a.GetResource().Resource == "daemonsets" {
					writes++
				}
			}
			if want := map[bool]int{true: 2, false: 0}[tc.restores > 0]; writes != want {
				t.Errorf("kubeadm-config and kube-proxy written %d times, want %d", writes, want)
			}
		})
	}
}

// A leader lease counts only when renewed after its holder's static pod
// started: right after a control plane was put back, the lease the
// replaced process renewed still looks live, but nobody leads.
func TestLeadsNow(t *testing.T) {
	started := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-scheduler-cp-1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}}}}}}
	lease := func(holder string, renewed time.Time) *coordinationv1.Lease {
		rt := metav1.NewMicroTime(renewed)
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-scheduler"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &rt}}
	}
	for _, tc := range []struct {
		name  string
		lease *coordinationv1.Lease
		want  string // "" when it leads
	}{
		{"renewed by the running process", lease("cp-1_abc", started.Add(3*time.Second)), ""},
		{"renewed by the replaced process", lease("cp-1_old", started.Add(-5*time.Second)), "before its process on cp-1 started"},
		{"a holder of another form", lease("scheduler-elsewhere", started.Add(-time.Hour)), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := leadsNow(context.Background(), &driver.Run{Client: fake.NewClientset(pod, tc.lease)}, "kube-scheduler")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("leadsNow = %q, want %q", got, tc.want)
			}
		})
	}
}

// --kubeadm-config: the UpgradeConfiguration is put on the node, named by
// its sha256, the patches directory in it when the node has one (not as
// --patches: kubeadm refuses that beside --config), and given to kubeadm
// as --config; a dry run only says so.
func TestKubeadmArgsWithConfig(t *testing.T) {
	cfg, err := kadm.ParseUpgradeConfig("c.yaml", []byte("apiVersion: kubeadm.k8s.io/v1beta4\nkind: UpgradeConfiguration\ntimeouts:\n  upgradeManifests: 90s\n"), "v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	v, _ := catalog.ParseVersion("v1.31.4")
	for _, tc := range []struct {
		verb    string
		patches bool
		config  *kadm.UpgradeConfig
		dry     bool
		want    string // the arguments, CONFIG for the file's path
	}{
		{"apply", true, nil, false, "upgrade apply v1.31.4 --yes --patches /etc/kubernetes/patches"},
		{"node", false, nil, false, "upgrade node"},
		{"apply", true, cfg, false, "upgrade apply v1.31.4 --yes --config CONFIG"},
		{"node", false, cfg, false, "upgrade node --config CONFIG"},
		{"node", true, cfg, true, "upgrade node --config CONFIG"},
	} {
		node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
			nodescript.Exists.Name: func([]string) (string, error) { return map[bool]string{true: "yes\n", false: "no\n"}[tc.patches], nil },
		}}
		r := &driver.Run{KubeadmConfig: tc.config, Target: &release.Release{Version: v}, Dry: tc.dry, Log: slog.New(slog.DiscardHandler), Fx: &drivertest.Effects{}}
		args, err := kubeadmArgs(context.Background(), r, &nodeops.Ops{Node: node, Name: "cp-1"}, tc.verb)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(args, " ")
		if tc.config != nil {
			data, at, _ := tc.config.ForNode(RunDir, tc.patches)
			got = strings.ReplaceAll(got, at, "CONFIG")
			put, uploaded := node.Uploaded(at)
			if tc.dry == uploaded || (uploaded && string(put) != string(data)) || (tc.patches && !strings.Contains(string(data), kadm.PatchesDir)) {
				t.Errorf("%s (patches %v, dry run %v): on the node at %s: %q (uploaded %v)", tc.verb, tc.patches, tc.dry, at, put, uploaded)
			}
		}
		if got != tc.want {
			t.Errorf("%s (patches %v, config %v): %q, want %q", tc.verb, tc.patches, tc.config != nil, got, tc.want)
		}
	}
}

// A run resumed after kubeadm moved every static pod of a node follows
// that node's kubeadm run to its end when there is one (kubeadm goes on
// past the static pods), and only waits when there is none.
func TestKubeadmUpgradeFollowsRunPastStaticPods(t *testing.T) {
	for _, tc := range []struct {
		name     string
		statuses []string
		follows  bool
	}{
		{"kubeadm still going", []string{"running\n[upgrade/addons] ...\n", "exit 0\n"}, true},
		{"kubeadm done", []string{"exit 0\n[upgrade] SUCCESS!\n"}, true},
		{"no kubeadm run of this upgrade", []string{"lost\n"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var objs []runtime.Object
			for _, c := range release.ControlPlaneFiles {
				objs = append(objs, drivertest.MirrorPod(c, "v1.31.4", true))
			}
			polls := 0
			var started []string
			node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
				nodescript.Exists.Name:    func([]string) (string, error) { return "no\n", nil },
				nodescript.CheckFile.Name: func([]string) (string, error) { return "", nil },
				nodescript.KubeadmStart.Name: func(args []string) (string, error) {
					started = args
					return strings.Fields(tc.statuses[0])[0] + "\n", nil
				},
				nodescript.KubeadmStatus.Name: func([]string) (string, error) {
					s := tc.statuses[min(polls, len(tc.statuses)-1)]
					polls++
					return s, nil
				},
			}}
			v, _ := catalog.ParseVersion("v1.31.4")
			started0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
			target := kubeadmTarget(v)
			r := &driver.Run{Client: fake.NewClientset(objs...), Target: target, Log: slog.New(slog.DiscardHandler),
				Wait:         waiter.Waiter{Clock: drivertest.SteppingClock(t, 2*time.Second)},
				ReadyTimeout: time.Minute, StageDir: release.DefaultStageDir, Now: func() time.Time { return started0 }, Started: started0.Unix(),
				Fx:        &drivertest.Effects{Nodes: map[string]nodeaccess.Node{"cp-1": node}, StageDir: release.DefaultStageDir},
				Plan:      &preflight.Plan{From: []string{"v1.31.3"}, Nodes: []preflight.NodeState{{Name: "cp-1", Role: release.RoleControlPlane}}},
				Facts:     map[string]*nodefacts.Facts{"cp-1": {Components: map[string]string{"kubelet": "v1.31.3"}}},
				Addresses: map[string]nodeaccess.Address{"cp-1": {Name: "cp-1", Role: release.RoleControlPlane}}}
			if err := (Driver{}).Upgrade(context.Background(), r, "cp-1", target); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("upgrade-apply-v1.31.4-%d", started0.Unix())
			if followed := len(started) > 1 && started[1] == want; followed != tc.follows {
				t.Errorf("kubeadm-start %q: followed %v, want %v (run %s)", started, followed, tc.follows, want)
			}
		})
	}
}
