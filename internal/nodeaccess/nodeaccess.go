// Package nodeaccess is how the upgrade engine reaches the cluster's nodes:
// over SSH, with host keys always checked against a known_hosts file. It
// works out where and as whom to reach each node (the cluster's Node objects,
// overridden by an optional inventory file), runs commands and uploads files
// on a node, and visits many nodes a bounded number at a time, so that one
// unreachable node is reported without holding up the others.
package nodeaccess

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
)

// Node is one SSH connection to a node. It may be used by several
// goroutines at once; each call runs in its own SSH session.
type Node interface {
	// Run runs a shell command, through `sudo -n` for users other than
	// root, feeding it stdin (nil: none), and returns its standard output.
	// A command that exits non-zero fails with an *ExitError (along with
	// the output so far). When ctx is done the command is sent SIGKILL, its
	// session is closed and ctx's error is returned.
	Run(ctx context.Context, cmd string, stdin io.Reader) ([]byte, error)
	// Upload writes what r holds to the absolute path p with mode's
	// permission bits, atomically: readers see the old file or the whole
	// new one, and a failure, a failing r included, leaves the old one. It
	// returns the number of bytes read from r. When ctx is done it returns
	// at once, and r may still be read until the connection closes.
	Upload(ctx context.Context, p string, mode os.FileMode, r io.Reader) (int64, error)
	// Stream runs a shell command as Run does, its standard output
	// written to w as it comes, unbounded (a node's file copied off it),
	// and returns the number of bytes written; an error means w may hold
	// part of it.
	Stream(ctx context.Context, cmd string, w io.Writer) (int64, error)
	// Close closes the connection (and its jump host connection, if any).
	Close() error
}

// Connector opens connections to nodes; *Dialer is the SSH one.
type Connector interface {
	Dial(ctx context.Context, t Address) (Node, error)
}

// Address is where and as whom to reach one node.
type Address struct {
	Name    string // Kubernetes node name
	Role    string // "control-plane", "worker", or another node-role
	Address string // IP address or DNS name, without the port
	Port    int    // SSH port; 0 means 22
	User    string // login user; "" means root
}

// Addr is the address's host:port.
func (t Address) Addr() string {
	port := t.Port
	if port == 0 {
		port = 22
	}
	return net.JoinHostPort(t.Address, strconv.Itoa(port))
}

func (t Address) user() string {
	if t.User == "" {
		return "root"
	}
	return t.User
}

// Error is a failure about one node: reaching it, or doing something on it.
// Its message names the node and its address, like
// "node worker-2 (10.77.0.23:22): dial: connect: connection refused".
type Error struct {
	Node    string // node name
	Address string // host:port dialed
	Op      string // what failed: "dial", "login as root", `run "systemctl restart kubelet"`, ...
	Err     error
}

func (e *Error) Error() string {
	return fmt.Sprintf("node %s (%s): %s: %v", e.Node, e.Address, e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ExitError is a command that ran and did not exit zero.
type ExitError struct {
	Code   int    // exit status; 128+n when killed by signal n
	Signal string // the signal that killed it ("KILL", "TERM", ...), if any
	Stderr string // the end of its standard error, trimmed
}

func (e *ExitError) Error() string {
	msg := "exit status " + strconv.Itoa(e.Code)
	if e.Signal != "" {
		msg = "killed by signal " + e.Signal
	}
	if e.Stderr != "" {
		msg += ": " + e.Stderr
	}
	return msg
}
