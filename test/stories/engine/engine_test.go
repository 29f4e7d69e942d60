package engine

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/pkg/hashskip"
	"github.com/kubelift/kubelift/test/env/harness"
	"github.com/kubelift/kubelift/test/env/kube"
	"github.com/kubelift/kubelift/test/env/prober"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

const stageDir = "/var/lib/kubelift/staged"

// signedFiles reads a bundle's files (name -> sha256) with the upgrade
// program's inspect.
func signedFiles(t *testing.T, file string) map[string]string {
	t.Helper()
	out, err := programOut(nil, "", filepath.Join(bin, "upgrade"), "inspect", "-o", "json", file)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Files []struct{ Name, Arch, SHA256 string }
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatal(err)
	}
	sums := map[string]string{}
	for _, f := range m.Files {
		sums[f.Name] = f.SHA256
	}
	return sums
}

func parseStage(t *testing.T, r result) *stage.Result {
	t.Helper()
	var res stage.Result
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		t.Fatalf("stage -o json: %v\n%s\n%s", err, r.Stdout, r.Stderr)
	}
	return &res
}

func stageArgs(extra ...string) ([]string, string) {
	reg, pw := registryFlags()
	// The sandbox's registry takes a password (htpasswd): the nodes may
	// be handed it to pull.
	args := append([]string{"stage", "--to", sb.NewVersion, "--key", filepath.Join(work, "team.pub"), "-o", "json", "-q", "--node-credentials", "password"}, reg...)
	return append(append(args, sshFlags()...), extra...), pw
}

