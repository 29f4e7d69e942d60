package iocount

import (
	"io"
	"strings"
	"sync"
	"testing"
)

// Counted while another goroutine reads (go test -race checks the
// count's reads), it ends at what was read.
func TestCountsWhileRead(t *testing.T) {
	const size = 1 << 20
	r := NewReader(strings.NewReader(strings.Repeat("x", size)))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := io.Copy(io.Discard, r); err != nil {
			t.Error(err)
		}
	}()
	for i := 0; i < 1000; i++ {
		if n := r.N(); n < 0 || n > size {
			t.Fatalf("counted %d", n)
		}
	}
	wg.Wait()
	if r.N() != size {
		t.Errorf("counted %d, want %d", r.N(), size)
	}
}
