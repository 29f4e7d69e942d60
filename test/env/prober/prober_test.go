package prober

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// backend is a real HTTP server playing shopd: GET / answers, GET /stream
// writes a line every 10ms. fail503 answers 503 to the requests whose
// numbers (from 1) it holds; breakFirst ends the first stream after
// three lines.
type backend struct {
	served     atomic.Int64
	failed     atomic.Int64
	fail503    map[int64]bool
	breakFirst bool
	streams    atomic.Int64
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/stream" {
		n := b.streams.Add(1)
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "line %d\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			if b.breakFirst && n == 1 && i == 2 {
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close()
				}
				return
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	n := b.served.Add(1)
	if b.fail503[n] {
		b.failed.Add(1)
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "pod-0")
}

// run probes b until it has served min requests (at most 30s), then stops.
func run(t *testing.T, b *backend, min int64) *Result {
	t.Helper()
	srv := httptest.NewServer(b)
	defer srv.Close()
	p, err := Start(context.Background(), Config{Targets: []Target{{Name: "pod a", URL: srv.URL}}, Rate: 50})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3000 && b.served.Load() < min; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	r := p.Stop()
	if b.served.Load() < min {
		t.Fatalf("the backend served %d requests, want %d", b.served.Load(), min)
	}
	return r
}

func TestHealthyBackendNoFailures(t *testing.T) {
	b := &backend{}
	// Served 40 before the stop, at least 30 counted: a request the
	// backend answered as the prober stopped is not the prober's (FC60
	// stopped at exactly 30 served and counted 29).
	r := run(t, b, 40)
	tr := r.Targets[0]
	if r.Disrupted() || tr.Failed != 0 || tr.Broken != 0 {
		t.Fatalf("healthy backend: %+v, failures %v", tr, r.Failures)
	}
	if tr.Requests < 30 || int64(tr.Requests) > b.served.Load() || tr.Streams != 1 {
		t.Errorf("requests %d (backend served %d), streams %d", tr.Requests, b.served.Load(), tr.Streams)
	}
	var sum int
	for _, s := range tr.Seconds {
		sum += s.OK + s.Failed
	}
	if sum != tr.Requests {
		t.Errorf("per-second samples add up to %d, requests %d", sum, tr.Requests)
	}
}

func TestFailedRequestsCounted(t *testing.T) {
	b := &backend{fail503: map[int64]bool{10: true, 11: true, 12: true, 13: true, 14: true}}
	r := run(t, b, 40)
	tr := r.Targets[0]
	if tr.Failed != 5 || int64(tr.Failed) != b.failed.Load() {
		t.Fatalf("failed %d, the backend answered 503 %d times", tr.Failed, b.failed.Load())
	}
	if !r.Disrupted() || len(r.Failures) != 5 || r.Failures[0].Kind != "request" || !strings.Contains(r.Failures[0].Error, "503") {
		t.Errorf("failures %+v", r.Failures)
	}
}

func TestBrokenStreamCountedAndReopened(t *testing.T) {
	b := &backend{breakFirst: true}
	r := run(t, b, 30)
	tr := r.Targets[0]
	if tr.Broken != 1 || tr.Streams < 2 {
		t.Fatalf("broken %d, streams %d: want 1 broken and a new one opened; failures %v", tr.Broken, tr.Streams, r.Failures)
	}
	if len(r.Failures) != 1 || r.Failures[0].Kind != "stream" {
		t.Errorf("failures %+v", r.Failures)
	}
}

func TestUnreachableTargetFails(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there now
	p, err := Start(context.Background(), Config{Targets: []Target{{Name: "gone", URL: url}}, Rate: 50})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3000; i++ {
		p.mu.Lock()
		n := p.targets["gone"].res.Failed
		p.mu.Unlock()
		if n >= 5 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	r := p.Stop()
	if tr := r.Targets[0]; tr.Failed < 5 || tr.Failed != tr.Requests {
		t.Fatalf("unreachable: %+v", tr)
	}
	var out bytes.Buffer
	if err := r.WriteTable(&out); err != nil || !strings.Contains(out.String(), "gone") {
		t.Errorf("table %q, %v", out.String(), err)
	}
}

func TestConfigRefused(t *testing.T) {
	if _, err := Start(context.Background(), Config{}); err == nil {
		t.Error("no targets accepted")
	}
	if _, err := Start(context.Background(), Config{Targets: []Target{{Name: "a", URL: "http://x"}, {Name: "a", URL: "http://y"}}}); err == nil {
		t.Error("a target named twice accepted")
	}
}

// A target's timeout while the prober's host stalled (a control request
// timed out or was slow, the heartbeat came late) is set apart; any other
// failure, or a timeout while the host ran, counts.
func TestStallsSetApart(t *testing.T) {
	at := time.Date(2026, 11, 25, 16, 50, 0, 0, time.UTC)
	timeout := `Get "http://10.96.252.42:80/": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`
	for _, host := range []struct {
		name  string
		stall func(p *Prober)
	}{
		{"a control request timed out", func(p *Prober) { p.recordControl(at, 2*time.Second, errors.New(timeout)) }},
		{"a control request took 1.5s of 2s", func(p *Prober) { p.recordControl(at, 1500*time.Millisecond, nil) }},
		{"the heartbeat came 1.2s late", func(p *Prober) { p.beat(at, at.Add(1200*time.Millisecond)) }},
	} {
		p := &Prober{cfg: Config{Timeout: 2 * time.Second}, targets: map[string]*state{controlName: {}}}
		host.stall(p)
		for _, tc := range []struct {
			f       Failure
			stalled bool
		}{
			{Failure{Kind: "request", At: at.Add(300 * time.Millisecond), Error: timeout}, true},
			{Failure{Kind: "request", At: at.Add(-1500 * time.Millisecond), Error: timeout}, true},
			{Failure{Kind: "stream", At: at.Add(3 * time.Second), Error: "no line for 2s"}, true},
			{Failure{Kind: "request", At: at.Add(300 * time.Millisecond), Error: "dial tcp 10.244.2.2:8080: connect: connection refused"}, false},
			{Failure{Kind: "stream", At: at, Error: "connection ended: unexpected EOF"}, false},
			{Failure{Kind: "request", At: at.Add(10 * time.Second), Error: timeout}, false},
			{Failure{Kind: "request", At: at.Add(-5 * time.Second), Error: timeout}, false},
		} {
			if got := p.stalled(tc.f); got != tc.stalled {
				t.Errorf("%s; %s %q at %+v: stalled %v, want %v", host.name, tc.f.Kind, tc.f.Error, tc.f.At.Sub(at), got, tc.stalled)
			}
		}
	}
	// A host that ran: the control answered at once, the heartbeat on time.
	p := &Prober{cfg: Config{Timeout: 2 * time.Second}, targets: map[string]*state{controlName: {}}}
	p.recordControl(at, 3*time.Millisecond, nil)
	p.beat(at, at.Add(60*time.Millisecond))
	if f := (Failure{Kind: "request", At: at, Error: timeout}); p.stalled(f) {
		t.Errorf("a timeout while the host ran was set apart (stalls %v)", p.stalls)
	}
	if c := p.targets[controlName].res; c.Requests != 1 || c.Failed != 0 {
		t.Errorf("control counted %d requests, %d failed; want 1, 0", c.Requests, c.Failed)
	}
}
