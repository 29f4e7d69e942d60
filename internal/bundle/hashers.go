package bundle

import (
	"context"
	"crypto/sha256"
	"io"
	"runtime"
	"sync"
)

// hashers checks entries of a bundle file on every core: each entry is read
// in place (ReadAt) and hashed by its own goroutine, at most GOMAXPROCS at
// once, while the tar reader moves on to the next header.
type hashers struct {
	ctx   context.Context
	file  io.ReaderAt
	slots chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	err   error
}

func newHashers(ctx context.Context, file io.ReaderAt) *hashers {
	return &hashers{ctx: ctx, file: file, slots: make(chan struct{}, runtime.GOMAXPROCS(0))}
}

func (h *hashers) failed() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// add starts checking e; it returns an earlier entry's failure, if any.
func (h *hashers) add(e Entry) error {
	select {
	case h.slots <- struct{}{}:
	case <-h.ctx.Done():
		return h.ctx.Err()
	}
	if err := h.failed(); err != nil {
		<-h.slots
		return err
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer func() { <-h.slots }()
		sum := sha256.New()
		n, err := io.CopyBuffer(sum, io.NewSectionReader(h.file, e.Offset, e.Size), make([]byte, 1<<20))
		if err == nil {
			err = checkSum(e, n, sum.Sum(nil))
		} else {
			err = truncated(e.Path, err)
		}
		if err != nil {
			h.mu.Lock()
			if h.err == nil {
				h.err = err
			}
			h.mu.Unlock()
		}
	}()
	return nil
}

// wait returns the first failure once every started entry is checked.
func (h *hashers) wait() error {
	h.wg.Wait()
	return h.failed()
}
