package runbook

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/preflight/preflighttest"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/workloads"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

const forged = "$(touch /tmp/MARK)v1.30.14"

func TestPatchesAreJSON(t *testing.T) {
	p, err := workloads.TolerationsPatch(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"op":"add","path":"/spec/tolerations","value":[]},` +
		`{"op":"add","path":"/spec/tolerations/-","value":{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}},` +
		`{"op":"add","path":"/spec/tolerations/-","value":{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}}]`
	if string(p) != want {
		t.Errorf("patch\n%s\nwant\n%s", p, want)
	}
	if p, _ := workloads.TolerationsPatch([]corev1.Toleration{{Operator: corev1.TolerationOpExists}}); p != nil {
		t.Errorf("a pod tolerating everything got %s", p)
	}
	a, err := record.AnnotationsPatch(map[string]any{record.AnnotationUpgradedTo: `v1"}`, record.AnnotationBundle: nil})
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]map[string]map[string]any
	if err := json.Unmarshal(a, &back); err != nil || back["metadata"]["annotations"][record.AnnotationUpgradedTo] != `v1"}` {
		t.Errorf("annotations patch %s: %v", a, err)
	}
}

// TestPlanBlocksOnForgedValues: a forged kubeletVersion in a Node's
// status and a refused fact are blocking "values" findings naming node,
// field and value; the forged value is not among the versions the plan
// says the cluster runs; apply's preflight never lets them pass, even
// told to ignore the check.
func TestPlanBlocksOnForgedValues(t *testing.T) {
	w := preflighttest.New(t)
	w.View.Nodes[2].Status.NodeInfo.KubeletVersion = forged
	w.View.Facts["worker-1"].Bad = []nodefacts.BadValue{{Node: "worker-1", Field: "kubelet --root-dir", Value: "/x/../y", Reason: "want an absolute, clean path"}}
	p := w.Plan(t)
	if !p.Blocked {
		t.Fatal("not blocked")
	}
	preflighttest.Want(t, preflighttest.Only(p, "values"), preflight.Blocking, "node/worker-2", "status.nodeInfo.kubeletVersion", forged)
	preflighttest.Want(t, preflighttest.Only(p, "values"), preflight.Blocking, "node/worker-1", "kubelet --root-dir", "/x/../y")
	if strings.Join(p.From, ",") != "v1.30.14" {
		t.Errorf("from %v", p.From)
	}
	if p.Findings[0].Check != "values" {
		t.Errorf("values findings are not listed first: %+v", p.Findings[0])
	}
	r := &upgradeRun{opts: ApplyOptions{Ignore: []preflight.Check{preflight.CheckValues}, Nodes: []string{"worker-1"}}, tgts: map[string]nodeaccess.Address{"worker-2": preflighttest.Address("worker-2", release.RoleWorker)}}
	for _, f := range preflighttest.Only(p, "values") {
		if r.resolves(f) {
			t.Errorf("apply would pass %+v", f)
		}
	}
}
