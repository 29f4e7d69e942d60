// Package kubeadm_test upgrades a kubeadm-built sandbox (kubeadm init and
// join, the control plane and etcd as static pods from the private
// registry, kube-proxy as a DaemonSet, CoreDNS) from v1.30.14 to v1.31.4
// with the built upgrade program, through the nodes' sshd and the real
// API server, on the real runtime: a control-plane image missing from
// the registry is refused at plan, a static pod that never comes up is
// rolled back by kubeadm and reported with kubeadm's reason, a run killed
// while kubeadm works is resumed, and after it no shop container has
// restarted and the prober has seen nothing fail.
package kubeadm_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/upgradelock"
	"github.com/kubelift/kubelift/test/env/harness"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

var h *harness.Harness

func TestMain(m *testing.M) {
	harness.Main(m, "klk", "10.88.0", 1, 2, func(x *harness.Harness) { h = x }, harness.Kubeadm())
}

// flags are apply's and plan's: the registry, the nodes, the team's key.
func flags(verb string, extra ...string) ([]string, string) {
	reg, pw := h.RegistryFlags()
	args := append(append([]string{verb, "--to", h.SB.NewVersion, "--key", h.Key()}, reg...), h.SSHFlags()...)
	return append(args, extra...), pw
}

func kubeadmConfig(t *testing.T) *kubeadm.Config {
	t.Helper()
	c, err := kubeadm.Read(context.Background(), h.Client)
	if err != nil || c == nil {
		t.Fatalf("kubeadm-config: %v (found: %v)", err, c != nil)
	}
	return c
}

// controlPlane maps each static control-plane pod (etcd too) to its
// image and whether it is Ready.
func controlPlane() (map[string]string, error) {
	pods, err := h.Client.CoreV1().Pods("kube-system").List(context.Background(), metav1.ListOptions{LabelSelector: "tier=control-plane"})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		ready := "not ready"
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ready = "ready"
			}
		}
		out[p.Labels["component"]] = p.Spec.Containers[0].Image + " " + ready
	}
	return out, nil
}

// wantControlPlane: every static pod runs version's image from the
// cluster's imageRepository, and is Ready.
func wantControlPlane(version string) func() (bool, string) {
	return func() (bool, string) {
		got, err := controlPlane()
		if err != nil {
			return false, err.Error()
		}
		repo := h.SB.ImageRepository()
		for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			if got[c] != repo+"/"+c+":"+version+" ready" {
				return false, c + ": " + got[c]
			}
		}
		if got["etcd"] != repo+"/etcd:"+sandbox.EtcdTag+" ready" {
			return false, "etcd: " + got["etcd"]
		}
		return true, ""
	}
}

// The sandbox is what kubeadm made: kubeadm-config at the old version with
// the private registry as its imageRepository, the static pods from it.
func TestSandboxIsKubeadmBuilt(t *testing.T) {
	c := kubeadmConfig(t)
	if c.KubernetesVersion.String() != h.SB.OldVersion || c.ImageRepository != h.SB.ImageRepository() || !c.LocalEtcd {
		t.Fatalf("kubeadm-config: %+v", c)
	}
	harness.Eventually(t, time.Minute, wantControlPlane(h.SB.OldVersion))
	ds, err := h.Client.AppsV1().DaemonSets("kube-system").Get(context.Background(), "kube-proxy", metav1.GetOptions{})
	if err != nil || ds.Status.NumberAvailable != int32(len(h.SB.Nodes())) {
		t.Fatalf("kube-proxy DaemonSet: %v (%+v)", err, ds.Status)
	}
}

