// Package fakenode is an in-memory node for unit tests: it answers each
// node script (internal/nodescript) by name, with the script's arguments
// as data, and records what ran. A command that is not exactly one of the
// scripts is refused, as test/fleet's SSH nodes refuse it.
package fakenode

import (
	"context"
	"errors"
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

	mu    sync.Mutex
	calls []Call
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

// Upload is refused: nodes are staged through scripts in these tests.
func (n *Node) Upload(context.Context, string, os.FileMode, io.Reader) (int64, error) {
	return 0, errors.New("fakenode: upload not supported")
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
