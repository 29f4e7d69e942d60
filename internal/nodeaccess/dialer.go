package nodeaccess

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Dialer opens SSH connections to nodes. Host keys are always checked
// against its known_hosts file; there is no way to skip that.
type Dialer struct {
	knownHostsFile string
	knownHosts     ssh.HostKeyCallback
	identityFile   string
	signers        []ssh.Signer // from the identity file
	agentSocket    string
	jumpSpec       string
	jump           *Address
	connectTimeout time.Duration
	dial           func(ctx context.Context, network, addr string) (net.Conn, error)
	log            *slog.Logger
	maxOutput      int64
	written        atomic.Int64
}

// BytesWritten is what this Dialer's connections have written to the
// network so far: SSH's bytes on the wire, encryption and all.
func (d *Dialer) BytesWritten() int64 { return d.written.Load() }

// countingConn counts what is written to a connection.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// Option tunes a Dialer.
type Option func(*Dialer)

// WithIdentityFile logs in with the private key in file. It must not be
// encrypted: load such a key into an ssh-agent instead.
func WithIdentityFile(file string) Option { return func(d *Dialer) { d.identityFile = file } }

// WithAgentSocket logs in with the keys of the ssh-agent listening on the
// unix socket path, instead of $SSH_AUTH_SOCK; "" uses no agent. Agent keys
// are offered after the identity file's.
func WithAgentSocket(path string) Option { return func(d *Dialer) { d.agentSocket = path } }

// WithJump reaches every node through the jump host spec, "[user@]host[:port]"
// (user root and port 22 by default), like ssh -J. Its host key is checked
// against the same known_hosts file and it accepts the same credentials.
func WithJump(spec string) Option { return func(d *Dialer) { d.jumpSpec = spec } }

// WithConnectTimeout bounds connecting and logging in to a node, jump host
// included (default 20s).
func WithConnectTimeout(t time.Duration) Option { return func(d *Dialer) { d.connectTimeout = t } }

// WithNetDialer opens TCP connections with dial instead of a net.Dialer,
// for instance inside another network namespace.
func WithNetDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return func(d *Dialer) { d.dial = dial }
}

// DefaultMaxOutput bounds what one command may print: every node script
// prints far less (a node's facts with hundreds of containers, a few MB).
const DefaultMaxOutput = 64 << 20

// WithMaxOutput bounds the standard output of one command at n bytes
// (DefaultMaxOutput when not given): a node that prints more is stopped
// and its command fails (ErrOutputTooLarge), instead of filling this
// machine's memory.
func WithMaxOutput(n int64) Option { return func(d *Dialer) { d.maxOutput = n } }

// WithLogger reports what the Dialer works around, such as an unreachable
// ssh-agent when an identity file is also given.
func WithLogger(l *slog.Logger) Option { return func(d *Dialer) { d.log = l } }

// NewDialer returns a Dialer that checks host keys against knownHostsFile
// and logs in with the identity file and/or ssh-agent the options give
// (the agent at $SSH_AUTH_SOCK by default).
func NewDialer(knownHostsFile string, opts ...Option) (*Dialer, error) {
	d := &Dialer{knownHostsFile: knownHostsFile, agentSocket: os.Getenv("SSH_AUTH_SOCK"), connectTimeout: 20 * time.Second,
		dial: (&net.Dialer{}).DialContext, log: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(d)
	}
	if knownHostsFile == "" {
		return nil, errors.New("no known_hosts file: node host keys are always checked")
	}
	var err error
	if d.knownHosts, err = knownhosts.New(knownHostsFile); err != nil {
		return nil, fmt.Errorf("known_hosts: %w", err)
	}
	if d.identityFile != "" {
		s, err := loadIdentity(d.identityFile)
		if err != nil {
			return nil, err
		}
		d.signers = []ssh.Signer{s}
	}
	if len(d.signers) == 0 && d.agentSocket == "" {
		return nil, errors.New("no SSH credentials: give an identity file or run an ssh-agent (SSH_AUTH_SOCK)")
	}
	if d.jumpSpec != "" {
		j, err := parseJump(d.jumpSpec)
		if err != nil {
			return nil, err
		}
		d.jump = &j
	}
	return d, nil
}

func loadIdentity(file string) (ssh.Signer, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("identity file: %w", err)
	}
	s, err := ssh.ParsePrivateKey(pem)
	var missing *ssh.PassphraseMissingError
	if errors.As(err, &missing) {
		return nil, fmt.Errorf("identity file %s: encrypted with a passphrase: load it into an ssh-agent instead", file)
	}
	if err != nil {
		return nil, fmt.Errorf("identity file %s: %w", file, err)
	}
	return s, nil
}

