package coredns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Old CoreDNS pods stop only once no node still sends them queries.
//
// Once a roll's Services select only the new replicas, each node's
// kube-proxy drops the old ones from its rules and flushes the UDP
// conntrack entries that point at them. One that misses the flush (before
// v1.32 it is done once, on the event, and never again:
// kubernetes#126130) leaves them, and a new query whose source port
// matches one goes on to the old pod and keeps the entry alive: 30 s
// while unanswered, 120 s once it was answered more than 2 s after it was
// made (nf_conntrack_udp_timeout_stream, Linux 5.0 on). The old pod
// answers it while it runs; once it stops, each such query is a lookup
// lost. The apply story saw that once: 21 lookups from one node's pod lost
// in the 2 min after the old pods stopped, 40 s after they left their
// Services (docs/development.md).
//
// So a roll reads the old pods' own count of the queries they answered
// (coredns_dns_requests_total, through the API server's proxy to their
// metrics port) and lets them stop once it has stood still long enough
// that no entry can point at them any more: UnrepliedTimeout, or
// StreamTimeout where queries still came later than Settle after the
// switch (entries a kube-proxy did not flush), never before DrainTime
// after the switch and never later than Hold after it. Where the count
// cannot be read (no metrics port, the proxy refused), they stop
// DrainTime after the switch, as without it.
const (
	// UnrepliedTimeout and StreamTimeout are the kernel's defaults for a
	// UDP conntrack entry (nf_conntrack_udp_timeout and _stream).
	UnrepliedTimeout = 30 * time.Second
	StreamTimeout    = 120 * time.Second
	// Settle is how long every kube-proxy may take to apply the switch:
	// queries the old pods answer before then came through rules, not
	// stale entries.
	Settle = 10 * time.Second
	// Hold bounds how long old pods that keep being sent queries are
	// kept answering.
	Hold = 5 * time.Minute
	// pollEvery is how often the counts are read.
	pollEvery = 2 * time.Second
)

// requestMetrics are the names CoreDNS has given its count of queries:
// since 1.7.0, and before.
var requestMetrics = []string{"coredns_dns_requests_total", "coredns_dns_request_count_total"}

// QueryCounter reads how many queries a CoreDNS pod has answered so far.
type QueryCounter func(ctx context.Context, pod *corev1.Pod, port int32) (float64, error)

// proxyCount reads pod's metrics through the API server's pod proxy.
func (r Roller) proxyCount(ctx context.Context, pod *corev1.Pod, port int32) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	body, err := r.Client.CoreV1().Pods(pod.Namespace).ProxyGet("http", pod.Name, strconv.Itoa(int(port)), "metrics", nil).DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("pod %s/%s: metrics on port %d: %w", pod.Namespace, pod.Name, port, err)
	}
	n, err := parseRequests(body)
	if err != nil {
		return 0, fmt.Errorf("pod %s/%s: metrics on port %d: %w", pod.Namespace, pod.Name, port, err)
	}
	return n, nil
}

// parseRequests sums the samples of CoreDNS's count of UDP queries in a
// Prometheus text exposition: 0 where there is none (a counter with
// labels shows once it first counts). A value that is not a finite count
// is refused, naming the metric and the value.
func parseRequests(body []byte) (float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("not Prometheus text: %w", err)
	}
	sum := 0.0
	for _, name := range requestMetrics {
		f := fams[name]
		if f == nil {
			continue
		}
		for _, m := range f.GetMetric() {
			if !udp(m) {
				continue // TCP connections are not kube-proxy's to flush: they go on to the old pod until they close
			}
			v := m.GetCounter().GetValue()
			if m.GetCounter() == nil {
				v = m.GetUntyped().GetValue()
			}
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return 0, fmt.Errorf("%s %v: not a count", name, v)
			}
			sum += v
		}
	}
	return sum, nil
}

// udp says whether a sample counts UDP queries: its proto label says so,
// or it has none.
func udp(m *dto.Metric) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == "proto" {
			return l.GetValue() == "udp"
		}
	}
	return true
}

