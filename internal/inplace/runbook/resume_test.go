package runbook

import (
	"context"
	"log/slog"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/resolve"
	"github.com/kubelift/kubelift/internal/nodeaccess"
)

// A run that resumes one stopped while kubeadm moved a control-plane node
// passes over that node's API server health finding and the leases' (the
// control plane step follows kubeadm and waits for them); any other run,
// or any other health finding, is blocked.
func TestResumedControlPlaneHealth(t *testing.T) {
	ctx := context.Background()
	lease := preflight.Finding{Severity: preflight.Blocking, Check: "health", Object: "lease/kube-system/kube-scheduler", Message: "kube-scheduler holds no live lease"}
	apiserver := preflight.Finding{Severity: preflight.Blocking, Check: "health", Object: "apiserver/cp-1", Message: "/readyz: connection refused"}
	otherAPIServer := preflight.Finding{Severity: preflight.Blocking, Check: "health", Object: "apiserver/cp-2", Message: "/readyz: connection refused"}
	notReady := preflight.Finding{Severity: preflight.Blocking, Check: "health", Object: "node/worker-1", Node: "worker-1", Message: "not Ready"}
	moving := []record.Node{{Name: "cp-1", Role: release.RoleControlPlane, Status: record.NodeUpgrading}, {Name: "cp-2", Role: release.RoleControlPlane, Status: record.NodePending}}
	for _, tc := range []struct {
		name    string
		state   *record.Upgrade
		resumes bool
	}{
		{"no record", nil, false},
		{"kubeadm moving cp-1", &record.Upgrade{To: "v1.31.4", ControlPlane: release.KindKubeadm, State: record.StateUpgradingControlPlane, Nodes: moving}, true},
		{"kubeadm, between nodes", &record.Upgrade{To: "v1.31.4", ControlPlane: release.KindKubeadm, State: record.StateUpgradingControlPlane}, false},
		{"a binary control plane", &record.Upgrade{To: "v1.31.4", ControlPlane: release.KindBinary, State: record.StateUpgradingControlPlane, Nodes: moving}, false},
		{"a worker upgrading", &record.Upgrade{To: "v1.31.4", ControlPlane: release.KindKubeadm, State: record.StateUpgradingKubelets, Nodes: []record.Node{{Name: "worker-1", Role: release.RoleWorker, Status: record.NodeUpgrading}}}, false},
		{"another target", &record.Upgrade{To: "v1.31.3", ControlPlane: release.KindKubeadm, State: record.StateUpgradingControlPlane, Nodes: moving}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset()
			if tc.state != nil {
				if err := record.Write(ctx, c, tc.state); err != nil {
					t.Fatal(err)
				}
			}
			st, err := record.Read(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			if in := st.ControlPlaneInFlight("v1.31.4"); (len(in) > 0) != tc.resumes {
				t.Fatalf("ControlPlaneInFlight = %v; want resuming %v", in, tc.resumes)
			}
			in := st.ControlPlaneInFlight("v1.31.4")
			r := &upgradeRun{log: slog.New(slog.DiscardHandler), resumingControlPlane: in}
			for _, f := range []preflight.Finding{lease, apiserver} {
				if r.resolves(f) != tc.resumes {
					t.Errorf("%s resolved: %v, want %v", f.Object, !tc.resumes, tc.resumes)
				}
			}
			for _, f := range []preflight.Finding{otherAPIServer, notReady} {
				if r.resolves(f) {
					t.Errorf("%s is passed over: only the moving node's API server is", f.Object)
				}
			}
		})
	}
}

// --restore-labels resolves a readmission finding by its code (labels
// its node lacks, which it puts back), never one of another kind.
func TestRestoreLabelsResolvesByCode(t *testing.T) {
	r := &upgradeRun{opts: ApplyOptions{RestoreLabels: true}, tgts: map[string]nodeaccess.Address{"worker-1": {Name: "worker-1", Role: release.RoleWorker, Address: "10.0.0.1"}}}
	missing := preflight.Finding{Severity: preflight.Blocking, Check: preflight.CheckReadmission, Code: preflight.CodeLabelsMissing, Object: "pod/shop/pinned", Node: "worker-1",
		Message: "the restarted kubelet would reject it (reason NodeAffinity, the pod fails): node worker-1 lacks the label zone=a its nodeSelector requires"}
	affinity := preflight.Finding{Severity: preflight.Blocking, Check: preflight.CheckReadmission, Object: "pod/shop/affine", Node: "worker-1",
		Message: "the restarted kubelet would reject it (reason NodeAffinity, the pod fails): its required node affinity no longer matches node worker-1's labels"}
	if !r.resolves(missing) {
		t.Error("--restore-labels does not resolve the labels it puts back")
	}
	if r.resolves(affinity) {
		t.Error("--restore-labels resolves a node affinity it cannot mend")
	}
	r.opts.RestoreLabels = false
	if r.resolves(missing) {
		t.Error("without --restore-labels, a missing label is resolved")
	}
}

// resolves: an apply with r's options passes the blocking finding f
// (resolve.Unresolved, as planStep asks it).
func (r *upgradeRun) resolves(f preflight.Finding) bool {
	p := &preflight.Plan{Findings: []preflight.Finding{f}}
	blocking, _ := resolve.Unresolved(p, resolve.Resolution{Ignore: r.opts.Ignore, Drain: r.opts.Drain, RestoreLabels: r.opts.RestoreLabels,
		ResumingControlPlane: r.resumingControlPlane, Selected: r.selected})
	return len(blocking) == 0
}
