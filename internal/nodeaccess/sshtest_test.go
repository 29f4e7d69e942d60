package nodeaccess

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// testServer is a real SSH server on 127.0.0.1, enough of an sshd for these
// tests: it accepts one client key, runs "exec" requests with /bin/sh -c in
// its own directory (with a stand-in sudo on PATH), and forwards
// "direct-tcpip" channels, so that it can serve as a jump host.
type testServer struct {
	addr string
	dir  string // working directory of the commands it runs
	bin  string // prepended to PATH: holds the stand-in sudo

	mu       sync.Mutex
	auths    int      // authentication attempts, of any method
	users    []string // users logged in
	execs    []string // commands received
	forwards []string // direct-tcpip destinations
	conns    []net.Conn
	execSeen chan string
}

// newTestServer serves on 127.0.0.1:0 until the test ends, accepting the
// client key and presenting hostKeys.
func newTestServer(t *testing.T, client ssh.PublicKey, hostKeys ...ssh.Signer) *testServer {
	t.Helper()
	s := &testServer{dir: t.TempDir(), bin: t.TempDir(), execSeen: make(chan string, 16)}
	sudo := "#!/bin/sh\n[ \"$1\" = -n ] || { echo 'sudo: want -n' >&2; exit 1; }\nshift\n[ \"$1\" = -- ] && shift\nexec \"$@\"\n"
	if err := os.WriteFile(filepath.Join(s.bin, "sudo"), []byte(sudo), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
			if bytes.Equal(k.Marshal(), client.Marshal()) {
				return nil, nil
			}
			return nil, errors.New("key not authorized")
		},
		AuthLogCallback: func(ssh.ConnMetadata, string, error) { s.mu.Lock(); s.auths++; s.mu.Unlock() },
	}
	for _, k := range hostKeys {
		cfg.AddHostKey(k)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = l.Addr().String()
	var wg sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); s.handle(c, cfg) }()
		}
	}()
	return s
}

// target is a Address for this server.
func (s *testServer) target(name, user string) Address {
	host, port, _ := net.SplitHostPort(s.addr)
	p, _ := strconv.Atoi(port)
	return Address{Name: name, Role: "worker", Address: host, Port: p, User: user}
}

func (s *testServer) record(list *[]string, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*list = append(*list, v)
}

func (s *testServer) seen() (auths int, users, execs, forwards []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.auths, append([]string(nil), s.users...), append([]string(nil), s.execs...), append([]string(nil), s.forwards...)
}

func (s *testServer) handle(c net.Conn, cfg *ssh.ServerConfig) {
	defer c.Close()
	sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	s.record(&s.users, sc.User())
	go ssh.DiscardRequests(reqs)
	var wg sync.WaitGroup
	defer wg.Wait()
	for nc := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch nc.ChannelType() {
			case "session":
				s.session(nc)
			case "direct-tcpip":
				s.forward(nc)
			default:
				nc.Reject(ssh.UnknownChannelType, nc.ChannelType())
			}
		}()
	}
}

// session runs one exec request; the command is killed if the client sends
// a signal or closes the channel first.
func (s *testServer) session(nc ssh.NewChannel) {
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	ctx, kill := context.WithCancel(context.Background())
	defer kill()
	for req := range reqs {
		switch req.Type {
		case "exec":
			var p struct{ Command string }
			if ssh.Unmarshal(req.Payload, &p) != nil {
				req.Reply(false, nil)
				continue
			}
			s.record(&s.execs, p.Command)
			select {
			case s.execSeen <- p.Command:
			default:
			}
			req.Reply(true, nil)
			cmd := exec.CommandContext(ctx, "/bin/sh", "-c", p.Command)
			cmd.Dir, cmd.Stdin, cmd.Stdout, cmd.Stderr = s.dir, ch, ch, ch.Stderr()
			cmd.Env = append(os.Environ(), "PATH="+s.bin+":"+os.Getenv("PATH"))
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
			cmd.WaitDelay = 5 * time.Second
			go func() {
				code := 127
				if cmd.Run(); cmd.ProcessState != nil {
					if code = cmd.ProcessState.ExitCode(); code < 0 {
						code = 128 + int(syscall.SIGKILL)
					}
				}
				ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
				ch.Close()
			}()
		case "signal":
			kill()
		default:
			req.Reply(false, nil)
		}
	}
}

// forward connects a direct-tcpip channel to its destination.
func (s *testServer) forward(nc ssh.NewChannel) {
	var p struct {
		Host     string
		Port     uint32
		OrigHost string
		OrigPort uint32
	}
	if err := ssh.Unmarshal(nc.ExtraData(), &p); err != nil {
		nc.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	addr := net.JoinHostPort(p.Host, strconv.Itoa(int(p.Port)))
	s.record(&s.forwards, addr)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		nc.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	defer c.Close()
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	go ssh.DiscardRequests(reqs)
	done := make(chan struct{}, 2)
	go func() { io.Copy(ch, c); done <- struct{}{} }()
	go func() { io.Copy(c, ch); done <- struct{}{} }()
	<-done
}

// fixture is an operator's side: a client key in an identity file and a
// known_hosts file, both under t.TempDir().
type fixture struct {
	key          ed25519.PrivateKey
	signer       ssh.Signer
	identityFile string
	knownHosts   string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	dir := t.TempDir()
	f := &fixture{key: key, signer: signerOf(t, key), identityFile: filepath.Join(dir, "id_ed25519"), knownHosts: filepath.Join(dir, "known_hosts")}
	block, err := ssh.MarshalPrivateKey(key, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.identityFile, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.knownHosts, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// server starts a test server accepting the fixture's key, with a new
// ed25519 host key that known_hosts trusts.
func (f *fixture) server(t *testing.T) *testServer {
	t.Helper()
	hostKey := newHostKey(t)
	s := newTestServer(t, f.signer.PublicKey(), hostKey)
	f.trust(t, s.addr, hostKey.PublicKey())
	return s
}

// trust adds addr's key to known_hosts.
func (f *fixture) trust(t *testing.T, addr string, key ssh.PublicKey) {
	t.Helper()
	kh, err := os.OpenFile(f.knownHosts, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer kh.Close()
	if _, err := io.WriteString(kh, knownhosts.Line([]string{knownhosts.Normalize(addr)}, key)+"\n"); err != nil {
		t.Fatal(err)
	}
}

// dialer logs in with the identity file only, whatever SSH_AUTH_SOCK says.
// It reads known_hosts now: start the servers it is to trust first.
func (f *fixture) dialer(t *testing.T, opts ...Option) *Dialer {
	t.Helper()
	d, err := NewDialer(f.knownHosts, append([]Option{WithIdentityFile(f.identityFile), WithAgentSocket("")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (f *fixture) dial(t *testing.T, d *Dialer, tg Address) Node {
	t.Helper()
	n, err := d.Dial(context.Background(), tg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func newHostKey(t *testing.T) ssh.Signer {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	return signerOf(t, key)
}

func newECDSAHostKey(t *testing.T) ssh.Signer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return signerOf(t, key)
}

func signerOf(t *testing.T, key crypto.Signer) ssh.Signer {
	t.Helper()
	s, err := ssh.NewSignerFromSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