// Stage on 1+3 nodes: each node gets exactly its role's files with the
// signed sha256 (read back over SSH). The nodes that reach the private
// registry pull them themselves, the zstd copies import pushed (this
// machine sends none of the bytes);
// worker-3, whose firewall keeps the registry out, is sent them over SSH,
// compressed; a second stage moves nothing.
func TestStage(t *testing.T) {
	importBundle(t, hashSkipBundle)
	// The version is now available; the nodes' one is active.
	vr := upgrade(t, "", "versions", "-o", "json")
	var versions []inplace.VersionState
	if err := json.Unmarshal([]byte(vr.Stdout), &versions); err != nil || vr.Code != 0 {
		t.Fatalf("versions: %v\n%s%s", err, vr.Stdout, vr.Stderr)
	}
	states := map[string]string{}
	for _, v := range versions {
		states[v.Version] = v.State
		if v.Target != (v.Version == sb.OldVersion) {
			t.Errorf("%s target %v", v.Version, v.Target)
		}
	}
	if states[sb.OldVersion] != inplace.StateActive || states[sb.NewVersion] != inplace.StateAvailable {
		t.Errorf("versions: %v", states)
	}
	sums := signedFiles(t, hashSkipBundle)
	// worker-3 cannot reach the registry: its own firewall, set over SSH
	// as its admin would.
	host, port, _ := strings.Cut(sb.Registry.Address, ":")
	block := fmt.Sprintf("iptables -w -%%s OUTPUT -p tcp -d %s --dport %s -j REJECT --reject-with tcp-reset", host, port)
	ssh(t, "worker-3", fmt.Sprintf(block, "I"))
	t.Cleanup(func() { ssh(t, "worker-3", fmt.Sprintf(block, "D")) })
	// The plan says each node's path first.
	_, p := plan(t, sb.NewVersion, "--node-credentials", "password")
	for _, n := range p.Nodes {
		if want := map[bool]string{true: stage.ViaSSH, false: stage.ViaRegistry}[n.Name == "worker-3"]; n.StagePath != want {
			t.Errorf("plan: %s would be staged %q (%s), want %s", n.Name, n.StagePath, n.StagePathReason, want)
		}
	}
	args, pw := stageArgs()
	r := upgrade(t, pw, args...)
	if r.Code != 0 {
		t.Fatalf("stage: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	res := parseStage(t, r)
	for _, n := range res.Nodes {
		want := release.FilesFor(roleOf(n.Node))
		if strings.Join(n.Sent, ",") != strings.Join(sorted(want), ",") {
			t.Errorf("%s: staged %v, want %v", n.Node, n.Sent, sorted(want))
		}
		if n.Node == "worker-3" {
			if n.Path != stage.ViaSSH || !strings.Contains(n.PathReason, "cannot be reached") || n.BytesSent == 0 || n.BytesSent >= n.Bytes || n.BytesPulled != 0 {
				t.Errorf("worker-3, the registry out of its reach: %+v, want SSH, compressed", n)
			}
		} else if n.Path != stage.ViaRegistry || n.BytesSent != 0 || n.BytesPulled == 0 || n.BytesPulled >= n.Bytes {
			t.Errorf("%s: %+v, want the zstd copies pulled from the registry by the node, none of it sent", n.Node, n)
		}
		got := ssh(t, n.Node, fmt.Sprintf("cd %s/%s && sha256sum *", stageDir, sb.NewVersion))
		for _, name := range want {
			if !strings.Contains(got, sums[name]+"  "+name+"\n") {
				t.Errorf("%s: %s not staged with the signed sha256 %s:\n%s", n.Node, name, sums[name], got)
			}
		}
		if strings.Count(got, "\n") != len(want) {
			t.Errorf("%s: staged files other than its role's:\n%s", n.Node, got)
		}
	}
	again := parseStage(t, upgrade(t, pw, args...))
	for _, n := range again.Nodes {
		if n.BytesSent != 0 || n.BytesPulled != 0 || len(n.Sent) != 0 {
			t.Errorf("second stage moved %d+%d bytes (%v) to %s", n.BytesSent, n.BytesPulled, n.Sent, n.Node)
		}
	}
}

func roleOf(node string) string {
	if strings.HasPrefix(node, "cp-") {
		return release.RoleControlPlane
	}
	return release.RoleWorker
}

func sorted(s []string) []string {
	out := append([]string{}, s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// A node presenting another host key than known_hosts pins is refused
// before any byte is sent; an unreachable node is named; the others are
// staged all the same, and stage exits non-zero.
func TestStageRefusesWrongHostKeyAndNamesUnreachableNode(t *testing.T) {
	importBundle(t, hashSkipBundle)
	w1, _ := sb.Machine("worker-1")
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, _ := gossh.NewSignerFromKey(priv)
	known, err := os.ReadFile(filepath.Join(sb.Dir, "ssh", "known_hosts"))
	if err != nil {
		t.Fatal(err)
	}
	var forged []string
	for _, line := range strings.Split(strings.TrimSpace(string(known)), "\n") {
		if hosts, _, _ := strings.Cut(line, " "); strings.Contains(","+hosts+",", ","+w1.Address+",") {
			line = hosts + " " + strings.TrimSpace(string(gossh.MarshalAuthorizedKey(signer.PublicKey())))
		}
		forged = append(forged, line)
	}
	dir := t.TempDir()
	knownHosts := filepath.Join(dir, "known_hosts")
	inventory := filepath.Join(dir, "inventory.yaml")
	os.WriteFile(knownHosts, []byte(strings.Join(forged, "\n")+"\n"), 0o644)
	// worker-2's sshd is not on port 2222: unreachable.
	os.WriteFile(inventory, []byte("apiVersion: kubelift.io/v1alpha1\nkind: Inventory\nnodes:\n- name: worker-2\n  port: 2222\n"), 0o644)
	faults := "/var/lib/kubelift/staged-faults"
	args, pw := stageArgs("--known-hosts", knownHosts, "--inventory", inventory, "--stage-dir", faults)
	r := upgrade(t, pw, args...)
	if r.Code != 1 {
		t.Fatalf("stage with a forged host key and an unreachable node: exit %d, want 1\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	res := parseStage(t, r)
	for _, n := range res.Nodes {
		switch n.Node {
		case "worker-1":
			if !strings.Contains(n.Error, "host key mismatch") || !strings.Contains(n.Error, w1.Address) || n.BytesSent != 0 {
				t.Errorf("worker-1: %+v, want a host key mismatch naming %s, nothing sent", n, w1.Address)
			}
		case "worker-2":
			if !strings.Contains(n.Error, "worker-2") || !strings.Contains(n.Error, ":2222") {
				t.Errorf("worker-2: %+v, want an error naming it and its port", n)
			}
		default:
			if n.Error != "" || len(n.Sent) == 0 {
				t.Errorf("%s not staged: %+v", n.Node, n)
			}
		}
	}
	if !strings.Contains(r.Stderr, "worker-1") || !strings.Contains(r.Stderr, "worker-2") {
		t.Errorf("the error does not name both nodes:\n%s", r.Stderr)
	}
	if out := ssh(t, "worker-1", "test -e "+faults+" && echo present || echo absent"); out != "absent\n" {
		t.Errorf("worker-1 got %s although its host key was refused", faults)
	}
}

func parsePlan(t *testing.T, r result) *preflight.Plan {
	t.Helper()
	var p preflight.Plan
	if err := json.Unmarshal([]byte(r.Stdout), &p); err != nil {
		t.Fatalf("plan -o json: %v\n%s\n%s", err, r.Stdout, r.Stderr)
	}
	return &p
}

func plan(t *testing.T, version string, extra ...string) (result, *preflight.Plan) {
	t.Helper()
	reg, pw := registryFlags()
	args := append(append([]string{"plan", "--to", version, "--key", filepath.Join(work, "team.pub"), "-o", "json", "-q"}, reg...), sshFlags()...)
	r := upgrade(t, pw, append(args, extra...)...)
	return r, parsePlan(t, r)
}

func findings(p *preflight.Plan, check preflight.Check, sev preflight.Severity) []preflight.Finding {
	var out []preflight.Finding
	for _, f := range p.Findings {
		if f.Check == check && f.Severity == sev {
			out = append(out, f)
		}
	}
	return out
}

func hasFinding(p *preflight.Plan, check preflight.Check, sev preflight.Severity, object string, parts ...string) bool {
	for _, f := range findings(p, check, sev) {
		if f.Object != object {
			continue
		}
		all := true
		for _, s := range parts {
			all = all && strings.Contains(f.Message, s)
		}
		if all {
			return true
		}
	}
	return false
}

// The plan on the sandbox's workloads, with the hash-skip kubelet bundled:
// pinned-ssd would fail re-admission (blocking, naming the label), the pods
// without tolerations are named, and every running container is predicted
// to keep running under the hash-skip file.
func TestPlanHashSkipKubelet(t *testing.T) {
	importBundle(t, hashSkipBundle)
	r, p := plan(t, sb.NewVersion)
	if r.Code != 4 || !p.Blocked {
		t.Fatalf("plan: exit %d (blocked %v), want 4\n%s", r.Code, p.Blocked, r.Stderr)
	}
	if !hasFinding(p, "readmission", preflight.Blocking, "pod/"+sandbox.WorkloadNamespace+"/pinned-ssd", "NodeAffinity", sandbox.PinnedLabel+"=ssd") {
		t.Errorf("no blocking NodeAffinity finding naming pinned-ssd and %s: %+v", sandbox.PinnedLabel, findings(p, "readmission", preflight.Blocking))
	}
	if n := len(findings(p, "readmission", preflight.Blocking)); n != 1 {
		t.Errorf("%d re-admission findings, want 1 (pinned-ssd)", n)
	}
	evict := map[string]bool{}
	for _, f := range findings(p, "eviction", preflight.Warning) {
		evict[f.Object] = true
	}
	pods, err := client.CoreV1().Pods(sandbox.WorkloadNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range pods.Items {
		lacks := !tolerated(pod.Spec.Tolerations) && !ownedBy(&pod, "DaemonSet")
		if evict["pod/"+pod.Namespace+"/"+pod.Name] != lacks {
			t.Errorf("pod %s: eviction finding %v, lacks tolerations %v", pod.Name, evict["pod/"+pod.Namespace+"/"+pod.Name], lacks)
		}
	}
	if !evict["pod/"+sandbox.WorkloadNamespace+"/batch-legacy"] {
		t.Error("batch-legacy (no tolerations) is not named")
	}
	if !p.HashSkipKubelet {
		t.Error("the plan does not know the bundled kubelet honours the hash-skip file")
	}
	for _, n := range p.Nodes {
		if n.Role == release.RoleWorker && (n.Containers == 0 || n.Protected != n.Containers || n.Restarts != 0) {
			t.Errorf("%s: %d containers, %d kept by the hash-skip file, %d restarts; want all kept", n.Name, n.Containers, n.Protected, n.Restarts)
		}
		if n.Kubelet != sb.OldVersion || (n.Role == release.RoleControlPlane && n.Components["kube-apiserver"] != sb.OldVersion) {
			t.Errorf("%s: kubelet %s, components %v; want %s, read from the node", n.Name, n.Kubelet, n.Components, sb.OldVersion)
		}
		// What containerd says of itself over CRI (crictl on the node), and
		// the driver the v1.30 kubelet takes from its configuration.
		if want := "containerd " + kube.ContainerdVersion + ", CRI v1"; n.CRI != want || n.CgroupDriver != "cgroupfs" {
			t.Errorf("%s: CRI %q, cgroup driver %q; want %q and cgroupfs", n.Name, n.CRI, n.CgroupDriver, want)
		}
	}
	if len(findings(p, "restarts", preflight.Blocking)) != 0 {
		t.Errorf("restarts blocking with the hash-skip kubelet: %+v", findings(p, "restarts", preflight.Blocking))
	}
	// The order: control plane first, tolerations, then kubelets, workers
	// in canary batches 1, 2.
	_, p = plan(t, sb.NewVersion, "--max-unavailable", "2", "--canary")
	var order []string
	for _, s := range p.Steps {
		order = append(order, s.Phase+":"+strings.Join(s.Nodes, ","))
	}
	want := "patch-tolerations: control-plane:cp-1 kubelets:cp-1 kubelets:worker-1 kubelets:worker-2,worker-3"
	if got := strings.Join(order, " "); got != want {
		t.Errorf("steps %s\nwant  %s", got, want)
	}
}

func tolerated(ts []corev1.Toleration) bool {
	n := 0
	for _, key := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
		for _, t := range ts {
			if (t.Key == key || (t.Key == "" && t.Operator == corev1.TolerationOpExists)) && (t.Effect == "" || t.Effect == corev1.TaintEffectNoExecute) {
				n++
				break
			}
		}
	}
	return n == 2
}

func ownedBy(p *corev1.Pod, kind string) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == kind {
			return true
		}
	}
	return false
}

// A kubelet flag the target removed, written into one node's flags
// environment file (not yet in effect), blocks the plan, naming the node,
// the flag and the file.
func TestPlanBlocksRemovedKubeletFlag(t *testing.T) {
	importBundle(t, hashSkipBundle)
	const env = "/var/lib/kubelet/kubelet-flags.env"
	old := ssh(t, "worker-1", "cat "+env+" 2>/dev/null || true")
	t.Cleanup(func() { ssh(t, "worker-1", fmt.Sprintf("printf %%s %s > %s", nodeaccess.Quote(old), env)) })
	ssh(t, "worker-1", `echo 'KUBELET_ARGS="--v=3 --keep-terminated-pod-volumes=false"' > `+env)
	r, p := plan(t, sb.NewVersion)
	if r.Code != 4 {
		t.Fatalf("exit %d, want 4", r.Code)
	}
	if !hasFinding(p, "removed-flags", preflight.Blocking, "node/worker-1", "kubelet", "--keep-terminated-pod-volumes", env) {
		t.Errorf("no blocking removed-flags finding for worker-1: %+v", findings(p, "removed-flags", preflight.Blocking))
	}
	if n := len(findings(p, "removed-flags", preflight.Blocking)); n != 1 {
		t.Errorf("%d removed-flags findings, want 1", n)
	}
}

// A bundle whose version skips a minor (v1.32 on a v1.30 control plane) is
// blocking, naming each control-plane component on its node.
func TestPlanBlocksSkippedMinor(t *testing.T) {
	cat := filepath.Join(t.TempDir(), "catalog.yaml")
	// v1.32.0 made of v1.31.4's artifacts: only its version number matters here.
	os.WriteFile(cat, []byte(`schemaVersion: 1
arches: [amd64, arm64]
kubeletHashEras: [{era: json-without-resources, from: v1.27.0}, {era: name-image, from: v1.31.0}]
versions:
  - version: v1.32.0
    kubeletHashEra: name-image
    upgradeFrom: [v1.31]
    downgradeTo: []
    removedKubeletFlags: []
    removedAPIs: []
    images: [registry.k8s.io/kube-apiserver:v1.31.4, registry.k8s.io/pause:3.10]
    files:
      - {name: kubelet, url: "https://dl.k8s.io/release/v1.31.4/bin/linux/{arch}/kubelet"}
      - {name: kube-apiserver, url: "https://dl.k8s.io/release/v1.31.4/bin/linux/{arch}/kube-apiserver"}
`), 0o644)
	out := filepath.Join(t.TempDir(), "skip.tar")
	args := append([]string{"create", "--kubernetes-version", "v1.32.0", "--catalog", cat, "--sign-key", filepath.Join(work, "team.key"), "-o", out,
		"--cache-dir", filepath.Join(work, "cache"), "-q"}, sb.Internet.BundleFlags...)
	if _, err := programOut(&kube.NetNS{Name: sb.Internet.NetNS}, "", filepath.Join(bin, "bundle"), args...); err != nil {
		t.Fatal(err)
	}
	importBundle(t, out)
	r, p := plan(t, "v1.32.0")
	if r.Code != 4 {
		t.Fatalf("exit %d, want 4\n%s", r.Code, r.Stderr)
	}
	if !hasFinding(p, "path", preflight.Blocking, "node/cp-1", "kube-apiserver runs "+sb.OldVersion, "skips a minor") {
		t.Errorf("no blocking path finding: %+v", findings(p, "path", preflight.Blocking))
	}
}

// A node whose status is forged to carry a command in its kubelet version
// (its kubelet stopped, the status subresource patched, as an attacker
// on the node or with the node's credentials could) is refused by
// construction: plan exits 4 naming the node, field and value; apply
// (even told to ignore the check), rollback and compat cleanup refuse
// before touching any node; the command ran nowhere: not on any node,
// not on the admin machine.
func TestForgedKubeletVersionIsRefused(t *testing.T) {
	importBundle(t, hashSkipBundle)
	mark := fmt.Sprintf("/tmp/kubelift-forged-%d", os.Getpid())
	forged := "$(touch " + mark + ")" + sb.OldVersion
	ctx := context.Background()
	ssh(t, "worker-3", "systemctl stop kubelet")
	// The node's Lease is renewed for it meanwhile, as its kubelet would:
	// the node stays Ready, and no pod of worker-3 is evicted (the
	// sandbox's workloads stay as the later tests expect them).
	renewCtx, stopRenewing := context.WithCancel(ctx)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		leases := client.CoordinationV1().Leases("kube-node-lease")
		for renewCtx.Err() == nil {
			if l, err := leases.Get(renewCtx, "worker-3", metav1.GetOptions{}); err == nil {
				now := metav1.NewMicroTime(time.Now())
				l.Spec.RenewTime = &now
				_, _ = leases.Update(renewCtx, l, metav1.UpdateOptions{})
			}
			select {
			case <-renewCtx.Done():
			case <-time.After(2 * time.Second):
			}
		}
	}()
	t.Cleanup(func() {
		stopRenewing()
		<-renewed
		ssh(t, "worker-3", "systemctl start kubelet")
		waitFor(t, "worker-3 Ready at "+sb.OldVersion+" again", func() bool {
			n, err := client.CoreV1().Nodes().Get(ctx, "worker-3", metav1.GetOptions{})
			return err == nil && sandbox.NodeReady(n) && n.Status.NodeInfo.KubeletVersion == sb.OldVersion
		})
	})
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"nodeInfo": map[string]any{"kubeletVersion": forged}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Patch(ctx, "worker-3", types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	// A recorded upgrade for rollback to start from, as a run that
	// stopped would leave.
	state, _ := json.Marshal(record.Upgrade{From: sb.OldVersion, To: sb.NewVersion, State: record.StateFailed})
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.Name, Namespace: "kube-system"}, Data: map[string]string{"state.json": string(state)}}
	if _, err := client.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().ConfigMaps("kube-system").Delete(ctx, record.Name, metav1.DeleteOptions{})
	})

	r, p := plan(t, sb.NewVersion)
	if r.Code != 4 {
		t.Errorf("plan: exit %d, want 4", r.Code)
	}
	if !hasFinding(p, "values", preflight.Blocking, "node/worker-3", "status.nodeInfo.kubeletVersion", forged) {
		t.Errorf("no blocking values finding naming worker-3 and the value: %+v", p.Findings)
	}
	for _, v := range p.From {
		if strings.Contains(v, "$") {
			t.Errorf("the forged value is among the versions the cluster runs: %v", p.From)
		}
	}
	reg, pw := registryFlags()
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"apply", append(append([]string{"apply", "--to", sb.NewVersion, "--key", filepath.Join(work, "team.pub"), "--ignore-preflight", "values,readmission,eviction,restarts"}, reg...), sshFlags()...)},
		{"rollback", append([]string{"rollback"}, sshFlags()...)},
		{"compat cleanup", append([]string{"compat", "cleanup"}, sshFlags()...)},
	} {
		r := upgrade(t, pw, tc.args...)
		if r.Code == 0 || !strings.Contains(r.Stderr, "worker-3") || !strings.Contains(r.Stderr, "kubeletVersion") {
			t.Errorf("%s: exit %d, want a refusal naming worker-3 and the field\n%s", tc.name, r.Code, r.Stderr)
		}
	}
	for _, m := range sb.Nodes() {
		n := m.Name
		if out := ssh(t, n, "if [ -e "+mark+" ]; then echo present; fi; ls /var/lib/kubelift/backup 2>/dev/null || true"); out != "" {
			t.Errorf("%s: %q: the forged value ran, or something was backed up", n, out)
		}
	}
	if _, err := os.Stat(mark); err == nil {
		t.Errorf("the forged value ran on the admin machine: %s exists", mark)
	}
}

