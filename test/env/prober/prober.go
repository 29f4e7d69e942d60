// Package prober measures availability as a user judges it while a
// cluster is upgraded: requests keep being answered, and connections held
// open stay open. Against each target (a Service's ClusterIP, each backing
// pod's IP) it sends at least Rate requests a second and holds Streams
// long-lived connections (GET /stream, a line every 100ms), dialing from
// wherever Dial dials (a node's network namespace in the sandbox; any
// host inside a user's cluster network). It records every failed request
// and every broken connection with its time, and per-second samples per
// target, after OpenShift's disruption monitor; kubelift's allowance is
// zero.
//
// Beside the targets it watches its own host: it probes a control, an
// HTTP server of its own on loopback outside every cluster, and a
// heartbeat ticks in its own process. A target's request or stream that
// timed out while the host stalled says nothing about the cluster, and is
// set apart as Stalled, not counted as a failure. The host stalled when a
// control request timed out or took half the timeout, or when the
// heartbeat missed half the timeout (seen on a 2-core machine running two
// sandboxes while Kubernetes builds: a prober frozen for 2 s times out
// the requests of a moment, one per target, while the control had none
// in that moment). Any other failure (refused, reset, ended, an HTTP
// error, or a timeout while the host ran) counts.
package prober

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Target is one address to probe.
type Target struct {
	// Name says what it is ("service shop/api", "pod shop/api-7d9c-x2").
	Name string
	// URL is the base URL; requests go to URL + "/", streams to
	// URL + "/stream".
	URL string
	// Dial dials this target (default: Config.Dial): a Service's
	// ClusterIP is reached through the kube-proxy of the node it is
	// dialed from.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Config says what to probe and how.
type Config struct {
	Targets []Target
	// Rate is requests per second per target (default 10).
	Rate int
	// Streams is long-lived connections held per target (default 1).
	Streams int
	// Timeout bounds one request, and a stream's wait for its next line
	// (default 2s).
	Timeout time.Duration
	// Dial dials the targets (default: net.Dialer).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Failure is one failed request or broken connection.
type Failure struct {
	Target string    `json:"target"`
	At     time.Time `json:"at"`
	// Kind is "request" or "stream".
	Kind  string `json:"kind"`
	Error string `json:"error"`
}

// Second is one second of one target: requests answered and failed.
type Second struct {
	At     time.Time `json:"at"`
	OK     int       `json:"ok"`
	Failed int       `json:"failed"`
}

// TargetResult is what one target did over the run.
type TargetResult struct {
	Name     string `json:"name"`
	Requests int    `json:"requests"`
	Failed   int    `json:"failed"`
	// Streams counts connections opened, Broken those that ended before
	// the run did.
	Streams int `json:"streams"`
	Broken  int `json:"broken"`
	// LongestGap is the longest time without a successful answer
	// (requests) while the run lasted.
	LongestGap time.Duration `json:"longestGap"`
	Seconds    []Second      `json:"seconds"`
}

// Result is the whole run.
type Result struct {
	Started  time.Time      `json:"started"`
	Ended    time.Time      `json:"ended"`
	Targets  []TargetResult `json:"targets"`
	Failures []Failure      `json:"failures"`
	// Stalled are targets' timeouts set apart because the prober's host
	// stalled at the same time; Control is the control's own requests and
	// timeouts.
	Stalled []Failure    `json:"stalled,omitempty"`
	Control TargetResult `json:"control"`
	// SlowestControl is the control's slowest answer (a failed request
	// counts as the timeout), LatestBeat the longest time between two of
	// the heartbeat's ticks (due every 50ms): how far the prober's own
	// host stalled.
	SlowestControl time.Duration `json:"slowestControl"`
	LatestBeat     time.Duration `json:"latestBeat"`
}

// Disrupted says whether any request failed or any connection broke.
func (r *Result) Disrupted() bool { return len(r.Failures) > 0 }

// Prober runs until Stop; Start begins it.
type Prober struct {
	cfg    Config
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	started time.Time
	targets map[string]*state
	fails   []Failure
	// control is the loopback server every run probes beside the
	// targets; stalls are when the host stalled: a control request that
	// failed or was slow, a heartbeat that came late.
	control *http.Server
	stalls  []span
	// slowestControl and latestBeat are Result's.
	slowestControl, latestBeat time.Duration
}

// span is a stretch of time, from and to included.
type span struct{ from, to time.Time }

func (s span) overlaps(o span) bool { return !s.from.After(o.to) && !o.from.After(s.to) }

// controlName names the control target in the prober's own records.
const controlName = "control (the prober's own loopback server)"

type state struct {
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	client  *http.Client
	res     TargetResult
	lastOK  time.Time
	seconds map[int64]*Second
}

// Start begins probing every target; it returns at once.
func Start(ctx context.Context, cfg Config) (*Prober, error) {
	if len(cfg.Targets) == 0 {
		return nil, errors.New("prober: no targets")
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 10
	}
	if cfg.Streams < 0 {
		return nil, fmt.Errorf("prober: streams %d", cfg.Streams)
	}
	if cfg.Streams == 0 {
		cfg.Streams = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Prober{cfg: cfg, cancel: cancel, started: time.Now(), targets: map[string]*state{}}
	for _, t := range cfg.Targets {
		if _, dup := p.targets[t.Name]; dup {
			cancel()
			return nil, fmt.Errorf("prober: target %q named twice", t.Name)
		}
		dial := t.Dial
		if dial == nil {
			dial = cfg.Dial
		}
		p.targets[t.Name] = &state{res: TargetResult{Name: t.Name}, lastOK: p.started, seconds: map[int64]*Second{}, dial: dial,
			// A connection per request: a kept-alive connection would hide
			// a backend that no longer accepts new ones.
			client: &http.Client{Timeout: cfg.Timeout, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		return nil, fmt.Errorf("prober: control server: %w", err)
	}
	p.control = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "control\n") }),
		ReadHeaderTimeout: cfg.Timeout}
	go func() { _ = p.control.Serve(ln) }()
	control := Target{Name: controlName, URL: "http://" + ln.Addr().String()}
	p.targets[control.Name] = &state{res: TargetResult{Name: control.Name}, lastOK: p.started, seconds: map[int64]*Second{},
		client: &http.Client{Timeout: cfg.Timeout, Transport: &http.Transport{DisableKeepAlives: true}}}
	p.wg.Add(2)
	go func() { defer p.wg.Done(); p.requests(ctx, control) }()
	go func() { defer p.wg.Done(); p.heartbeat(ctx) }()
	for _, t := range cfg.Targets {
		t := t
		p.wg.Add(1 + cfg.Streams)
		go func() { defer p.wg.Done(); p.requests(ctx, t) }()
		for i := 0; i < cfg.Streams; i++ {
			go func() { defer p.wg.Done(); p.stream(ctx, t) }()
		}
	}
	return p, nil
}

// Stop ends the run, waits for every request and connection to end and
// returns the result.
func (p *Prober) Stop() *Result {
	p.cancel()
	p.wg.Wait()
	_ = p.control.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	end := time.Now()
	r := &Result{Started: p.started, Ended: end, Control: p.targets[controlName].res, SlowestControl: p.slowestControl, LatestBeat: p.latestBeat}
	for _, f := range p.fails {
		if p.stalled(f) {
			r.Stalled = append(r.Stalled, f)
		} else {
			r.Failures = append(r.Failures, f)
		}
	}
	for _, t := range p.cfg.Targets {
		s := p.targets[t.Name]
		tr := s.res
		if gap := end.Sub(s.lastOK); gap > tr.LongestGap {
			tr.LongestGap = gap
		}
		for _, sec := range s.seconds {
			tr.Seconds = append(tr.Seconds, *sec)
		}
		sort.Slice(tr.Seconds, func(i, j int) bool { return tr.Seconds[i].At.Before(tr.Seconds[j].At) })
		r.Targets = append(r.Targets, tr)
	}
	sort.Slice(r.Failures, func(i, j int) bool { return r.Failures[i].At.Before(r.Failures[j].At) })
	return r
}

// requests sends Rate requests a second to t until ctx ends; a request
// still running when ctx ends is not counted.
func (p *Prober) requests(ctx context.Context, t Target) {
	tick := time.NewTicker(time.Second / time.Duration(p.cfg.Rate))
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := time.Now()
			err := p.get(ctx, p.targets[t.Name].client, t.URL+"/")
			if ctx.Err() != nil {
				return
			}
			if t.Name == controlName {
				p.recordControl(at, time.Since(at), err)
				return
			}
			p.record(t.Name, at, "request", err)
		}()
	}
}

