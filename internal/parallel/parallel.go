// Package parallel runs a bounded number of jobs at once and stops at the
// first error, the one worker pool shared by kubelift's fetchers and pushers.
package parallel

import (
	"context"
	"sync"
)

// ForEach calls fn(ctx, i) for i in [0, n) with at most jobs calls at once.
// After the first error no new calls start, ctx passed to running calls is
// cancelled, and that first error is returned.
func ForEach(ctx context.Context, jobs, n int, fn func(ctx context.Context, i int) error) error {
	if jobs < 1 {
		jobs = 1
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
		next     = make(chan int)
	)
	for w := 0; w < jobs && w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(ctx, i); err != nil {
					once.Do(func() { firstErr = err; cancel() })
				}
			}
		}()
	}
feed:
	for i := 0; i < n; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}
