// Package iocount counts the bytes read through a reader, safely while
// another goroutine reads (an SSH session copies stdin in a goroutine of
// its own that may still run when the call returns).
package iocount

import (
	"io"
	"sync/atomic"
)

// Reader counts what is read from R.
type Reader struct {
	R io.Reader
	n atomic.Int64
}

// NewReader counts what is read from r.
func NewReader(r io.Reader) *Reader { return &Reader{R: r} }

// Read reads from R and counts it.
func (c *Reader) Read(p []byte) (int, error) {
	n, err := c.R.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// N is the number of bytes read so far.
func (c *Reader) N() int64 { return c.n.Load() }
