package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/upgradeapi"
)

// runStatus runs `upgrade status ARGS` against client, as the command
// line would, and returns what it printed.
func runStatus(t *testing.T, client kubernetes.Interface, args ...string) (string, error) {
	t.Helper()
	out := &bytes.Buffer{}
	s := &cli.IO{In: strings.NewReader(""), Out: out, ErrOut: &bytes.Buffer{}}
	cmd := newCmdStatus(s, func(ctx context.Context, o *statusOptions) error {
		o.KubeClient = func() (kubernetes.Interface, error) { return client, nil }
		o.Dynamic = nil // no Upgrade resource
		return statusRun(ctx, o)
	})
	cmd.SetArgs(args)
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestStatus(t *testing.T) {
	ctx := context.Background()
	client := fake.NewSimpleClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-1"}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.31.4"}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.30.14"}}},
	)
	out, err := runStatus(t, client)
	if err != nil || out != "no upgrade has run in this cluster\n" {
		t.Fatalf("no state recorded: %q, %v", out, err)
	}

	st := &record.Upgrade{From: "v1.30.14", To: "v1.31.4", State: record.StateFailed, LastError: "node worker-1: swap kubelet: exit status 1",
		Updated: time.Date(2026, 11, 25, 3, 0, 0, 0, time.UTC), Backup: "cp-1:/var/lib/kubelift/backup/v1.30.14/etcd-snapshot.db"}
	st.Node("cp-1", "control-plane").Status = record.NodeDone
	w := st.Node("worker-1", "worker")
	w.Status, w.Step, w.LastError = record.NodeRolledBack, "kubelet", "exit status 1"
	if err := record.Write(ctx, client, st); err != nil {
		t.Fatal(err)
	}
	out, err = runStatus(t, client)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"upgrade v1.30.14 -> v1.31.4: upgrade-failed",
		"etcd snapshot: cp-1:/var/lib/kubelift/backup/v1.30.14/etcd-snapshot.db",
		"last error: node worker-1: swap kubelet: exit status 1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q:\n%s", want, out)
		}
	}
	// Each node's row carries the version its Node reports now.
	rows := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 4 {
			rows[f[0]] = f
		}
	}
	if r := rows["cp-1"]; len(r) < 4 || r[2] != "upgraded" || r[3] != "v1.31.4" {
		t.Errorf("cp-1's row = %v", r)
	}
	if r := rows["worker-1"]; len(r) < 5 || r[2] != "rolled-back" || r[3] != "v1.30.14" || r[4] != "kubelet" {
		t.Errorf("worker-1's row = %v", r)
	}

	out, err = runStatus(t, client, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got record.Status
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-o json is not JSON: %v\n%s", err, out)
	}
	if got.Upgrade == nil || got.State != record.StateFailed || got.Kubelets["worker-1"] != "v1.30.14" || len(got.Nodes) != 2 {
		t.Errorf("-o json = %+v", got)
	}

	// A run through hops says them, and what the API server runs now.
	st.Hops, st.To = []string{"v1.31.14", "v1.32.13"}, "v1.33.13"
	if err := record.Write(ctx, client, st); err != nil {
		t.Fatal(err)
	}
	client.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: "v1.31.14"}
	out, err = runStatus(t, client)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"the control plane passes through v1.31.14, v1.32.13; kubelets go straight to v1.33.13",
		"API server: v1.31.14",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q:\n%s", want, out)
		}
	}

	if _, err := runStatus(t, client, "-o", "yaml"); err == nil || !strings.Contains(err.Error(), "yaml") {
		t.Errorf("-o yaml: %v, want an error naming it", err)
	}
}

// Where the controller is installed, status lists the Upgrades first.
func TestStatusListsUpgrades(t *testing.T) {
	ctx := context.Background()
	dyn := fakeUpgrades()
	u, err := upgradeapi.Client{Dynamic: dyn}.Create(ctx, &upgradeapi.Upgrade{ObjectMeta: metav1.ObjectMeta{Name: "v1.31.4"}, Spec: upgradeapi.Spec{Version: "v1.31.4"}})
	if err != nil {
		t.Fatal(err)
	}
	u.Status = upgradeapi.Status{Phase: upgradeapi.Running, Progress: "1/4", Current: "worker-1"}
	if _, err := (upgradeapi.Client{Dynamic: dyn}).UpdateStatus(ctx, u); err != nil {
		t.Fatal(err)
	}
	out := &bytes.Buffer{}
	s := &cli.IO{In: strings.NewReader(""), Out: out, ErrOut: &bytes.Buffer{}}
	cmd := newCmdStatus(s, func(ctx context.Context, o *statusOptions) error {
		o.KubeClient = func() (kubernetes.Interface, error) { return fake.NewSimpleClientset(), nil }
		o.Dynamic = func() (dynamic.Interface, error) { return dyn, nil }
		return statusRun(ctx, o)
	})
	cmd.SetArgs(nil)
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "UPGRADE") || strings.Join(strings.Fields(lines[1]), " ") != "v1.31.4 v1.31.4 Running 1/4 worker-1" {
		t.Errorf("status:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "no upgrade has run in this cluster") {
		t.Errorf("status without a record:\n%s", out.String())
	}
}

// status --watch of an upgrade that ended prints its steps and exits
// with its outcome: 0 complete, an error naming the failure otherwise;
// -o json is a JSON object per change, a line each.
func TestStatusWatchOutcome(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	u := &record.Upgrade{From: "v1.30.14", To: "v1.31.14", State: record.StateComplete, Started: t0, Updated: t0.Add(9 * time.Second)}
	u.SetNode("worker-1", "worker", record.NodeUpgrading, record.StepKubelet, nil, t0)
	u.Begin("worker-1", "worker", "drain", t0.Add(time.Second))
	u.Begin("worker-1", "worker", "swap", t0.Add(2*time.Second))
	u.SetNode("worker-1", "worker", record.NodeDone, "", nil, t0.Add(3*time.Second))
	client := fake.NewSimpleClientset()
	if err := record.Write(ctx, client, u); err != nil {
		t.Fatal(err)
	}
	out, err := runStatus(t, client, "--watch")
	want := "10:00:01  worker-1: drain\n10:00:02  worker-1: swap\n10:00:03  worker-1: upgraded\n10:00:09  upgrade v1.30.14 -> v1.31.14: upgrade-complete (1/1 nodes)\n"
	if err != nil || out != want {
		t.Errorf("watch of a complete upgrade: %v\n%s\nwant\n%s", err, out, want)
	}
	out, err = runStatus(t, client, "-w", "-o", "json")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var last struct {
		Kind, State string
		Finished    bool
	}
	if err != nil || len(lines) != 4 || json.Unmarshal([]byte(lines[3]), &last) != nil || last.Kind != "state" || !last.Finished || last.State != record.StateComplete {
		t.Errorf("watch -o json: %v\n%s", err, out)
	}

	u.State, u.LastError = record.StateFailed, "node worker-1: swap: boom"
	u.SetNode("worker-1", "worker", record.NodeFailed, record.StepKubelet, errors.New("node worker-1: swap: boom"), t0.Add(3*time.Second))
	if err := record.Write(ctx, client, u); err != nil {
		t.Fatal(err)
	}
	out, err = runStatus(t, client, "--watch")
	if !errors.Is(err, errUpgradeEnded) || !strings.Contains(err.Error(), "upgrade-failed: node worker-1: swap: boom") || !strings.Contains(out, "worker-1: failed: node worker-1: swap: boom") {
		t.Errorf("watch of a failed upgrade: %v\n%s", err, out)
	}
}