func (p *Prober) get(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

// stream holds GET /stream open until ctx ends; a connection that ends or
// falls silent for Timeout before then is broken, and a new one is opened.
func (p *Prober) stream(ctx context.Context, t Target) {
	client := &http.Client{Transport: &http.Transport{DialContext: p.targets[t.Name].dial, DisableKeepAlives: true}}
	for ctx.Err() == nil {
		p.mu.Lock()
		p.targets[t.Name].res.Streams++
		p.mu.Unlock()
		at, err := p.holdStream(ctx, client, t.URL+"/stream")
		if ctx.Err() != nil {
			return
		}
		p.record(t.Name, at, "stream", err)
		select { // not a busy loop against a backend that refuses
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// holdStream reads lines until the connection ends; it returns when and
// why it did.
func (p *Prober) holdStream(ctx context.Context, client *http.Client, url string) (time.Time, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(sctx, http.MethodGet, url, nil)
	if err != nil {
		return time.Now(), err
	}
	resp, err := client.Do(req)
	if err != nil {
		return time.Now(), err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return time.Now(), fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	lines := make(chan error, 1)
	sc := bufio.NewScanner(resp.Body)
	go func() {
		for sc.Scan() {
			lines <- nil
		}
		err := sc.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		lines <- err
	}()
	silence := time.NewTimer(p.cfg.Timeout)
	defer silence.Stop()
	for {
		select {
		case <-ctx.Done():
			cancel()
			return time.Now(), nil
		case err := <-lines:
			if err != nil {
				return time.Now(), fmt.Errorf("connection ended: %w", err)
			}
			if !silence.Stop() {
				<-silence.C
			}
			silence.Reset(p.cfg.Timeout)
		case <-silence.C:
			cancel()
			return time.Now(), fmt.Errorf("no line for %s", p.cfg.Timeout)
		}
	}
}

func (p *Prober) record(target string, at time.Time, kind string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.targets[target]
	if kind == "stream" {
		s.res.Broken++
		p.fails = append(p.fails, Failure{Target: target, At: at, Kind: kind, Error: err.Error()})
		return
	}
	sec := at.Truncate(time.Second)
	bucket := s.seconds[sec.Unix()]
	if bucket == nil {
		bucket = &Second{At: sec}
		s.seconds[sec.Unix()] = bucket
	}
	s.res.Requests++
	if err != nil {
		s.res.Failed++
		bucket.Failed++
		p.fails = append(p.fails, Failure{Target: target, At: at, Kind: kind, Error: err.Error()})
		return
	}
	bucket.OK++
	if at.After(s.lastOK) {
		if gap := at.Sub(s.lastOK); gap > s.res.LongestGap {
			s.res.LongestGap = gap
		}
		s.lastOK = at
	}
}

// recordControl counts a control request that began at at and took
// took; one that failed, or took half the timeout, is a stall of the host.
func (p *Prober) recordControl(at time.Time, took time.Duration, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := &p.targets[controlName].res
	c.Requests++
	if err != nil {
		c.Failed++
		took = max(took, p.cfg.Timeout)
	}
	p.slowestControl = max(p.slowestControl, took)
	if err != nil || took >= p.cfg.Timeout/2 {
		p.stalls = append(p.stalls, span{at, at.Add(took)})
	}
}

// heartbeat ticks every 50ms until ctx ends; a tick that comes half the
// timeout late is a stall of the prober's process (starved of CPU, or
// stopped), from the tick before to it.
func (p *Prober) heartbeat(ctx context.Context) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			now := time.Now() // the tick's own time is when it was due
			p.beat(last, now)
			last = now
		}
	}
}

// beat records a stall if the heartbeat after last came half the timeout
// late, at now.
func (p *Prober) beat(last, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latestBeat = max(p.latestBeat, now.Sub(last))
	if now.Sub(last) < p.cfg.Timeout/2 {
		return
	}
	p.stalls = append(p.stalls, span{last, now})
}

// stalled: f is a timeout while the host stalled (a stall overlapping
// the request's wait, from its start to its deadline; or the stream's
// silence, which ended at f.At).
func (p *Prober) stalled(f Failure) bool {
	if !strings.Contains(f.Error, "Client.Timeout") && !strings.Contains(f.Error, "deadline exceeded") && !strings.HasPrefix(f.Error, "no line for") {
		return false
	}
	wait := span{f.At, f.At.Add(p.cfg.Timeout)}
	if f.Kind == "stream" {
		wait = span{f.At.Add(-p.cfg.Timeout), f.At}
	}
	for _, s := range p.stalls {
		if s.overlaps(wait) {
			return true
		}
	}
	return false
}

// WriteTable prints one row per target: requests, failed, connections
// held and broken, the longest time without an answer.
func (r *Result) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tREQUESTS\tFAILED\tCONNECTIONS\tBROKEN\tLONGEST GAP")
	for _, t := range r.Targets {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", t.Name, t.Requests, t.Failed, t.Streams, t.Broken, t.LongestGap.Round(time.Millisecond))
	}
	fmt.Fprintf(tw, "%s\t%d\t%d\t-\t-\t-\n", r.Control.Name, r.Control.Requests, r.Control.Failed)
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "the prober's host: its control's slowest answer %s, its heartbeat's longest wait %s (due every 50ms)\n",
		r.SlowestControl.Round(time.Millisecond), r.LatestBeat.Round(time.Millisecond)); err != nil {
		return err
	}
	if len(r.Stalled) > 0 {
		_, err := fmt.Fprintf(w, "%d timeouts set apart: the prober's host stalled at the same time (its control on loopback or its heartbeat was late), not the cluster\n", len(r.Stalled))
		return err
	}
	return nil
}
