package coredns

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubelift/kubelift/internal/waiter"
)

// oldPod is an old CoreDNS pod as kubeadm's manifest makes it: its
// metrics on the container port named "metrics".
func oldPod(name string, ports ...corev1.ContainerPort) corev1.Pod {
	if ports == nil {
		ports = []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}, {Name: "metrics", ContainerPort: 9153, Protocol: corev1.ProtocolTCP}}
	}
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "coredns", Ports: ports}}}}
}

// heldFor runs untilQuiet over pods, each of whose count is count(the
// time since the switch) on the fake clock, and returns how long after
// the switch it let them go.
func heldFor(t *testing.T, pods []corev1.Pod, count func(pod string, since time.Duration) (float64, error)) time.Duration {
	t.Helper()
	t0 := time.Date(2026, 12, 3, 1, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	r := Roller{Wait: waiter.Waiter{Clock: clk}, Log: slog.New(slog.DiscardHandler),
		Count: func(_ context.Context, pod *corev1.Pod, port int32) (float64, error) {
			if port != 9153 {
				return 0, errors.New("wrong port")
			}
			return count(pod.Name, clk.Since(t0))
		}}
	done := make(chan error, 1)
	go func() { done <- r.untilQuiet(context.Background(), pods, t0) }()
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return clk.Since(t0)
		default:
		}
		if clk.HasWaiters() {
			clk.Step(time.Second)
		} else {
			time.Sleep(time.Millisecond)
		}
		if clk.Since(t0) > time.Hour {
			t.Fatal("untilQuiet did not return within an hour")
		}
	}
}

// growingUntil counts 3 queries a second until end, then none.
func growingUntil(end time.Duration) func(string, time.Duration) (float64, error) {
	return func(_ string, since time.Duration) (float64, error) {
		return 1000 + 3*min(since, end).Seconds(), nil
	}
}

// Old pods stop once no node can still send them a query: DrainTime after
// the switch where they went quiet in time, StreamTimeout after the last
// late query where a node's stale conntrack entries kept sending them
// some, Hold at the most; DrainTime where their counts cannot be read.
func TestOldPodsStopOnceNoQueryReachesThem(t *testing.T) {
	two := []corev1.Pod{oldPod("coredns-old-a"), oldPod("coredns-old-b")}
	for _, tc := range []struct {
		name     string
		pods     []corev1.Pod
		count    func(string, time.Duration) (float64, error)
		from, to time.Duration // when it may let them go
	}{
		{name: "quiet from the switch", pods: two, count: growingUntil(0), from: DrainTime, to: DrainTime + pollEvery},
		{name: "queries while kube-proxies apply the switch", pods: two, count: growingUntil(Settle - 2*time.Second), from: DrainTime, to: DrainTime + pollEvery},
		{name: "queries a kube-proxy's stale entries send", pods: two, count: growingUntil(100 * time.Second), from: 100*time.Second + StreamTimeout, to: 100*time.Second + StreamTimeout + 2*pollEvery},
		{name: "queries that never stop", pods: two, count: growingUntil(time.Hour), from: Hold, to: Hold + pollEvery},
		{name: "a count that went down (a restarted pod) is a query", pods: two[:1], count: func(_ string, since time.Duration) (float64, error) {
			if since >= 20*time.Second {
				return 1, nil
			}
			return 1000, nil
		}, from: 20*time.Second + StreamTimeout, to: 20*time.Second + StreamTimeout + 2*pollEvery},
		{name: "counts that cannot be read", pods: two, count: func(string, time.Duration) (float64, error) { return 0, errors.New("proxy: 503") }, from: DrainTime, to: DrainTime},
		{name: "no metrics port", pods: []corev1.Pod{oldPod("coredns-old-a", corev1.ContainerPort{Name: "dns", ContainerPort: 53})}, count: growingUntil(time.Hour), from: DrainTime, to: DrainTime},
		{name: "one pod that stops answering hides no query of another", pods: two, count: func(pod string, since time.Duration) (float64, error) {
			if pod == "coredns-old-b" && since > 5*time.Second {
				return 0, errors.New("proxy: 503")
			}
			return growingUntil(100*time.Second)(pod, since)
		}, from: 100*time.Second + StreamTimeout, to: 100*time.Second + StreamTimeout + 2*pollEvery},
		{name: "a read failing later is not a query", pods: two, count: func(_ string, since time.Duration) (float64, error) {
			if since > 20*time.Second && since < 30*time.Second {
				return 0, errors.New("proxy: 503")
			}
			return 7, nil
		}, from: DrainTime, to: DrainTime + pollEvery},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := heldFor(t, tc.pods, tc.count); got < tc.from || got > tc.to {
				t.Errorf("old pods let go %s after the switch, want from %s to %s", got, tc.from, tc.to)
			}
		})
	}
}

