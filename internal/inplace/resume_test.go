package inplace

import (
	"context"
	"log/slog"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/inplace/release"
)

// A run that resumes one stopped while kubeadm moved a control-plane node
// passes over that node's API server health finding and the leases' (the
// control plane step follows kubeadm and waits for them); any other run,
// or any other health finding, is blocked.
func TestResumedControlPlaneHealth(t *testing.T) {
	ctx := context.Background()
	lease := Finding{Severity: Blocking, Check: "health", Object: "lease/kube-system/kube-scheduler", Message: "kube-scheduler holds no live lease"}
	apiserver := Finding{Severity: Blocking, Check: "health", Object: "apiserver/cp-1", Message: "/readyz: connection refused"}
	otherAPIServer := Finding{Severity: Blocking, Check: "health", Object: "apiserver/cp-2", Message: "/readyz: connection refused"}
	notReady := Finding{Severity: Blocking, Check: "health", Object: "node/worker-1", Node: "worker-1", Message: "not Ready"}
	moving := []NodeEntry{{Name: "cp-1", Role: release.RoleControlPlane, Status: NodeUpgrading}, {Name: "cp-2", Role: release.RoleControlPlane, Status: NodePending}}
	for _, tc := range []struct {
		name    string
		state   *UpgradeState
		resumes bool
	}{
		{"no record", nil, false},
		{"kubeadm moving cp-1", &UpgradeState{To: "v1.31.4", ControlPlane: release.KindKubeadm, State: StateUpgradingControlPlane, Nodes: moving}, true},
		{"kubeadm, between nodes", &UpgradeState{To: "v1.31.4", ControlPlane: release.KindKubeadm, State: StateUpgradingControlPlane}, false},
		{"a binary control plane", &UpgradeState{To: "v1.31.4", ControlPlane: release.KindBinary, State: StateUpgradingControlPlane, Nodes: moving}, false},
		{"a worker upgrading", &UpgradeState{To: "v1.31.4", ControlPlane: release.KindKubeadm, State: StateUpgradingKubelets, Nodes: []NodeEntry{{Name: "worker-1", Role: release.RoleWorker, Status: NodeUpgrading}}}, false},
		{"another target", &UpgradeState{To: "v1.31.3", ControlPlane: release.KindKubeadm, State: StateUpgradingControlPlane, Nodes: moving}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset()
			if tc.state != nil {
				if err := WriteState(ctx, c, tc.state); err != nil {
					t.Fatal(err)
				}
			}
			in, err := controlPlaneInFlight(ctx, c, "v1.31.4")
			if err != nil || (len(in) > 0) != tc.resumes {
				t.Fatalf("controlPlaneInFlight = %v, %v; want resuming %v", in, err, tc.resumes)
			}
			r := &applyRun{log: slog.New(slog.DiscardHandler), resumingControlPlane: in}
			for _, f := range []Finding{lease, apiserver} {
				if r.resolves(f) != tc.resumes {
					t.Errorf("%s resolved: %v, want %v", f.Object, !tc.resumes, tc.resumes)
				}
			}
			for _, f := range []Finding{otherAPIServer, notReady} {
				if r.resolves(f) {
					t.Errorf("%s is passed over: only the moving node's API server is", f.Object)
				}
			}
		})
	}
}
