// Package fakenode is an in-memory node for unit tests: it answers each
// node script (internal/nodescript) by name, with the script's arguments
// as data, and records what ran. A command that is not exactly one of the
// scripts is refused, as test/env/fleet's SSH nodes refuse it.
package fakenode

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/kubelift/kubelift/internal/nodescript"
)

// Handler answers one script: what it prints, or an error (the script
// failing).
type Handler func(args []string) (string, error)

// Call is one script run on the node.
type Call struct {
	Script string
	Args   []string
}

// Node is a nodeaccess.Node in memory.
type Node struct {
	// Scripts answer the scripts by name (nodescript.Script.Name); a
	// script without a handler fails.
	Scripts map[string]Handler

	mu      sync.Mutex
	calls   []Call
	uploads map[string][]byte
}

// Run plays cmd's script.
func (n *Node) Run(ctx context.Context, cmd string, _ io.Reader) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sc, args, err := nodescript.Parse(cmd)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.calls = append(n.calls, Call{Script: sc.Name, Args: args})
	h := n.Scripts[sc.Name]
	n.mu.Unlock()
	if h == nil {
		return nil, fmt.Errorf("fakenode: no handler for script %s", sc.Name)
	}
	out, err := h(args)
	return []byte(out), err
}

// Upload keeps what r holds as the file p (Uploaded reads it back).
func (n *Node) Upload(ctx context.Context, p string, _ os.FileMode, r io.Reader) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return int64(len(data)), err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.uploads == nil {
		n.uploads = map[string][]byte{}
	}
	n.uploads[p] = data
	return int64(len(data)), nil
}

// Stream plays cmd's script as Run does and writes what it prints to w.
func (n *Node) Stream(ctx context.Context, cmd string, w io.Writer) (int64, error) {
	out, err := n.Run(ctx, cmd, nil)
	if err != nil {
		return 0, err
	}
	k, err := w.Write(out)
	return int64(k), err
}

// Uploaded is the file Upload wrote at p, and whether it did.
func (n *Node) Uploaded(p string) ([]byte, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	data, ok := n.uploads[p]
	return data, ok
}

// Close does nothing.
func (n *Node) Close() error { return nil }

// Calls are the scripts run so far, in order.
func (n *Node) Calls() []Call {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Call(nil), n.calls...)
}

// Count is how many times the script ran.
func (n *Node) Count(script string) int {
	c := 0
	for _, call := range n.Calls() {
		if call.Script == script {
			c++
		}
	}
	return c
}
