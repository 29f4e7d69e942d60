package nodeaccess

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kubelift/kubelift/internal/iocount"
	"golang.org/x/crypto/ssh"
)

// stderrTail is how much of a failed command's standard error ExitError keeps.
const stderrTail = 4 << 10

// sshNode is a Node reached over SSH.
type sshNode struct {
	target    Address
	addr      string
	client    *ssh.Client
	jump      *ssh.Client // nil when dialed directly
	maxOutput int64
}

// ErrOutputTooLarge means a command printed more than the Dialer's bound
// (WithMaxOutput): it was stopped.
var ErrOutputTooLarge = errors.New("output larger than allowed")

func (n *sshNode) fail(op string, err error) error {
	return &Error{Node: n.target.Name, Address: n.addr, Op: op, Err: err}
}

func (n *sshNode) Run(ctx context.Context, cmd string, stdin io.Reader) ([]byte, error) {
	out, err := n.run(ctx, cmd, stdin)
	if err != nil {
		return out, n.fail(fmt.Sprintf("run %q", FirstLine(cmd)), err)
	}
	return out, nil
}

// FirstLine is what an error quotes of a command or of what a node said:
// its first line (leading space trimmed), at most 80 bytes, " ..." where
// there is more (a node script's first line says which script it is; its
// whole text, or a node's whole answer, would drown the error).
func FirstLine(cmd string) string {
	line, _, more := strings.Cut(strings.TrimSpace(cmd), "\n")
	if len(line) > 80 {
		line, more = line[:80], true
	}
	if more {
		line += " ..."
	}
	return line
}

func (n *sshNode) Upload(ctx context.Context, p string, mode os.FileMode, r io.Reader) (int64, error) {
	sent, err := n.upload(ctx, p, mode, r)
	if err != nil {
		return sent, n.fail("upload "+p, err)
	}
	return sent, nil
}

// upload writes r to a private temporary file next to p, then, in a second
// session and only if the file holds every byte read from r, syncs it,
// sets its mode and renames it over p. One session cannot tell a complete
// stream from one cut short by a failing reader: both end in EOF.
func (n *sshNode) upload(ctx context.Context, p string, mode os.FileMode, r io.Reader) (int64, error) {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return 0, fmt.Errorf("%q is not a clean absolute path", p)
	}
	var random [8]byte
	if _, err := rand.Read(random[:]); err != nil {
		return 0, err
	}
	tmp := Quote(path.Join(path.Dir(p), "."+path.Base(p)+".tmp."+hex.EncodeToString(random[:])))
	cr := iocount.NewReader(r)
	_, err := n.run(ctx, fmt.Sprintf("mkdir -p -- %s && umask 077 && cat >%s", Quote(path.Dir(p)), tmp), cr)
	if err == nil {
		_, err = n.run(ctx, fmt.Sprintf(commitScript, tmp, cr.N(), uint32(mode.Perm()), Quote(p)), nil)
	}
	if err != nil {
		// Even when ctx is done: else the temporary file stays for good.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_, _ = n.run(ctx, "rm -f -- "+tmp, nil)
	}
	return cr.N(), err
}

// commitScript installs the temporary file %[1]s of %[2]d bytes as %[4]s
// with mode %[3]o, or removes it.
const commitScript = `tmp=%[1]s
trap 'rm -f -- "$tmp"' EXIT
set -e
size=$(wc -c <"$tmp")
[ $size -eq %[2]d ] || { echo "received $size bytes of %[2]d" >&2; exit 1; }
chmod %04[3]o "$tmp"
sync -- "$tmp" 2>/dev/null || sync
[ ! -d %[4]s ] || { echo "destination is a directory" >&2; exit 1; }
mv -f -- "$tmp" %[4]s`

