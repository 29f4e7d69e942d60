package nodeaccess

import (
	"context"
	"sync"

	"github.com/kubelift/kubelift/internal/parallel"
)

// ForEach dials each target through c, at most limit at a time, calls fn
// with the connection and closes it. A target that cannot be dialed or
// whose fn fails does not stop the others. It returns the failures by
// target name (empty when all succeeded); each error names its node. When
// ctx is done, targets not yet started fail with ctx's error.
func ForEach(ctx context.Context, c Connector, targets []Address, limit int,
	fn func(ctx context.Context, t Address, n Node) error) map[string]error {
	var mu sync.Mutex
	errs := make(map[string]error)
	started := make([]bool, len(targets))
	// fn never fails the pool, so only ctx stops it.
	_ = parallel.ForEach(ctx, limit, len(targets), func(ctx context.Context, i int) error {
		started[i] = true
		if err := visit(ctx, c, targets[i], fn); err != nil {
			mu.Lock()
			errs[targets[i].Name] = err
			mu.Unlock()
		}
		return nil
	})
	for i, t := range targets {
		if !started[i] {
			errs[t.Name] = &Error{Node: t.Name, Address: t.Addr(), Op: "not started", Err: ctx.Err()}
		}
	}
	return errs
}

func visit(ctx context.Context, c Connector, t Address, fn func(context.Context, Address, Node) error) error {
	n, err := c.Dial(ctx, t)
	if err != nil {
		return err
	}
	defer n.Close()
	return fn(ctx, t, n)
}
