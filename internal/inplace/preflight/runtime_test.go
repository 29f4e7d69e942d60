package preflight_test

import (
	"strings"
	"testing"

	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/preflight/preflighttest"
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

	rel, err := w.Catalog.Lookup("v1.36.3")
	if err != nil {
		t.Fatal(err)
	}
	r := *rel
	w.Opts.Target.Version, w.Opts.Target.Catalog = r.Parsed(), &r
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