func TestParseRequests(t *testing.T) {
	const metrics = `# HELP coredns_dns_requests_total Counter of DNS requests made per zone, protocol and family.
# TYPE coredns_dns_requests_total counter
coredns_dns_requests_total{family="1",proto="udp",server="dns://:53",type="A",view="",zone="."} 4031
coredns_dns_requests_total{family="1",proto="udp",server="dns://:53",type="AAAA",view="",zone="."} 4030
# HELP coredns_cache_entries The number of elements in the cache.
# TYPE coredns_cache_entries gauge
coredns_cache_entries{server="dns://:53",type="denial",view="",zones="."} 12
`
	for _, tc := range []struct {
		name, body string
		want       float64
		err        string
	}{
		{name: "CoreDNS 1.11", body: metrics, want: 8061},
		{name: "before 1.7", body: "coredns_dns_request_count_total{family=\"1\",proto=\"udp\",server=\"dns://:53\",zone=\".\"} 12\n", want: 12},
		{name: "nothing counted yet", body: "# TYPE coredns_cache_entries gauge\ncoredns_cache_entries 0\n", want: 0},
		{name: "TCP queries left out (kube-proxy flushes no TCP connection)", body: "coredns_dns_requests_total{proto=\"tcp\",zone=\".\"} 40\ncoredns_dns_requests_total{proto=\"udp\",zone=\".\"} 2\n", want: 2},
		{name: "not a count", body: "coredns_dns_requests_total{zone=\".\"} -3\n", err: "coredns_dns_requests_total -3: not a count"},
		{name: "not Prometheus text", body: "<html>proxy error</html>\n", err: "not Prometheus text"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseRequests([]byte(tc.body))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || math.Abs(got-tc.want) > 0 {
				t.Fatalf("= %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// The old pods whose counts are read are the running ones: an evicted or
// ended pod of an old template answers nothing, and reading it would
// turn the hold off for the whole roll.
func TestOldPodsAreTheRunningOnes(t *testing.T) {
	pod := func(name, hash string, phase corev1.PodPhase, ip string) *corev1.Pod {
		p := oldPod(name)
		p.Labels = map[string]string{"k8s-app": "kube-dns", "pod-template-hash": hash}
		p.Status = corev1.PodStatus{Phase: phase, PodIP: ip}
		return &p
	}
	c := fake.NewClientset(pod("old-running", "h1", corev1.PodRunning, "10.244.1.5"), pod("old-evicted", "h1", corev1.PodFailed, ""),
		pod("older-done", "h0", corev1.PodSucceeded, "10.244.1.6"), pod("old-pending", "h1", corev1.PodPending, ""), pod("new", "h2", corev1.PodRunning, "10.244.2.5"))
	old, err := Roller{Client: c}.oldPods(context.Background(), deployment("reg/coredns:v1.11.3"), "h2")
	if err != nil {
		t.Fatal(err)
	}
	if len(old) != 1 || old[0].Name != "old-running" {
		t.Errorf("old pods %v, want old-running alone", old)
	}
}
