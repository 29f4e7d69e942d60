package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/report/reporttest"
)

// upgradeOf is a record as a run writes it: a control-plane node through
// a hop, a worker's kubelet steps, what verify counted.
func upgradeOf(t0 time.Time) *record.Upgrade {
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	u := &record.Upgrade{From: "v1.30.14", To: "v1.32.13", Hops: []string{"v1.31.14"}, ControlPlane: "binary", Bundle: "sha256:b0", State: record.StateComplete,
		Started: t0, Updated: at(30000), Plan: &record.Plan{
			Nodes: []record.PlannedNode{{Name: "cp-1", Role: "control-plane", Kubelet: "v1.30.14", Runtime: "containerd://2.3.7", Components: map[string]string{"kube-apiserver": "v1.30.14"}},
				{Name: "worker-1", Role: "worker", Kubelet: "v1.30.14", Runtime: "containerd://2.3.7"}},
			Findings: []record.Finding{{Severity: "blocking", Check: "readmission", Object: "pod/shop/pinned-ssd", Message: "nodeSelector disk=ssd <script>", Resolution: "labels put back before the kubelet (--restore-labels)"}}}}
	u.SetNode("cp-1", "control-plane", record.NodeUpgrading, "kube-apiserver to v1.31.14", nil, at(1000))
	u.SetNode("cp-1", "control-plane", record.NodeUpgrading, "kube-apiserver to v1.32.13", nil, at(4000))
	u.SetNode("cp-1", "control-plane", record.NodePending, "control plane at v1.32.13", nil, at(7000))
	u.SetNode("cp-1", "control-plane", record.NodeUpgrading, record.StepKubelet, nil, at(8000))
	u.Begin("cp-1", "control-plane", "swap", at(8000))
	u.Begin("cp-1", "control-plane", "wait Ready", at(9000))
	u.Node("cp-1", "").Containers = &record.Containers{Before: 5, Kept: 3, Recreated: 2}
	u.SetNode("cp-1", "control-plane", record.NodeDone, "", nil, at(12000))
	u.SetNode("worker-1", "worker", record.NodeUpgrading, record.StepKubelet, nil, at(13000))
	u.Begin("worker-1", "worker", "drain", at(13000))
	u.Begin("worker-1", "worker", "swap", at(14500))
	u.Node("worker-1", "").Containers = &record.Containers{Before: 6, Kept: 5, Restarted: 1}
	u.SetNode("worker-1", "worker", record.NodeDone, "", nil, at(20000))
	return u
}

func relOf(t0 time.Time) *release.Release {
	return &release.Release{Record: &cluster.Available{BundleDigest: "sha256:b0"}, Manifest: &bundle.Manifest{Signer: "sha256:5167", Created: t0.Add(-time.Hour),
		Images: []bundle.Image{{Ref: "registry.k8s.io/pause:3.10", Digest: "sha256:ee6521"}}, Files: []bundle.File{{Path: "bin/linux/amd64/kubelet", SHA256: "6ebf"}}}}
}

func nodesOf() []corev1.Node {
	n := func(name, v string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: v, ContainerRuntimeVersion: "containerd://2.3.7"}}}
	}
	return []corev1.Node{n("cp-1", "v1.32.13"), n("worker-1", "v1.32.13")}
}

// The page parses (its SVG as XML), loads nothing, has a bar per node
// and step at the record's times, the record's restarts per node, the
// phases of the control plane's hops, and escapes what the cluster said.
func TestHTML(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	u := upgradeOf(t0)
	avail := &Availability{Started: t0, Ended: t0.Add(30 * time.Second), Targets: []AvailabilityTarget{{Name: "service shop/api", Requests: 300, Streams: 1, LongestGap: 120 * time.Millisecond}}}
	r := Build(u, nodesOf(), relOf(t0), avail, t0.Add(time.Minute))
	var b bytes.Buffer
	if err := r.HTML(&b); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	got, err := reporttest.Parse(page)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Loads) > 0 {
		t.Errorf("the page loads %v", got.Loads)
	}
	var want []string
	for i := range u.Nodes {
		n := &u.Nodes[i]
		for _, s := range u.Timeline(n) {
			want = append(want, fmt.Sprintf("%s %s %d+%d", n.Name, s.Name, s.Start.Sub(t0).Milliseconds(), s.End.Sub(s.Start).Milliseconds()))
		}
		if r := got.Restarted[n.Name]; r != strconv.Itoa(n.Containers.Restarted) {
			t.Errorf("node %s: %q restarted on the page, the record says %d", n.Name, r, n.Containers.Restarted)
		}
	}
	if strings.Join(got.Bars, "\n") != strings.Join(want, "\n") {
		t.Errorf("bars\n%s\nthe record's timeline\n%s", strings.Join(got.Bars, "\n"), strings.Join(want, "\n"))
	}
	if strings.Join(got.Phases, ",") != "control plane to v1.31.14,control plane to v1.32.13,kubelets to v1.32.13" || got.AvailabilityRows != 1 {
		t.Errorf("phases %v, availability rows %d", got.Phases, got.AvailabilityRows)
	}
	// A page that loads something is caught.
	if bad, err := reporttest.Parse(strings.Replace(page, "<style>", `<link rel="stylesheet" href="https://cdn.example/x.css"><style>`, 1)); err != nil || len(bad.Loads) == 0 {
		t.Errorf("a page with a CDN stylesheet: %v %v", bad, err)
	}
	for _, s := range []string{"sha256:5167", "registry.k8s.io/pause:3.10", "sha256:ee6521", "service shop/api", "labels put back", "nodeSelector disk=ssd &lt;script&gt;",
		"kube-apiserver v1.30.14 → v1.32.13", "11 running before the swaps: 8 kept"} {
		if !strings.Contains(page, s) {
			t.Errorf("the page lacks %q", s)
		}
	}
}

// JSON and Markdown carry the same numbers.
func TestJSONAndMarkdown(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	r := Build(upgradeOf(t0), nodesOf(), relOf(t0), nil, t0)
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(data, &back); err != nil || back.Totals != (record.Containers{Before: 11, Kept: 8, Restarted: 1, Recreated: 2}) || len(back.Nodes[1].Steps) != 2 ||
		back.Nodes[1].Took != 7*time.Second || back.Nodes[0].After.Components["kube-apiserver"] != "v1.32.13" {
		t.Errorf("json %s (%v)", data, err)
	}
	var b bytes.Buffer
	if err := r.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"| worker-1 | worker | upgraded | v1.30.14 → v1.32.13 |", "| 6 | 5 | 1 | 0 |", "**worker-1**: 10:00:13 drain (1.5s); 10:00:14 swap (5.5s)",
		"nodeSelector disk=ssd <script>"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("markdown lacks %q:\n%s", s, b.String())
		}
	}
}

// A prober's result that does not add up is refused, naming the target.
func TestReadAvailability(t *testing.T) {
	if _, err := ReadAvailability("a.json", strings.NewReader(`{"targets":[{"name":"svc","requests":3,"failed":5}]}`)); err == nil || !strings.Contains(err.Error(), `a.json: target "svc"`) {
		t.Errorf("failed > requests: %v", err)
	}
	if _, err := ReadAvailability("a.json", strings.NewReader(`{"targets":`)); err == nil || !strings.Contains(err.Error(), "availability a.json") {
		t.Errorf("truncated: %v", err)
	}
}
