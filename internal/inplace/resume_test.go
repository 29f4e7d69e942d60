package inplace

import (
	"context"
	"log/slog"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
)

// A run that resumes one stopped while a control-plane node moved passes
// over the API server and lease health findings (the control plane step
// waits for them); any other run, or any other health finding, is blocked.
func TestResumedControlPlaneHealth(t *testing.T) {
	ctx := context.Background()
	lease := Finding{Severity: Blocking, Check: "health", Object: "lease/kube-system/kube-scheduler", Message: "kube-scheduler holds no live lease"}
	apiserver := Finding{Severity: Blocking, Check: "health", Object: "apiserver/cp-1", Message: "/readyz: connection refused"}
	notReady := Finding{Severity: Blocking, Check: "health", Object: "node/worker-1", Node: "worker-1", Message: "not Ready"}
	for _, tc := range []struct {
		name    string
		state   *UpgradeState
		resumes bool
	}{
		{"no record", nil, false},
		{"control plane upgrading", &UpgradeState{To: "v1.31.4", State: StateUpgradingControlPlane}, true},
		{"a control-plane node upgrading", &UpgradeState{To: "v1.31.4", State: StateFailed, Nodes: []NodeEntry{{Name: "cp-1", Role: RoleControlPlane, Status: NodeUpgrading}}}, true},
		{"a worker upgrading", &UpgradeState{To: "v1.31.4", State: StateUpgradingKubelets, Nodes: []NodeEntry{{Name: "worker-1", Role: RoleWorker, Status: NodeUpgrading}}}, false},
		{"another target", &UpgradeState{To: "v1.31.3", State: StateUpgradingControlPlane}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset()
			if tc.state != nil {
				if err := WriteState(ctx, c, tc.state); err != nil {
					t.Fatal(err)
				}
			}
			in, err := controlPlaneInFlight(ctx, c, "v1.31.4")
			if err != nil || in != tc.resumes {
				t.Fatalf("controlPlaneInFlight = %v, %v; want %v", in, err, tc.resumes)
			}
			r := &applyRun{log: slog.New(slog.DiscardHandler), resumingControlPlane: in}
			for _, f := range []Finding{lease, apiserver} {
				if r.resolves(f) != tc.resumes {
					t.Errorf("%s resolved: %v, want %v", f.Object, !tc.resumes, tc.resumes)
				}
			}
			if r.resolves(notReady) {
				t.Errorf("a node not Ready is passed over")
			}
		})
	}
}
