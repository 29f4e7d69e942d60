package main

import (
	"encoding/json"
	"fmt"

	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/inplace/coredns"
	"github.com/kubelift/kubelift/internal/inplace/etcd"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/preflight/preflighttest"
	"github.com/kubelift/kubelift/internal/nodeaccess"
)

// plan's run, on the engine options a test gives it: the plan printed,
// a blocked plan exit 4 with the count of its blocking findings.
func TestPlanRun(t *testing.T) {
	w := preflighttest.New(t)
	target, cat := w.Opts.Target, w.Catalog
	old := preflighttest.Node("worker-1", "worker")
	old.Status.NodeInfo.KubeletVersion = "v1.27.16"
	var out, errOut bytes.Buffer
	opts := &planOptions{IO: &cli.IO{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}, Quiet: true,
		Engine: func(context.Context) (*preflight.PlanOptions, error) {
			return &preflight.PlanOptions{Client: fake.NewClientset(&old), Target: target, Catalog: cat, Connector: unreachable{}}, nil
		}}
	err := planRun(context.Background(), opts)
	var ce *cli.CodeError
	if !errors.As(err, &ce) || ce.Code != cli.ExitBlocked || !strings.Contains(err.Error(), "blocking findings") {
		t.Fatalf("a blocked plan: %v, want exit %d", err, cli.ExitBlocked)
	}
	for _, want := range []string{"Upgrade to v1.31.4", "worker-1", "BLOCKING", "kubelet v1.27.16 is more than 3 minors older", "Workers: at most 1 in flight"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	opts.Output = "json"
	if err := planRun(context.Background(), opts); !errors.As(err, &ce) {
		t.Fatalf("-o json: %v", err)
	}
	var p preflight.Plan
	if err := json.Unmarshal(out.Bytes(), &p); err != nil || !p.Blocked || p.Window.Limit != 1 || len(p.Nodes) != 1 {
		t.Errorf("-o json: %v, %+v", err, p)
	}
	opts.Engine = func(context.Context) (*preflight.PlanOptions, error) { return nil, errors.New("no kubeconfig") }
	if err := planRun(context.Background(), opts); err == nil || err.Error() != "no kubeconfig" {
		t.Errorf("an engine that cannot be built: %v", err)
	}
}

// unreachable is a Connector that reaches no node.
type unreachable struct{}

func (unreachable) Dial(_ context.Context, t nodeaccess.Address) (nodeaccess.Node, error) {
	return nil, fmt.Errorf("%s: connection refused", t.Address)
}

// The plan in words says where CoreDNS moves, and whether its Corefile
// is migrated.
func TestPrintPlanSaysTheCoreDNSMove(t *testing.T) {
	var b bytes.Buffer
	printPlan(&b, &preflight.Plan{To: "v1.31.4", CoreDNS: &coredns.Planned{From: "1.7.1", To: "1.8.0", Image: "reg/coredns:1.8.0",
		MigratesCorefile: true, Notices: []string{`Option "transfer" in plugin "kubernetes" is removed in 1.8.0.`}}}, nil)
	if want := `CoreDNS: 1.7.1 to 1.8.0 (reg/coredns:1.8.0) after the control plane, before the kubelets, every new replica serving before an old one leaves its Services; its Corefile migrated (Option "transfer" in plugin "kubernetes" is removed in 1.8.0.).`; !strings.Contains(b.String(), want) {
		t.Errorf("plan output lacks %q:\n%s", want, b.String())
	}
}

// The plan in words says the etcd move: the versions, the members, and
// when.
func TestPrintPlanSaysTheEtcdMove(t *testing.T) {
	var b bytes.Buffer
	printPlan(&b, &preflight.Plan{To: "v1.31.14", Etcd: &etcd.Planned{From: "v3.5.35", To: "v3.6.16", Nodes: []string{"cp-1", "cp-2", "cp-3"}}}, nil)
	if want := "etcd: v3.5.35 to v3.6.16 on cp-1, cp-2, cp-3 before the control plane, after a snapshot kept off its node: one member at a time, the leader last"; !strings.Contains(b.String(), want) {
		t.Errorf("plan output lacks %q:\n%s", want, b.String())
	}
}