// With upstream's kubelet bundled, the plan predicts that every running
// container restarts; swapping a node's kubelet by hand (control plane
// first, as the skew policy wants) restarts exactly those containers. The
// hash-skip kubelet with the file written restarts none. apply refuses
// the predicted restarts, and with --allow-restarts makes exactly them.
// This test changes the sandbox: it runs last.
func TestPlanPredictionMatchesASwapByHand(t *testing.T) {
	importBundle(t, upstreamBundle) // the most recently made: now the target
	r, p := plan(t, sb.NewVersion)
	if r.Code != 4 {
		t.Fatalf("exit %d, want 4", r.Code)
	}
	if p.HashSkipKubelet {
		t.Fatal("the plan says upstream's kubelet honours the hash-skip file")
	}
	predicted := map[string]preflight.NodeState{}
	for _, n := range p.Nodes {
		predicted[n.Name] = n
		if n.Role == release.RoleWorker && (n.Containers == 0 || n.Restarts != n.Containers || n.Protected != 0) {
			t.Errorf("%s: %d containers, %d restarts, %d kept; want every one restarted", n.Name, n.Containers, n.Restarts, n.Protected)
		}
		if n.Role == release.RoleWorker && !hasFinding(p, "restarts", preflight.Blocking, "node/"+n.Name, fmt.Sprintf("%d of %d running containers would restart", n.Restarts, n.Containers)) {
			t.Errorf("%s: no blocking restarts finding", n.Name)
		}
	}
	// Stage upstream's binaries beside the hash-skip ones.
	upstreamDir := "/var/lib/kubelift/staged-upstream"
	args, pw := stageArgs("--stage-dir", upstreamDir)
	if r := upgrade(t, pw, args...); r.Code != 0 {
		t.Fatalf("stage: %s", r.Stderr)
	}
	// The control plane first, by hand, from the staged files.
	for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		ssh(t, "cp-1", fmt.Sprintf("cp %[1]s/%[2]s/%[3]s /usr/local/bin/.%[3]s.new && mv -f /usr/local/bin/.%[3]s.new /usr/local/bin/%[3]s && systemctl restart %[3]s",
			upstreamDir, sb.NewVersion, c))
	}
	waitFor(t, "the API server at "+sb.NewVersion, func() bool {
		v, err := client.Discovery().ServerVersion()
		return err == nil && v.GitVersion == sb.NewVersion
	})

	// worker-3 with upstream's kubelet: exactly the predicted containers restart.
	before := running(t, "worker-3")
	swapKubelet(t, "worker-3", upstreamDir)
	waitFor(t, "the predicted containers on worker-3 replaced", func() bool { return gone(before, running(t, "worker-3")) >= predicted["worker-3"].Restarts })
	if n := gone(before, running(t, "worker-3")); n != predicted["worker-3"].Restarts {
		t.Errorf("worker-3: %d containers restarted, the plan predicted %d", n, predicted["worker-3"].Restarts)
	}

	// worker-2 with the hash-skip kubelet and its file: none restarts.
	before = running(t, "worker-2")
	file, err := json.Marshal(hashskip.File{SchemaVersion: hashskip.SchemaVersion, OldKubeletVersion: sb.OldVersion, OldHashEra: hashskip.EraJSONWithoutResources,
		NewKubeletVersion: sb.NewVersion, UpgradedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	ssh(t, "worker-2", fmt.Sprintf(`printf '%%s' '%s' > /var/lib/kubelet/kubelift-hash-skip.json`, file))
	swapKubelet(t, "worker-2", stageDir)
	// A pod with no not-ready toleration (the "api" Deployment's, the
	// intolerant bare pod) is deleted by the taint manager if the
	// restarting kubelet reports NotReady for a moment, as it may under
	// load; apply adds the tolerations first, a swap by hand does not.
	// Such a pod's containers stop, but none of them restarted: only
	// containers of pods still on worker-2 are counted.
	waitFor(t, "the hash-skip kubelet on worker-2 to keep every container", func() bool {
		out := ssh(t, "worker-2", "grep -c 'keeps running' /var/log/units/kubelet.log || true")
		n := 0
		fmt.Sscan(out, &n)
		return n >= len(stillOn(t, "worker-2", before))
	})
	if n := gone(stillOn(t, "worker-2", before), running(t, "worker-2")); n != 0 {
		t.Errorf("worker-2: %d containers restarted under the hash-skip kubelet, the plan predicted 0", n)
	}

	// apply with upstream's kubelet: refused for the predicted restarts;
	// with --allow-restarts, worker-1 (manual mode) restarts exactly the
	// containers the plan predicted.
	reg, pw := registryFlags()
	applyArgs := append(append([]string{"apply", "--to", sb.NewVersion, "--key", filepath.Join(work, "team.pub"), "--settle", "5s", "--restore-labels", "--nodes", "worker-1"}, reg...), sshFlags()...)
	if r := upgrade(t, pw, applyArgs...); r.Code != 4 || !strings.Contains(r.Stderr, "restarts node/worker-1") {
		t.Fatalf("apply without --allow-restarts: exit %d\n%s", r.Code, r.Stderr)
	}
	// The cluster moved since the first plan (worker-3's upstream kubelet
	// refused pods whose nodeSelector no longer matches, and their
	// replacements may land on worker-1): the prediction compared is one
	// made of worker-1 as it is now, with the containers counted by that
	// plan also the ones running when apply starts.
	var fresh preflight.NodeState
	waitFor(t, "a plan of worker-1 that counts the containers running on it", func() bool {
		_, p := plan(t, sb.NewVersion)
		for _, n := range p.Nodes {
			if n.Name == "worker-1" {
				fresh = n
			}
		}
		before = running(t, "worker-1")
		return fresh.Containers == len(before)
	})
	if fresh.Restarts != fresh.Containers || fresh.Restarts == 0 {
		t.Errorf("worker-1: the plan predicts %d of %d containers restart under upstream's kubelet, want all", fresh.Restarts, fresh.Containers)
	}
	// The prober watches worker-1's pods through it: restarted
	// containers are a cost a user sees, and the prober must see it
	// (the contrast to test/stories/apply's zero).
	var targets []prober.Target
	all, err := sb.ProbeTargets(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range all {
		if strings.HasPrefix(tg.Name, "pod ") && strings.HasSuffix(tg.Name, " on worker-1") {
			targets = append(targets, tg)
		}
	}
	if len(targets) == 0 {
		t.Fatalf("no shop pod on worker-1 to probe: %v", all)
	}
	probe, err := prober.Start(context.Background(), prober.Config{Targets: targets, Rate: 10, Streams: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r := upgrade(t, pw, append(applyArgs, "--allow-restarts")...); r.Code != 0 {
		probe.Stop()
		t.Fatalf("apply --allow-restarts: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	waitFor(t, "the predicted containers on worker-1 replaced", func() bool { return gone(before, running(t, "worker-1")) >= fresh.Restarts })
	res := probe.Stop()
	if n := gone(before, running(t, "worker-1")); n != fresh.Restarts {
		t.Errorf("worker-1 under apply --allow-restarts: %d containers restarted, the plan predicted %d", n, fresh.Restarts)
	}
	var table strings.Builder
	_ = res.WriteTable(&table)
	t.Logf("availability of worker-1's pods while upstream's kubelet restarted their containers:\n%s", table.String())
	if !res.Disrupted() {
		t.Errorf("the prober saw no failed request and no broken connection while %d containers restarted: it cannot fail", fresh.Restarts)
	}
}

func running(t *testing.T, node string) map[string]string { return h.Running(t, node) }

// gone counts the containers of before that no longer run.
func gone(before, now map[string]string) int {
	n := 0
	for id := range before {
		if _, ok := now[id]; !ok {
			n++
		}
	}
	return n
}

// stillOn keeps the containers of before (ID -> namespace/pod/name) whose
// pod is still bound to node and not being deleted.
func stillOn(t *testing.T, node string, before map[string]string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for id, what := range before {
		parts := strings.SplitN(what, "/", 3)
		if len(parts) != 3 {
			t.Fatalf("container %s: %q is not namespace/pod/name", id, what)
		}
		p, err := client.CoreV1().Pods(parts[0]).Get(context.Background(), parts[1], metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			t.Logf("%s: pod %s/%s was deleted meanwhile", node, parts[0], parts[1])
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil {
			out[id] = what
		}
	}
	return out
}

// swapKubelet installs the kubelet staged in dir and restarts it, by hand
// over SSH, and waits for the node Ready at the new version.
func swapKubelet(t *testing.T, node, dir string) {
	t.Helper()
	ssh(t, node, fmt.Sprintf("cp %s/%s/kubelet /usr/local/bin/.kubelet.new && mv -f /usr/local/bin/.kubelet.new /usr/local/bin/kubelet && systemctl restart kubelet", dir, sb.NewVersion))
	waitFor(t, node+" Ready at "+sb.NewVersion, func() bool {
		n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		return err == nil && sandbox.NodeReady(n) && n.Status.NodeInfo.KubeletVersion == sb.NewVersion
	})
}

var waitFor = harness.WaitFor
