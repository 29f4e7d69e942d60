package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// Teardown is a test binary's sandbox, taken down once: by the binary
// at its end, or at the first interrupt (SIGINT, as ^C sends to make
// test's whole process group, or SIGTERM). Go's default ends a test
// binary at an interrupt at once, without its TestMain's teardown, and
// the sandbox (init and unit processes in sessions of their own,
// namespaces, mounts, cgroups) outlived the run.
type Teardown struct {
	// Ctx is cancelled at the interrupt: an Up given it stops where it
	// is, and the interrupt takes down what it had made.
	Ctx      context.Context
	dir      string
	log      func(string, ...any)
	remove   []string
	cancel   context.CancelFunc
	sigs     chan os.Signal
	once     sync.Once
	err      error
	released chan struct{}
}

// DownOnInterrupt watches for an interrupt until Down: at the first one
// it cancels Ctx, takes the sandbox in dir down (whatever Up had made of
// it so far) and ends the process with the signal's status (130 for
// SIGINT, 143 for SIGTERM). A second interrupt meanwhile ends the
// process at once. Down also removes the paths remove names (the test's
// temporary directory). Call it before Up, and its Down instead of the
// package's.
func DownOnInterrupt(dir string, log func(string, ...any), remove ...string) *Teardown {
	ctx, cancel := context.WithCancel(context.Background())
	td := &Teardown{Ctx: ctx, dir: dir, log: log, remove: remove, cancel: cancel,
		sigs: make(chan os.Signal, 1), released: make(chan struct{})}
	signal.Notify(td.sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case sig := <-td.sigs:
			signal.Stop(td.sigs) // a second interrupt ends the process at once
			fmt.Fprintf(os.Stderr, "sandbox: %v: taking the sandbox in %s down\n", sig, dir)
			_ = td.Down()
			code := 130
			if sig == syscall.SIGTERM {
				code = 143
			}
			os.Exit(code)
		case <-td.released:
		}
	}()
	return td
}

// Down cancels Ctx, takes the sandbox down and removes the other paths
// (once, whoever asks first; a second caller waits for the first and
// gets its result), then stops watching for an interrupt (one meanwhile
// waits for this Down).
func (td *Teardown) Down() error {
	td.once.Do(func() {
		td.cancel()
		td.err = Down(context.Background(), td.dir, td.log)
		for _, p := range td.remove {
			_ = os.RemoveAll(p)
		}
		signal.Stop(td.sigs)
		close(td.released)
	})
	return td.err
}