// parseJump parses "[user@]host[:port]".
func parseJump(spec string) (Address, error) {
	t := Address{Name: "jump host"}
	hostPort := spec
	if i := strings.LastIndex(spec, "@"); i >= 0 {
		t.User, hostPort = spec[:i], spec[i+1:]
	}
	t.Address = strings.TrimSuffix(strings.TrimPrefix(hostPort, "["), "]")
	if host, port, err := net.SplitHostPort(hostPort); err == nil {
		t.Address = host
		if t.Port, err = strconv.Atoi(port); err != nil || t.Port < 1 || t.Port > 65535 {
			return Address{}, fmt.Errorf("jump host %q: bad port %q", spec, port)
		}
	}
	if t.Address == "" || strings.ContainsAny(t.Address, "[]@/ ") || (strings.Contains(t.Address, ":") && net.ParseIP(t.Address) == nil) {
		return Address{}, fmt.Errorf("jump host %q: want [user@]host[:port]", spec)
	}
	return t, nil
}

// Dial connects to t (through the jump host, if any) and logs in.
func (d *Dialer) Dial(ctx context.Context, t Address) (Node, error) {
	ctx, cancel := context.WithTimeout(ctx, d.connectTimeout)
	defer cancel()
	n := &sshNode{target: t, addr: t.Addr(), maxOutput: cmp.Or(d.maxOutput, DefaultMaxOutput)}
	var err error
	if d.jump != nil {
		if n.jump, err = d.login(ctx, t, *d.jump, nil); err != nil {
			return nil, err
		}
	}
	if n.client, err = d.login(ctx, t, t, n.jump); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// login connects to host, which is node t itself or the jump host on the
// way to it, through via if not nil, and logs in.
func (d *Dialer) login(ctx context.Context, t, host Address, via *ssh.Client) (*ssh.Client, error) {
	addr := host.Addr()
	fail := func(op string, err error) error {
		if host != t {
			op = "jump host " + addr + ": " + op
		}
		return &Error{Node: t.Name, Address: t.Addr(), Op: op, Err: err}
	}
	dial, dialOp := d.dial, "dial"
	if via != nil {
		dial, dialOp = via.DialContext, "dial via jump host "+d.jump.Addr()
	}
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		var oe *net.OpError // its text repeats the address
		if errors.As(err, &oe) && oe.Op == "dial" {
			err = oe.Err
		}
		return nil, fail(dialOp, err)
	}
	if via == nil {
		conn = countingConn{Conn: conn, n: &d.written}
	}
	auth, done, err := d.auth(ctx)
	if err != nil {
		conn.Close()
		return nil, fail("ssh-agent", err)
	}
	defer done()
	check := &hostKeyCheck{known: d.knownHosts, tmpl: HostKeyError{Node: t.Name, Address: t.Addr(), KnownHosts: d.knownHostsFile}}
	if host != t {
		check.tmpl.Jump = addr
	}
	cfg := &ssh.ClientConfig{
		User:              host.user(),
		Auth:              []ssh.AuthMethod{auth},
		HostKeyCallback:   check.callback,
		HostKeyAlgorithms: knownAlgorithms(d.knownHosts, addr),
	}
	// The handshake has no ctx of its own: closing the connection ends it.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	c, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if !stop() {
		if err == nil {
			c.Close()
		}
		return nil, fail("connect", ctx.Err())
	}
	if err != nil {
		conn.Close()
		if check.err == nil && cfg.HostKeyAlgorithms != nil && noCommonHostKeyType(err) {
			check.err = &check.tmpl
			check.err.Mismatch = true
		}
		if check.err != nil {
			return nil, check.err
		}
		return nil, fail("login as "+cfg.User, err)
	}
	return ssh.NewClient(c, chans, reqs), nil
}

// auth offers the identity file's key, then the agent's. All must go in one
// method: the client tries each method name ("publickey") once.
func (d *Dialer) auth(ctx context.Context) (ssh.AuthMethod, func(), error) {
	signers := slices.Clone(d.signers)
	done := func() {}
	if d.agentSocket != "" {
		agentSigners, conn, err := agentKeys(ctx, d.agentSocket)
		switch {
		case err == nil:
			signers, done = append(signers, agentSigners...), func() { conn.Close() }
		case len(signers) == 0:
			return nil, nil, err
		default:
			d.log.Warn("ssh-agent unavailable, using the identity file only", "socket", d.agentSocket, "err", err)
		}
	}
	return ssh.PublicKeys(signers...), done, nil
}

// agentKeys returns the agent's keys and the connection they sign through,
// to be closed once logged in.
func agentKeys(ctx context.Context, socket string) ([]ssh.Signer, net.Conn, error) {
	var nd net.Dialer
	conn, err := nd.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, nil, err
	}
	signers, err := agent.NewClient(conn).Signers()
	if err == nil && len(signers) == 0 {
		err = fmt.Errorf("the agent at %s holds no keys", socket)
	}
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return signers, conn, nil
}