// A control-plane image kubeadm will pull that is not in the registry
// blocks the plan, naming it where kubeadm looks; imported again, it does
// not.
func TestPlanRefusesAMissingControlPlaneImage(t *testing.T) {
	h.Import(t, h.HashSkipBundle)
	opts, err := h.SB.RegistryOptions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := h.SB.ImageRepository() + "/kube-apiserver:" + h.SB.NewVersion
	tag, err := name.ParseReference(want)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Head(tag, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Delete(tag.Context().Digest(desc.Digest.String()), opts...); err != nil {
		t.Fatalf("delete %s from the registry: %v", want, err)
	}
	plan := func() preflight.Plan {
		args, pw := flags("plan", "-o", "json", "-q")
		r := h.Upgrade(t, pw, args...)
		var p preflight.Plan
		if err := json.Unmarshal([]byte(r.Stdout), &p); err != nil {
			t.Fatalf("plan: exit %d: %v\n%s", r.Code, err, r.Stderr)
		}
		if p.ControlPlane != release.KindKubeadm {
			t.Errorf("plan says control plane %q, want %s", p.ControlPlane, release.KindKubeadm)
		}
		return p
	}
	missing := func(p preflight.Plan) bool {
		for _, f := range p.Findings {
			if f.Check == "kubeadm" && f.Severity == preflight.Blocking && f.Object == "image/"+want {
				return true
			}
		}
		return false
	}
	if p := plan(); !p.Blocked || !missing(p) {
		t.Fatalf("plan with %s missing: blocked %v, findings %+v", want, p.Blocked, p.Findings)
	}
	h.Import(t, h.HashSkipBundle)
	if p := plan(); missing(p) {
		t.Fatalf("plan after import still misses %s: %+v", want, p.Findings)
	}
}

// A kube-scheduler that never comes up (a patch, as an operator's, names
// an image that does not exist) is rolled back by kubeadm: apply waits
// until the old control plane runs again, exits non-zero with kubeadm's
// reason (naming the static pod it was moving), status says cp-1 was
// rolled back and why, no kubelet moved. kubeadm is given an
// UpgradeConfiguration (--kubeadm-config) that shortens its wait for a
// static pod from 5 minutes to 3. The wait is kubeadm's for every static
// pod it moves, etcd's first: at 90 seconds, a cold run (Kubernetes
// releases building beside it) saw etcd's restart outlast it, and kubeadm
// fail and roll back at etcd instead of at the scheduler.
func TestStaticPodNeverHealthyRolledBackByKubeadm(t *testing.T) {
	patch := kubeadm.PatchesDir + "/kube-scheduler+json.yaml"
	h.SSH(t, "cp-1", "printf '%s\\n' '- op: replace' '  path: /spec/containers/0/image' '  value: "+h.SB.ImageRepository()+"/kube-scheduler:v0.0.0-missing' > "+patch)
	defer h.SSH(t, "cp-1", "rm -f "+patch)
	config := filepath.Join(t.TempDir(), "upgrade.yaml")
	if err := os.WriteFile(config, []byte("apiVersion: kubeadm.k8s.io/v1beta4\nkind: UpgradeConfiguration\ntimeouts:\n  upgradeManifests: 3m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args, pw := flags("apply", "--restore-labels", "--settle", "5s", "-q", "--kubeadm-config", config)
	r := h.UpgradeWithin(t, 15*time.Minute, pw, args...)
	// kubeadm read the file: its wait was the one it gives.
	if _, err := h.TrySSH("cp-1", "grep -l 'This can take up to 3m0s' "+inplace.KubeadmRunDir+"/upgrade-apply-"+h.SB.NewVersion+"-*.log"); err != nil {
		t.Errorf("kubeadm did not wait as --kubeadm-config said (3m): %v", err)
	}
	if r.Code == 0 {
		t.Fatalf("apply succeeded with a scheduler that cannot start:\n%s", r.Stderr)
	}
	for _, s := range []string{"kubeadm upgrade apply " + h.SB.NewVersion, "while it moved kube-scheduler", "put node cp-1's control plane back at " + h.SB.OldVersion} {
		if !strings.Contains(r.Stderr, s) {
			t.Errorf("apply's error does not say %q:\n%s", s, r.Stderr)
		}
	}
	st, err := record.Read(context.Background(), h.Client)
	if err != nil || st == nil {
		t.Fatalf("state: %v", err)
	}
	for _, n := range st.Nodes {
		if n.Name == "cp-1" && (n.Status != record.NodeRolledBack || !strings.Contains(n.LastError, "while it moved kube-scheduler")) {
			t.Errorf("status of cp-1: %s, %q", n.Status, n.LastError)
		}
		if n.Role == release.RoleWorker && n.Status != record.NodePending && n.Status != "" {
			t.Errorf("worker %s touched: %s", n.Name, n.Status)
		}
	}
	if ok, why := wantControlPlane(h.SB.OldVersion)(); !ok {
		t.Errorf("after apply returned, the control plane is not back at %s: %s", h.SB.OldVersion, why)
	}
	if v := kubeadmConfig(t).KubernetesVersion.String(); v != h.SB.OldVersion {
		t.Errorf("kubeadm-config says %s after kubeadm rolled back", v)
	}
	for _, m := range h.SB.Nodes() {
		if v := h.Node(t, m.Name).Status.NodeInfo.KubeletVersion; v != h.SB.OldVersion {
			t.Errorf("node %s: kubelet %s after a failed control plane", m.Name, v)
		}
	}
}

// apply killed while kubeadm upgrades the control plane: kubeadm goes on
// (it runs detached on the node); the next apply follows that same run
// and finishes the upgrade. Then the static pods run the target from the
// private registry, kubeadm-config says it, every kubelet runs it, no
// shop container restarted, the prober saw nothing fail, and apply again
// has nothing to do.
func TestKilledWhileKubeadmRunsThenResumed(t *testing.T) {
	before := h.Shop(t)
	if len(before) == 0 {
		t.Fatal("no shop containers running")
	}
	probe := h.Probe(t)
	args, pw := flags("apply", "--restore-labels", "--settle", "5s", "--lock-duration", "6s", "-q")
	cmd, stderr, err := h.Start(pw, args...)
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Killed once the kubeadm it started (alive, by its pid file) has
	// moved the API server (so that the next run finds it answering), while
	// it moves the rest. (The run before left a log of the same name.)
	// (kubeadm moves etcd first; each static pod may take minutes.)
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(time.Second) {
		_, err := h.TrySSH("cp-1", `for f in `+inplace.KubeadmRunDir+`/upgrade-apply-`+h.SB.NewVersion+`-*.log; do `+
			`kill -0 "$(cat "${f%.log}.pid")" && grep -q 'Component "kube-apiserver" upgraded successfully' "$f" && exit 0; done; exit 1`)
		if err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("apply ended (%v) before kubeadm moved cp-1's API server:\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatal("gave up waiting for kubeadm to move cp-1's API server")
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	harness.WaitFor(t, "the killed run's lease to expire", func() bool {
		l, err := h.Client.CoordinationV1().Leases("kube-system").Get(context.Background(), upgradelock.Name, metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) > 7*time.Second
	})
	args, pw = flags("apply", "--restore-labels", "--settle", "5s")
	r := h.UpgradeWithin(t, 15*time.Minute, pw, args...)
	if r.Code != 0 {
		t.Fatalf("apply after the kill: exit %d\n%s", r.Code, r.Stderr)
	}
	// It followed the kubeadm run the killed apply started (still going,
	// or finished by then), and started no second one on cp-1.
	applyRun := regexp.MustCompile(`msg=kubeadm node=cp-1 run=upgrade-apply-\S+ .* state=(\w+)`).FindStringSubmatch(r.Stderr)
	if applyRun == nil || (applyRun[1] != "running" && applyRun[1] != "done") {
		t.Errorf("the second apply did not follow the kubeadm run the first one started (%v):\n%s", applyRun, r.Stderr)
	}
	res := probe.Stop()
	harness.Eventually(t, time.Minute, wantControlPlane(h.SB.NewVersion))
	if v := kubeadmConfig(t).KubernetesVersion.String(); v != h.SB.NewVersion {
		t.Errorf("kubeadm-config says %s", v)
	}
	for _, m := range h.SB.Nodes() {
		if v := h.Node(t, m.Name).Status.NodeInfo.KubeletVersion; v != h.SB.NewVersion {
			t.Errorf("node %s: kubelet %s", m.Name, v)
		}
	}
	after := h.Shop(t)
	for id, what := range before {
		if _, ok := after[id]; !ok {
			t.Errorf("shop container restarted: %s (%s)", what, id)
		}
	}
	// Availability, as a user judges it: through the kill, kubeadm's
	// control plane and addons, and every kubelet swapped, no request
	// failed and no held connection broke.
	h.NoDisruption(t, res)
	args, pw = flags("apply", "--restore-labels")
	if r := h.Upgrade(t, pw, args...); r.Code != 0 || !strings.Contains(r.Stdout+r.Stderr, "nothing to do") {
		t.Errorf("apply again: exit %d, want nothing to do:\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}
