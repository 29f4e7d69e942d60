package preflight_test

import (
	"strings"
	"testing"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/preflight/preflighttest"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// Each node's container runtime is held to what the target's kubelet
// supports (the catalog's containerRuntimes): containerd 1.7 passes for
// v1.31.4 and blocks v1.36.3, naming the node, the versions v1.36
// supports and the fix; a runtime the catalog lists nothing for is a
// warning; a bundle whose catalog entry says nothing is not checked; a
// value that does not parse is refused, naming node, field and value.
func TestRuntimeSupportedByTheTarget(t *testing.T) {
	w := preflighttest.New(t)
	report := func(node, runtime string) {
		for i := range w.View.Nodes {
			if w.View.Nodes[i].Name == node {
				w.View.Nodes[i].Status.NodeInfo.ContainerRuntimeVersion = runtime
			}
		}
	}
	report("cp-1", "containerd://1.7.22")
	report("worker-2", "containerd://1.7.28~ds1")
	p := w.Plan(t)
	if fs := preflighttest.Only(p, preflight.CheckRuntime); len(fs) != 0 {
		t.Errorf("target v1.31.4: findings %+v (it supports containerd 1.7.20+ and 2.x)", fs)
	}
	for _, n := range p.Nodes {
		if n.Name == "worker-2" && n.Runtime != "containerd v1.7.28" {
			t.Errorf("worker-2's runtime in the plan: %q", n.Runtime)
		}
	}

	r := w.Retarget(t, "v1.36.3")
	p = w.Plan(t)
	fs := preflighttest.Only(p, preflight.CheckRuntime)
	preflighttest.Want(t, fs, preflight.Blocking, "node/cp-1", "the node runs containerd v1.7.22, which kubelet v1.36.3 does not support (it supports containerd v2.3.0+, v2.2.0+)")
	preflighttest.Want(t, fs, preflight.Blocking, "node/worker-2", "containerd v1.7.28, which kubelet v1.36.3 does not support")
	// 2.1 is older than every line v1.36 lists.
	preflighttest.Want(t, fs, preflight.Blocking, "node/worker-1", "containerd v2.1.4, which kubelet v1.36.3 does not support")
	for _, f := range fs {
		if f.Node == "" || !strings.Contains(f.Fix, "move the node to a supported containerd") {
			t.Errorf("finding %+v: want its node and the fix", f)
		}
	}
	if !p.Blocked {
		t.Error("plan not blocked")
	}

	report("worker-1", "cri-o://1.36.1")
	report("cp-1", "containerd://2.3.7")
	fs = preflighttest.Only(w.Plan(t), preflight.CheckRuntime)
	preflighttest.Want(t, fs, preflight.Warning, "node/worker-1", "the catalog lists no versions of cri-o for kubelet v1.36.3")
	if len(fs) != 2 {
		t.Errorf("findings %+v (want worker-1's warning and worker-2's block; cp-1's 2.3.7 is supported)", fs)
	}

	r.ContainerRuntimes = nil
	if fs := preflighttest.Only(w.Plan(t), preflight.CheckRuntime); len(fs) != 0 {
		t.Errorf("a catalog entry without containerRuntimes: findings %+v", fs)
	}

	report("worker-1", "containerd://1.7.22; rm -rf /")
	fs = preflighttest.Only(w.Plan(t), preflight.CheckValues)
	preflighttest.Want(t, fs, preflight.Blocking, "node/worker-1", `status.nodeInfo.containerRuntimeVersion "containerd://1.7.22; rm -rf /" is refused`)
}

// What the runtime says of itself over CRI is checked where it was read:
// a runtime serving another CRI API than v1 blocks, naming the node; a
// status that disagrees with the runtime is a warning, and the runtime's
// own answer is what is held to the target (containerd 1.7 reported by
// the runtime blocks v1.36 though the status says 2.3).
func TestRuntimeAsItSaysOverCRI(t *testing.T) {
	w := preflighttest.New(t)
	cri := func(node, name, version, api string) {
		rt, bad := nodefacts.ParseRuntime(node, name+"://"+version)
		if bad != nil {
			t.Fatal(bad)
		}
		w.View.Facts[node].CRI = &nodefacts.CRI{Runtime: rt, APIVersion: api}
	}
	cri("cp-1", "containerd", "2.1.4", "v1")
	cri("worker-1", "containerd", "2.1.4", "v1alpha2")
	cri("worker-2", "containerd", "1.7.24", "v1")
	fs := preflighttest.Only(w.Plan(t), preflight.CheckRuntime)
	preflighttest.Want(t, fs, preflight.Blocking, "node/worker-1", "the node's runtime (containerd v2.1.4) serves CRI v1alpha2; kubelet v1.31.4 speaks CRI v1 only")
	preflighttest.Want(t, fs, preflight.Warning, "node/worker-2", "the node's status says it runs containerd v2.1.4, the runtime itself says containerd v1.7.24")
	if len(fs) != 2 {
		t.Errorf("findings %+v", fs)
	}

	w.Retarget(t, "v1.36.3")
	for i := range w.View.Nodes {
		w.View.Nodes[i].Status.NodeInfo.ContainerRuntimeVersion = "containerd://2.3.7"
	}
	cri("cp-1", "containerd", "2.3.7", "v1")
	cri("worker-1", "containerd", "2.3.7", "v1")
	fs = preflighttest.Only(w.Plan(t), preflight.CheckRuntime)
	preflighttest.Want(t, fs, preflight.Blocking, "node/worker-2", "the node runs containerd v1.7.24, which kubelet v1.36.3 does not support")
	if len(fs) != 2 {
		t.Errorf("findings %+v (want worker-2's warning and block)", fs)
	}
}

// The cgroup driver the kubelet runs pods under must not change across
// the upgrade: a kubelet from v1.31 takes the runtime's (CRI
// RuntimeConfig) over its configuration's. From v1.30, a node whose
// runtime says systemd while the kubelet is configured (or defaults to)
// cgroupfs blocks; the same node moving v1.31 -> v1.31.4 does not (the
// driver is already the runtime's), nor does a runtime that does not
// answer RuntimeConfig, nor one that agrees with the kubelet. Turned off
// by --feature-gates, the runtime's driver counts from v1.34, where the
// gate is locked on.
func TestCgroupDriverStaysTheSame(t *testing.T) {
	w := preflighttest.New(t)
	set := func(node, runtimes, kubelet string, implemented bool) *nodefacts.Facts {
		f := w.View.Facts[node]
		f.CRI = &nodefacts.CRI{Runtime: nodefacts.Runtime{Name: "containerd", Version: catalog.Version{Major: 2, Minor: 1, Patch: 4}}, APIVersion: "v1", RuntimeConfig: implemented, CgroupDriver: runtimes}
		f.KubeletCgroupDriver, f.KubeletCgroupDriverSource = kubelet, "cgroupDriver (kubelet configuration file)"
		return f
	}
	set("cp-1", "systemd", "", true)
	set("worker-1", "systemd", "systemd", true)
	set("worker-2", "", "cgroupfs", false)
	fs := preflighttest.Only(w.Plan(t), preflight.CheckCgroup)
	preflighttest.Want(t, fs, preflight.Blocking, "node/cp-1", "kubelet v1.30.14 runs the node's pods under the cgroupfs cgroup driver (the kubelet's default); kubelet v1.31.4 would take systemd (the runtime's, over CRI)")
	if len(fs) != 1 || !strings.Contains(fs[0].Fix, "SystemdCgroup") {
		t.Errorf("findings %+v", fs)
	}

	// Already on v1.31: the runtime's driver is the one in use.
	for i := range w.View.Nodes {
		w.View.Nodes[i].Status.NodeInfo.KubeletVersion = "v1.31.3"
	}
	if fs := preflighttest.Only(w.Plan(t), preflight.CheckCgroup); len(fs) != 0 {
		t.Errorf("from v1.31.3: findings %+v", fs)
	}

	// The gate turned off on v1.31 counts until v1.34 locks it on.
	f := set("cp-1", "systemd", "cgroupfs", true)
	f.Values["kubelet --feature-gates"] = "RotateKubeletServerCertificate=true, KubeletCgroupDriverFromCRI=false"
	if fs := preflighttest.Only(w.Plan(t), preflight.CheckCgroup); len(fs) != 0 {
		t.Errorf("gate off, v1.31.3 -> v1.31.4: findings %+v", fs)
	}
	w.Retarget(t, "v1.34.4")
	fs = preflighttest.Only(w.Plan(t), preflight.CheckCgroup)
	preflighttest.Want(t, fs, preflight.Blocking, "node/cp-1", "under the cgroupfs cgroup driver (the kubelet's cgroupDriver (kubelet configuration file)); kubelet v1.34.4 would take systemd")
}

// A bundle that carries a containerd the target supports turns the
// block into what apply will do: the plan names the move per node, and
// a node already at the bundle's containerd gets none; a bundled
// containerd the target does not support leaves the block standing.
func TestRuntimeMovedByTheBundle(t *testing.T) {
	w := preflighttest.New(t)
	for i := range w.View.Nodes {
		if w.View.Nodes[i].Name == "cp-1" {
			w.View.Nodes[i].Status.NodeInfo.ContainerRuntimeVersion = "containerd://1.7.22"
		}
		if w.View.Nodes[i].Name == "worker-2" {
			w.View.Nodes[i].Status.NodeInfo.ContainerRuntimeVersion = "containerd://2.3.7"
		}
	}
	w.Retarget(t, "v1.36.3")
	bundled := func(version string) {
		files := w.Opts.Target.Manifest.Files[:0:0]
		for _, f := range w.Opts.Target.Manifest.Files {
			if f.Name != release.FileContainerd {
				files = append(files, f)
			}
		}
		w.Opts.Target.Manifest.Files = append(files, bundle.File{Name: release.FileContainerd, Version: version, Arch: "amd64", Path: "stack/linux/amd64/containerd", SHA256: strings.Repeat("c", 64)})
	}
	bundled("v2.3.7")
	p := w.Plan(t)
	fs := preflighttest.Only(p, preflight.CheckRuntime)
	preflighttest.Want(t, fs, preflight.Info, "node/cp-1", "the node runs containerd v1.7.22, which kubelet v1.36.3 does not support: apply moves it to containerd v2.3.7 (the bundle's) before its kubelet")
	preflighttest.Want(t, fs, preflight.Info, "node/worker-1", "the node runs containerd v2.1.4, which kubelet v1.36.3 does not support: apply moves it to containerd v2.3.7")
	for _, f := range fs {
		if f.Severity == preflight.Blocking {
			t.Errorf("blocking %+v", f)
		}
	}
	moves := map[string]string{}
	for _, n := range p.Nodes {
		moves[n.Name] = n.RuntimeMove
	}
	if moves["cp-1"] != "containerd v1.7.22 -> v2.3.7" || moves["worker-1"] != "containerd v2.1.4 -> v2.3.7" || moves["worker-2"] != "" {
		t.Errorf("the plan's moves %v", moves)
	}

	bundled("v2.1.9") // older than every line v1.36 supports
	fs = preflighttest.Only(w.Plan(t), preflight.CheckRuntime)
	preflighttest.Want(t, fs, preflight.Blocking, "node/cp-1", "containerd v1.7.22, which kubelet v1.36.3 does not support")
}

// With the node stack in the bundle, the plan says where each node's CNI
// plugins and crictl move (where the runtime takes the plugins from, as
// crictl info said; the defaults where the node did not say), and blocks
// a node whose runtime was asked and did not say; without it, none move.
func TestToolsMovedByTheBundle(t *testing.T) {
	w := preflighttest.New(t)
	w.View.Facts["worker-1"].Containerd = nodefacts.ContainerdPaths{CNIBinDir: "/usr/libexec/cni", Crictl: "/usr/bin/crictl"}
	w.View.Facts["worker-2"].Containerd = nodefacts.ContainerdPaths{CNIErr: "crictl info failed"}
	plan := func() (map[string]string, []preflight.Finding) {
		p := w.Plan(t)
		moves := map[string]string{}
		for _, n := range p.Nodes {
			moves[n.Name] = n.ToolsMove
		}
		return moves, preflighttest.Only(p, preflight.CheckRuntime)
	}
	if moves, _ := plan(); moves["worker-1"] != "" || moves["cp-1"] != "" {
		t.Errorf("without the node stack: moves %v", moves)
	}
	w.Opts.Target.Manifest.Files = append(w.Opts.Target.Manifest.Files,
		bundle.File{Name: release.FileContainerd, Version: "v2.3.7", Arch: "amd64", Path: "stack/linux/amd64/containerd", SHA256: strings.Repeat("c", 64)},
		bundle.File{Name: release.FileCNIPlugins, Arch: "amd64", Path: "bin/linux/amd64/cni-plugins", SHA256: strings.Repeat("d", 64)},
		bundle.File{Name: release.FileCrictl, Arch: "amd64", Path: "bin/linux/amd64/crictl", SHA256: strings.Repeat("e", 64)})
	moves, fs := plan()
	if moves["worker-1"] != "CNI plugins in /usr/libexec/cni, crictl at /usr/bin/crictl" || moves["cp-1"] != "CNI plugins in /opt/cni/bin, crictl at /usr/local/bin/crictl" || moves["worker-2"] != "" {
		t.Errorf("the plan's tools moves %v", moves)
	}
	preflighttest.Want(t, fs, preflight.Blocking, "node/worker-2", "where the node's runtime takes the CNI plugins from was not read (crictl info failed)")
	for _, f := range fs {
		if f.Severity == preflight.Blocking && f.Object != "node/worker-2" {
			t.Errorf("blocking %+v", f)
		}
	}
}
