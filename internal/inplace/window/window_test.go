package window_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kubelift/kubelift/internal/inplace/window"
)

// The window plan shows (its waves) and the one apply keeps (its width
// after so many successes) are one description.
func TestWindow(t *testing.T) {
	w := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}
	for _, tc := range []struct {
		max           int
		canary        bool
		waves, widths string
	}{
		{1, false, "1 1 1 1 1 1 1 1 1 1", "1 1 1 1 1 1 1 1 1 1"},
		{4, false, "4 4 2", "4 4 4 4 4 4 4 4 4 4"},
		{4, true, "1 2 4 3", "1 2 4 4 4 4 4 4 4 4"},
		{100, true, "1 2 4 3", "1 2 4 4 8 8 8 8 16 16"},
		{0, false, "1 1 1 1 1 1 1 1 1 1", "1 1 1 1 1 1 1 1 1 1"},
	} {
		win := window.Window{Limit: tc.max, Canary: tc.canary}
		var waves, widths []string
		for _, b := range win.Waves(w) {
			waves = append(waves, strconv.Itoa(len(b)))
		}
		for done := range w {
			widths = append(widths, strconv.Itoa(win.Width(done)))
		}
		if got := strings.Join(waves, " "); got != tc.waves {
			t.Errorf("max %d canary %v: waves %s, want %s", tc.max, tc.canary, got, tc.waves)
		}
		if got := strings.Join(widths, " "); got != tc.widths {
			t.Errorf("max %d canary %v: widths after 0, 1, ... done %s, want %s", tc.max, tc.canary, got, tc.widths)
		}
	}
	for s, want := range map[string]int{"1": 1, "5": 5, "10%": 10, "1%": 1, "50%": 50} {
		if got, err := window.ParseMaxUnavailable(s, 100); err != nil || got != want {
			t.Errorf("%s: %d %v", s, got, err)
		}
	}
	for _, bad := range []string{"0", "-1", "x", "0%", "101%"} {
		if _, err := window.ParseMaxUnavailable(bad, 100); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Run keeps the window: with room for two, a and b run at once (each
// waits until the other has begun, which one at a time never gives),
// never a third beside them, and every node runs once.
func TestRunFillsTheWindow(t *testing.T) {
	var mu sync.Mutex
	var ran []string
	inFlight, most := 0, 0
	begun := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	other := map[string]string{"a": "b", "b": "a"}
	err := window.Window{Limit: 2}.Run(context.Background(), []string{"a", "b", "c", "d", "e"}, nil, func(_ context.Context, n string) error {
		mu.Lock()
		ran = append(ran, n)
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		if o, ok := other[n]; ok {
			close(begun[n])
			<-begun[o]
		}
		mu.Lock()
		inFlight--
		mu.Unlock()
		return nil
	})
	slices.Sort(ran)
	if err != nil || most != 2 || !slices.Equal(ran, []string{"a", "b", "c", "d", "e"}) {
		t.Errorf("Run: %v; at most %d in flight (want 2); ran %v", err, most, ran)
	}
}

// The first failure starts no new node and is what Run returns; between
// runs after each freed slot, before the next node.
func TestRunStopsAtTheFirstFailure(t *testing.T) {
	boom := errors.New("boom")
	var calls []string
	err := window.Window{Limit: 1}.Run(context.Background(), []string{"a", "b", "c"},
		func(context.Context) { calls = append(calls, "soak") },
		func(_ context.Context, n string) error {
			calls = append(calls, n)
			if n == "b" {
				return boom
			}
			return nil
		})
	// (A soak after b's failure may run or not: the loop sees the failure
	// on its next turn or on the freed slot, whichever comes first.)
	if !errors.Is(err, boom) || len(calls) < 3 || !slices.Equal(calls[:3], []string{"a", "soak", "b"}) || slices.Contains(calls, "c") {
		t.Errorf("Run: %v, calls %v; want boom after a, soak, b (c never started)", err, calls)
	}
}
