// Package window is how workers' kubelets move, the one description
// that plan, apply, dry-run and both commands' help share (Window), and
// the loop apply walks the workers with (Run): in the plan's order, at
// most a window of nodes in flight, a slot freed as soon as a node is
// done.
package window

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// Window is how workers' kubelets move, the one description that plan,
// apply and both commands' help share: in the plan's order, at most Limit
// nodes in flight, a slot freed as soon as a node is done (the next node
// starts then, not when its wave ends); with Canary the limit starts at
// 1 and doubles each time as many nodes as it allows have succeeded (1,
// 2, 4 ... up to Limit).
type Window struct {
	Limit  int  `json:"limit"`
	Canary bool `json:"canary"`
}

// Help says what Window does, for --help.
const Help = "workers with at most --max-unavailable in flight, a slot freed as soon as a node is done; --canary starts at 1 and doubles the limit each time as many nodes have succeeded (1, 2, 4 ...)"

// New reads maxUnavailable (N or P% of workers) and canary.
func New(maxUnavailable string, canary bool, workers int) (Window, error) {
	limit, err := ParseMaxUnavailable(maxUnavailable, workers)
	if err != nil {
		return Window{}, err
	}
	return Window{Limit: limit, Canary: canary}, nil
}

// Width is how many nodes may be in flight once done have succeeded.
func (w Window) Width(done int) int {
	limit := max(w.Limit, 1)
	if !w.Canary {
		return limit
	}
	width := 1
	for width <= done && width < limit {
		width *= 2
	}
	return min(width, limit)
}

// Waves are the workers that start together when every node takes as
// long: what plan shows of the window. (A node that takes longer holds
// only its own slot.)
func (w Window) Waves(workers []string) [][]string {
	var out [][]string
	for done := 0; done < len(workers); {
		n := min(w.Width(done), len(workers)-done)
		out = append(out, workers[done:done+n])
		done += n
	}
	return out
}

// ParseMaxUnavailable reads N or P% of total nodes (rounded down, at
// least 1).
func ParseMaxUnavailable(s string, total int) (int, error) {
	if s == "" {
		return 1, nil
	}
	if p, ok := strings.CutSuffix(s, "%"); ok {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 || n > 100 {
			return 0, fmt.Errorf("--max-unavailable %q: want N or a percentage from 1%% to 100%%", s)
		}
		return max(1, total*n/100), nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("--max-unavailable %q: want a positive number N or P%%", s)
	}
	return n, nil
}

// Run calls do for each of nodes as w says: at most w.Width(done) in
// flight, a slot freed as soon as a node is done, between (when set)
// called after each freed slot before the next node starts (--soak). The
// first failure starts no new node; those in flight finish, and Run
// returns that failure. A cancelled ctx starts no new node either; Run
// waits for those in flight and returns the first failure, else ctx's
// error.
func (w Window) Run(ctx context.Context, nodes []string, between func(context.Context), do func(ctx context.Context, node string) error) error {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		inFlight int
		done     int
		firstErr error
		freed    = make(chan struct{}, len(nodes))
	)
	for i := 0; i < len(nodes); {
		mu.Lock()
		stop := firstErr != nil
		if !stop && inFlight < w.Width(done) {
			n := nodes[i]
			i++
			inFlight++
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := do(ctx, n)
				mu.Lock()
				inFlight--
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					done++
				}
				mu.Unlock()
				freed <- struct{}{}
			}()
			continue
		}
		mu.Unlock()
		if stop {
			break
		}
		select {
		case <-freed:
			if between != nil {
				between(ctx) // a cancel is seen below
			}
		case <-ctx.Done():
			// No new node; those in flight end (undoing themselves), and
			// their errors say more than the cancel does.
			wg.Wait()
			if firstErr == nil {
				firstErr = ctx.Err()
			}
			return firstErr
		}
	}
	wg.Wait()
	return firstErr
}
