package resolve

import (
	"testing"

	"github.com/kubelift/kubelift/internal/inplace/preflight"
)

// The record says of each finding how the run dealt with it, as
// Unresolved decides it.
func TestSummary(t *testing.T) {
	p := &preflight.Plan{
		Nodes: []preflight.NodeState{{Name: "cp-1", Role: "control-plane", Kubelet: "v1.30.14", Components: map[string]string{"kube-apiserver": "v1.30.14"}}},
		Findings: []preflight.Finding{
			{Severity: preflight.Blocking, Check: preflight.CheckReadmission, Code: preflight.CodeLabelsMissing, Object: "pod/shop/pinned", Node: "worker-1"},
			{Severity: preflight.Blocking, Check: preflight.CheckRestarts, Object: "pod/shop/web", Node: "worker-2"},
			{Severity: preflight.Blocking, Check: preflight.CheckDisk, Object: "node/worker-3", Node: "worker-3"},
			{Severity: preflight.Blocking, Check: preflight.CheckEviction, Object: "node/worker-4", Node: "worker-4"},
			{Severity: preflight.Warning, Check: preflight.CheckCgroup, Object: "node/worker-1"},
			{Severity: preflight.Info, Check: preflight.CheckCoreDNS, Object: "deployment/coredns"},
		},
	}
	res := Resolution{RestoreLabels: true, Ignore: []preflight.Check{preflight.CheckRestarts}, Selected: func(n string) bool { return n != "worker-3" }}
	s := Summary(p, res)
	want := []string{"labels put back before the kubelet (--restore-labels)", "ignored (--ignore-preflight restarts)", "about a node this run leaves alone",
		"unresolved", "a warning: the run went ahead", "noted"}
	if len(s.Findings) != len(want) {
		t.Fatalf("findings %+v", s.Findings)
	}
	for i, f := range s.Findings {
		if f.Resolution != want[i] {
			t.Errorf("%s %s: %q, want %q", f.Check, f.Object, f.Resolution, want[i])
		}
	}
	if blocking, _ := Unresolved(p, res); len(blocking) != 1 {
		t.Errorf("unresolved %v, want the eviction finding alone", blocking)
	}
	if len(s.Nodes) != 1 || s.Nodes[0].Components["kube-apiserver"] != "v1.30.14" {
		t.Errorf("nodes %+v", s.Nodes)
	}
}
