// Package progress is how kubelift's libraries report long transfers
// without printing: they call a Sink, and the command decides whether to
// draw a bar, log, or stay quiet.
package progress

import (
	"io"
)

// Sink receives byte counts. Implementations must be safe for concurrent use.
type Sink interface {
	// Expect adds n bytes to the total work.
	Expect(n int64)
	// Done records n more bytes finished.
	Done(n int64)
}

// Nop discards progress.
type Nop struct{}

// Expect implements Sink.
func (Nop) Expect(int64) {}

// Done implements Sink.
func (Nop) Done(int64) {}

// OrNop returns s, or Nop when s is nil.
func OrNop(s Sink) Sink {
	if s == nil {
		return Nop{}
	}
	return s
}

// Reader reports every byte read from R to Sink.
type Reader struct {
	R    io.Reader
	Sink Sink
}

func (r *Reader) Read(p []byte) (int, error) {
	n, err := r.R.Read(p)
	if n > 0 {
		r.Sink.Done(int64(n))
	}
	return n, err
}
