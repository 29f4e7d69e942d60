// Package cli holds what kubelift's two programs share on the command line:
// IO streams, exit codes, progress rendering, JSON output, and the bundle
// commands (verify, extract, inspect) that both offer.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/progress"
)

// Exit codes, documented in the README.
const (
	ExitOK          = 0
	ExitError       = 1
	ExitUsage       = 2
	ExitRejected    = 3 // a bundle failed verification
	ExitBlocked     = 4 // the upgrade plan has blocking findings
	ExitInterrupted = 130
)

// IO holds the streams a command uses: data to Out, status to ErrOut.
type IO struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
	// ErrTTY is true when ErrOut is a terminal (progress bars are drawn).
	ErrTTY bool
}

// System returns the process's streams.
func System() *IO {
	return &IO{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr, ErrTTY: term.IsTerminal(int(os.Stderr.Fd()))}
}

// UsageError marks bad flags or arguments (exit code 2).
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a UsageError.
func Usagef(format string, args ...any) error { return &UsageError{fmt.Errorf(format, args...)} }

// CodeError carries a documented exit code with its error.
type CodeError struct {
	Code int
	Err  error
}

func (e *CodeError) Error() string { return e.Err.Error() }
func (e *CodeError) Unwrap() error { return e.Err }

// ExitCode maps an error to the documented exit code.
func ExitCode(err error) int {
	var ue *UsageError
	var ve *bundle.VerifyError
	var ee *CodeError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ee):
		return ee.Code
	case errors.Is(err, context.Canceled):
		return ExitInterrupted
	case errors.As(err, &ue):
		return ExitUsage
	case errors.As(err, &ve):
		return ExitRejected
	}
	return ExitError
}

// OwnSignals, as a command's annotation (its value says why), keeps Main
// from cancelling that command's context on SIGINT/SIGTERM: it handles
// them itself.
const OwnSignals = "kubelift.dev/own-signals"

// Main runs a root command with a context cancelled by SIGINT/SIGTERM
// (but for a command that handles them itself: OwnSignals) and exits
// with the mapped code.
func Main(newRoot func(*IO) *cobra.Command) {
	streams := System()
	root := newRoot(streams)
	ctx, stop := context.Background(), func() {}
	if c, _, err := root.Find(os.Args[1:]); err != nil || c.Annotations[OwnSignals] == "" {
		ctx, stop = Interrupts(ctx, streams.ErrOut, os.Exit)
	}
	root.SilenceErrors = true
	root.SilenceUsage = true
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &UsageError{err} })
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(streams.ErrOut, "error: %v\n", err)
	}
	os.Exit(ExitCode(err))
}

// Interrupts is the context a command runs in: the first SIGINT or
// SIGTERM cancels it (what is under way stops, and undoes itself: a node
// in flight is rolled back, cordons undone, the record written), saying
// so on errOut; a second one exits at once through exit with
// ExitInterrupted, saying what that leaves. stop ends the handling.
func Interrupts(parent context.Context, errOut io.Writer, exit func(int)) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(errOut, "%s: stopping; what is under way is undone first (a node in flight rolled back, cordons undone, the record written). Interrupt again to exit at once.\n", s)
			cancel(fmt.Errorf("interrupted (%s)", s))
		case <-done:
			return
		}
		select {
		case s := <-sigs:
			fmt.Fprintf(errOut, "%s again: exiting now. A node in flight may be left mid-step (its kubelet swapped, or cordoned): `upgrade status` shows each node's step, and `upgrade apply` again finishes it, or `upgrade rollback` undoes it.\n", s)
			exit(ExitInterrupted)
		case <-done:
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(sigs)
			close(done)
			cancel(nil)
		})
	}
}

// Logger returns a logger for status lines on ErrOut (none when quiet).
func (s *IO) Logger(quiet bool) *slog.Logger {
	if quiet {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(s.ErrOut, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	}))
}

// Progress returns a byte progress bar on ErrOut when it is a terminal and
// not quiet, else a sink that discards. Call finish when the work is done.
func (s *IO) Progress(quiet bool, description string) (sink progress.Sink, finish func()) {
	if quiet || !s.ErrTTY {
		return progress.Nop{}, func() {}
	}
	bar := progressbar.NewOptions64(0,
		progressbar.OptionSetWriter(s.ErrOut),
		progressbar.OptionSetDescription(description),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100_000_000),
		progressbar.OptionClearOnFinish(),
	)
	b := &barSink{bar: bar}
	return b, func() { _ = bar.Finish() }
}

// Counter is a bar of done of total things (nodes) on a terminal's
// stderr, nothing otherwise: set moves it, finish clears it.
func (s *IO) Counter(quiet bool, description string) (set func(done, total int), finish func()) {
	if quiet || !s.ErrTTY {
		return func(int, int) {}, func() {}
	}
	bar := progressbar.NewOptions(0,
		progressbar.OptionSetWriter(s.ErrOut),
		progressbar.OptionSetDescription(description),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionClearOnFinish(),
	)
	return func(done, total int) {
		bar.ChangeMax(total)
		_ = bar.Set(done)
	}, func() { _ = bar.Finish() }
}

type barSink struct{ bar *progressbar.ProgressBar }

func (b *barSink) Expect(n int64) { b.bar.ChangeMax64(b.bar.GetMax64() + n) }
func (b *barSink) Done(n int64)   { _ = b.bar.Add64(n) }

// PrintJSON writes v as indented JSON.
func PrintJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// OutputFlag validates an -o value that selects a format.
func OutputFlag(v string) (json bool, err error) {
	switch v {
	case "", "text", "table":
		return false, nil
	case "json":
		return true, nil
	}
	return false, Usagef("-o %q: want json or text", v)
}

// CacheDirEnv may name kubelift's cache directory.
const CacheDirEnv = "KUBELIFT_CACHE_DIR"

// DefaultCacheDir is $KUBELIFT_CACHE_DIR, else ~/.cache/kubelift: where
// downloads, and files staged to nodes, are kept.
func DefaultCacheDir() string {
	if d := os.Getenv(CacheDirEnv); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "kubelift")
	}
	return filepath.Join(os.TempDir(), "kubelift-cache")
}

// Wrap breaks text into lines of at most width columns, the first
// starting after first columns already used, every other after indent.
func Wrap(text string, first, width int, indent string) string {
	var b strings.Builder
	col := first
	for i, word := range strings.Fields(text) {
		if i > 0 && col+1+len(word) > width {
			b.WriteString("\n" + indent)
			col = len(indent)
		} else if i > 0 {
			b.WriteByte(' ')
			col++
		}
		b.WriteString(word)
		col += len(word)
	}
	return b.String()
}