// metricsPort is the port pod serves CoreDNS's metrics on: the container
// port named "metrics" (kubeadm's manifest), else 9153/TCP.
func metricsPort(pod *corev1.Pod) (int32, bool) {
	var fallback int32
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
				continue
			}
			if p.Name == "metrics" {
				return p.ContainerPort, true
			}
			if p.ContainerPort == 9153 {
				fallback = p.ContainerPort
			}
		}
	}
	return fallback, fallback != 0
}

// oldPods are d's running pods of another template than hash's (an
// evicted or ended one answers nothing, and has no metrics to read).
func (r Roller) oldPods(ctx context.Context, d *appsv1.Deployment, hash string) ([]corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("deployment %s/%s: spec.selector: %w", Namespace, d.Name, err)
	}
	pods, err := r.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("pods of deployment %s/%s: %w", Namespace, d.Name, err)
	}
	var old []corev1.Pod
	for _, p := range pods.Items {
		if p.Labels[appsv1.DefaultDeploymentUniqueLabelKey] != hash && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			old = append(old, p)
		}
	}
	return old, nil
}

// queryCounts are the old pods' counts of queries, as last read.
type queryCounts struct {
	count QueryCounter
	pods  []corev1.Pod
	ports []int32
	last  []float64
}

// countsOf is old's counts, not read yet: an error where a pod has no
// metrics port.
func (r Roller) countsOf(old []corev1.Pod) (*queryCounts, error) {
	q := &queryCounts{count: r.Count, pods: old, ports: make([]int32, len(old)), last: make([]float64, len(old))}
	if q.count == nil {
		q.count = r.proxyCount
	}
	for i := range old {
		port, ok := metricsPort(&old[i])
		if !ok {
			return nil, fmt.Errorf("pod %s/%s has no metrics port", old[i].Namespace, old[i].Name)
		}
		q.ports[i] = port
	}
	return q, nil
}

// read returns how many queries the pods answered since the last read (a
// count that went down, its pod restarted, counts whole). A pod that
// does not answer is read again next time, the others counted meanwhile;
// an error only where none answered.
func (q *queryCounts) read(ctx context.Context) (float64, error) {
	seen := 0.0
	var errs []error
	for i := range q.pods {
		n, err := q.count(ctx, &q.pods[i], q.ports[i])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if n >= q.last[i] {
			seen += n - q.last[i]
		} else {
			seen += n
		}
		q.last[i] = n
	}
	if len(errs) == len(q.pods) {
		return 0, errors.Join(errs...)
	}
	return seen, nil
}

// untilQuiet returns once the old pods may stop (the rule above), the
// switch having been made at switched. It says what it saw in the log:
// why it fell back to DrainTime, or how late queries still came.
func (r Roller) untilQuiet(ctx context.Context, old []corev1.Pod, switched time.Time) error {
	if len(old) == 0 {
		return nil
	}
	drain := r.drainTime()
	counts, err := r.countsOf(old)
	if err == nil {
		_, err = counts.read(ctx)
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.Log.Info("old CoreDNS pods stop after the fixed drain time: their query counts cannot be read", "drain", drain, "why", err)
		return r.Wait.Pause(ctx, drain-r.Wait.Since(switched))
	}
	lastQuery, stale, late := switched, false, 0.0
	for {
		since := r.Wait.Since(switched)
		quiet := UnrepliedTimeout
		if stale {
			quiet = StreamTimeout
		}
		if since >= drain && r.Wait.Since(lastQuery) >= quiet {
			r.Log.Info("old CoreDNS pods stop: no node sends them queries any more", "quietFor", quiet, "held", since.Round(time.Second), "queriesSeenLate", late)
			return nil
		}
		if since >= max(Hold, drain) {
			r.Log.Warn("old CoreDNS pods are still sent queries after they left their Services; they stop now, at the hold's end: a lookup that still goes to one is lost", "hold", Hold, "queriesSeenLate", late)
			return nil
		}
		if err := r.Wait.Pause(ctx, pollEvery); err != nil {
			return err
		}
		seen, err := counts.read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// A read that fails now (the API server busy) is not a
			// query: the next one tells.
			r.Log.Debug("old CoreDNS pods' query counts", "error", err)
			continue
		}
		if seen > 0 {
			lastQuery = r.Wait.Now()
			if r.Wait.Since(switched) > Settle {
				stale = true
				late += seen
			}
		}
	}
}
