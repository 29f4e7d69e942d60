package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe to write from the signal goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The first interrupt cancels the command's context (its undo goes on);
// the second is not swallowed: it exits at once, with 130, saying what
// that leaves.
func TestInterrupts(t *testing.T) {
	var out syncBuffer
	exited := make(chan int, 1)
	ctx, stop := Interrupts(context.Background(), &out, func(code int) { exited <- code })
	defer stop()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("the first interrupt did not cancel the context")
	}
	if cause := context.Cause(ctx); cause == nil || !strings.Contains(cause.Error(), "interrupted") || errors.Is(cause, context.Canceled) {
		t.Errorf("cause %v", cause)
	}
	select {
	case code := <-exited:
		t.Fatalf("exited (%d) on the first interrupt", code)
	default:
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-exited:
		if code != ExitInterrupted {
			t.Errorf("exit %d", code)
		}
	case <-time.After(time.Minute):
		t.Fatal("the second interrupt was swallowed")
	}
	if s := out.String(); !strings.Contains(s, "Interrupt again to exit at once") || !strings.Contains(s, "again: exiting now") || !strings.Contains(s, "upgrade status") {
		t.Errorf("said:\n%s", s)
	}
}

func TestWrap(t *testing.T) {
	got := Wrap("aa bb cc dd", 5, 10, "  ")
	if want := "aa bb\n  cc dd"; got != want {
		t.Errorf("Wrap: %q, want %q", got, want)
	}
	if got := Wrap("averyveryverylongword x", 0, 5, ""); got != "averyveryverylongword\nx" {
		t.Errorf("a word longer than the line: %q", got)
	}
}
