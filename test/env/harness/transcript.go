package harness

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubelift/kubelift/test/env/prober"
)

// transcript is what the upgrade program wrote to standard error under
// one harness, each line with the time it arrived.
type transcript struct {
	mu    sync.Mutex
	lines []timedLine
}

type timedLine struct {
	at   time.Time
	text string
}

// saidBy prefixes what one run of the upgrade program said (args its
// arguments) in the transcript.
func saidBy(args []string) string { return "upgrade " + args[0] + ": " }

// started marks the start of a run of the upgrade program with args.
func (tr *transcript) started(args []string) {
	tr.add(time.Now(), saidBy(args)+"(started: upgrade "+strings.Join(args, " ")+")")
}

// String is the line as a failure's report shows it: its time, then it.
func (l timedLine) String() string { return l.at.Format("15:04:05.000") + " " + l.text }

func (tr *transcript) add(at time.Time, text string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.lines = append(tr.lines, timedLine{at, text})
}

// nearest is, when no line arrived from before ahead of the first of
// times to after the last, the last line before that and the first
// after it: whether a run of the upgrade program was under way (each
// run's start and end are lines of their own).
func (tr *transcript) nearest(times []time.Time, before, after time.Duration) string {
	if len(times) == 0 {
		return ""
	}
	first, last := times[0], times[0]
	for _, at := range times {
		if at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var prev, next *timedLine
	for i := range tr.lines {
		l := &tr.lines[i]
		if l.at.Before(first.Add(-before)) && (prev == nil || !l.at.Before(prev.at)) {
			prev = l
		}
		if l.at.After(last.Add(after)) && (next == nil || l.at.Before(next.at)) {
			next = l
		}
	}
	var b strings.Builder
	b.WriteString("nothing then; the last line before: ")
	if prev == nil {
		b.WriteString("none")
	} else {
		b.WriteString(prev.String())
	}
	b.WriteString("; the next after: ")
	if next == nil {
		b.WriteString("none")
	} else {
		b.WriteString(next.String())
	}
	b.WriteString("\n")
	return b.String()
}

// around is every line that arrived from before ahead of one of times
// to after it, at most max lines (then the number left out).
func (tr *transcript) around(times []time.Time, before, after time.Duration, max int) string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var b strings.Builder
	n := 0
	for _, l := range tr.lines {
		near := false
		for _, at := range times {
			if !l.at.Before(at.Add(-before)) && !l.at.After(at.Add(after)) {
				near = true
				break
			}
		}
		if !near {
			continue
		}
		if n++; n <= max {
			b.WriteString(l.String() + "\n")
		}
	}
	if n > max {
		fmt.Fprintf(&b, "... %d lines more\n", n-max)
	}
	return b.String()
}

// timedLines writes each whole line written to it to the harness's
// transcript and, with t (go test -v), logs it to t with the time until
// stopped (a test may not log once it has ended).
type timedLines struct {
	said    *transcript
	t       *testing.T
	prefix  string
	mu      sync.Mutex
	stopped bool
	buf     []byte
}

func (w *timedLines) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
}

func (w *timedLines) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		now := time.Now()
		w.said.add(now, w.prefix+string(w.buf[:i]))
		if w.t != nil && !w.stopped {
			w.t.Logf("%s %s%s", now.Format("15:04:05.0"), w.prefix, w.buf[:i])
		}
		w.buf = w.buf[i+1:]
	}
}

// NoDisruption judges availability as a user does (judge), and when a
// request failed or a connection broke, logs what the upgrade program
// said from 10 s before each failure to 2 s after it: the step a failure
// came with.
func (h *Harness) NoDisruption(t *testing.T, res *prober.Result) {
	t.Helper()
	judge(t, res)
	if len(res.Failures) == 0 {
		return
	}
	times := make([]time.Time, len(res.Failures))
	for i, f := range res.Failures {
		times[i] = f.At
	}
	said := h.said.around(times, 10*time.Second, 2*time.Second, 200)
	if said == "" {
		said = h.said.nearest(times, 10*time.Second, 2*time.Second)
	}
	t.Logf("what the upgrade program said from 10 s before to 2 s after each failure:\n%s", said)
}
