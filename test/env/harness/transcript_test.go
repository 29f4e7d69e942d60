package harness

import (
	"strings"
	"testing"
	"time"
)

func TestTranscriptKeepsWholeLinesAroundTheFailures(t *testing.T) {
	var tr transcript
	w := &timedLines{said: &tr, prefix: "upgrade apply: "}
	// A line may arrive in pieces; only whole lines are kept.
	for _, p := range []string{"node worker-1: dra", "in\nnode worker-1: swap\npart"} {
		if _, err := w.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(tr.lines); got != 2 {
		t.Fatalf("%d lines kept, want 2 (the unfinished one waits): %v", got, tr.lines)
	}
	if tr.lines[0].text != "upgrade apply: node worker-1: drain" || tr.lines[1].text != "upgrade apply: node worker-1: swap" {
		t.Errorf("lines: %v", tr.lines)
	}

	base := time.Date(2026, 11, 28, 11, 39, 0, 0, time.UTC)
	tr.lines = nil
	for i, text := range []string{"long before", "10 s before", "at", "2 s after", "3 s after"} {
		tr.add(base.Add(time.Duration([]int{-60, -10, 0, 2, 3}[i])*time.Second), text)
	}
	got := tr.around([]time.Time{base}, 10*time.Second, 2*time.Second, 200)
	for _, want := range []string{"11:38:50.000 10 s before\n", "11:39:00.000 at\n", "11:39:02.000 2 s after\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("around lacks %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"long before", "3 s after"} {
		if strings.Contains(got, not) {
			t.Errorf("around has %q, outside the window:\n%s", not, got)
		}
	}
	if got := tr.around([]time.Time{base}, 10*time.Second, 2*time.Second, 1); !strings.HasSuffix(got, "... 2 lines more\n") {
		t.Errorf("capped at one line: %q", got)
	}

	// Nothing said near a failure: the lines either side say whether a
	// run was under way (a run's start and end are lines too).
	quiet := base.Add(30 * time.Second)
	if got := tr.around([]time.Time{quiet}, 10*time.Second, 2*time.Second, 200); got != "" {
		t.Fatalf("around a quiet time: %q", got)
	}
	got = tr.nearest([]time.Time{quiet, quiet.Add(time.Second)}, 10*time.Second, 2*time.Second)
	if want := "nothing then; the last line before: 11:39:03.000 3 s after; the next after: none\n"; got != want {
		t.Errorf("nearest: %q, want %q", got, want)
	}
	tr.started([]string{"rollback", "--yes"})
	got = tr.nearest([]time.Time{quiet}, 10*time.Second, 2*time.Second)
	if !strings.Contains(got, "the next after: ") || !strings.Contains(got, "upgrade rollback: (started: upgrade rollback --yes)") {
		t.Errorf("nearest after a run started: %q", got)
	}
	if got := tr.nearest([]time.Time{base.Add(-time.Hour)}, 10*time.Second, 2*time.Second); !strings.HasPrefix(got, "nothing then; the last line before: none; the next after: 11:38:00.000 long before") {
		t.Errorf("nearest before every line: %q", got)
	}
}