// Stream runs cmd in a new session, its standard output written to w as
// it comes (unbounded: w bounds it, or the file does), with run's
// handling of ctx and of a failing command.
func (n *sshNode) Stream(ctx context.Context, cmd string, w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	if _, err := n.session(ctx, cmd, nil, cw, nil); err != nil {
		return cw.n.Load(), n.fail(fmt.Sprintf("run %q", FirstLine(cmd)), err)
	}
	return cw.n.Load(), nil
}

// countingWriter counts what it passes on: atomically, since a session
// stopped on ctx may still write after Stream has returned.
type countingWriter struct {
	w io.Writer
	n atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.n.Add(int64(k))
	return k, err
}

// cleanupTimeout bounds removing a failed upload's temporary file.
const cleanupTimeout = 10 * time.Second

func (n *sshNode) Close() error {
	var errs []error
	for _, c := range []*ssh.Client{n.client, n.jump} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// run runs cmd in a new session and returns its standard output, at most
// the Dialer's bound of it (past that, the command is stopped).
func (n *sshNode) run(ctx context.Context, cmd string, stdin io.Reader) ([]byte, error) {
	stdout := &bounded{max: n.maxOutput, over: make(chan struct{})}
	ended, err := n.session(ctx, cmd, stdin, stdout, stdout.over)
	if errors.Is(err, errOver) || (ended && stdout.full) {
		return nil, fmt.Errorf("%w: stopped after %d bytes of standard output", ErrOutputTooLarge, n.maxOutput)
	}
	if !ended {
		return nil, err
	}
	return stdout.b.Bytes(), err
}

// errOver: session stopped the command when over closed.
var errOver = errors.New("stopped: output over its bound")

// session runs cmd in a new session, its standard input and output as
// given, and says whether the command ended (then its output is all
// written, and err is its exit as an *ExitError, if it failed). When ctx
// is done, or over closes, it stops the command and returns at once
// (ended false), without waiting for a host that may not answer: the
// session goroutine ends when the connection does, and until then may
// still read stdin and write stdout.
func (n *sshNode) session(ctx context.Context, cmd string, stdin io.Reader, stdout io.Writer, over <-chan struct{}) (ended bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s, err := n.client.NewSession()
	if err != nil {
		return false, fmt.Errorf("open session: %w", err)
	}
	defer s.Close()
	stderr := &tail{max: stderrTail}
	s.Stdin, s.Stdout, s.Stderr = stdin, stdout, stderr
	if err := s.Start(n.command(cmd)); err != nil {
		return false, err
	}
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	select {
	case err = <-done:
	case <-over:
		_ = s.Signal(ssh.SIGKILL)
		_ = s.Close()
		return false, errOver
	case <-ctx.Done():
		_ = s.Signal(ssh.SIGKILL)
		_ = s.Close()
		return false, ctx.Err()
	}
	var exit *ssh.ExitError
	if errors.As(err, &exit) {
		err = &ExitError{Code: exit.ExitStatus(), Signal: exit.Signal(), Stderr: string(bytes.TrimSpace(stderr.b))}
	}
	return true, err
}

// bounded keeps what is written to it up to max bytes; past that it keeps
// nothing more and closes over (once), so that the session is stopped.
type bounded struct {
	max  int64
	b    bytes.Buffer
	full bool
	over chan struct{}
}

func (w *bounded) Write(p []byte) (int, error) {
	if w.full {
		return len(p), nil
	}
	if int64(w.b.Len())+int64(len(p)) > w.max {
		w.full = true
		close(w.over)
		return len(p), nil
	}
	return w.b.Write(p)
}

// command is cmd as sent to the node: through `sudo -n` for users other
// than root, so that a missing sudoers rule fails at once rather than
// waiting on a password prompt nobody will answer.
func (n *sshNode) command(cmd string) string {
	if n.target.user() == "root" {
		return cmd
	}
	return "sudo -n -- sh -c " + Quote(cmd)
}

// tail keeps the last max bytes written to it.
type tail struct {
	max int
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}
