package nodeaccess

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

func TestDialRefusesUnknownOrChangedHostKey(t *testing.T) {
	for _, tc := range []struct {
		name     string
		trust    func(f *fixture, srv *testServer) // what known_hosts holds
		mismatch bool
		want     string
	}{
		{"changed key", func(f *fixture, srv *testServer) { f.trust(t, srv.addr, newHostKey(t).PublicKey()) }, true,
			"host key mismatch: the known_hosts file %s has another key for this host (possible man-in-the-middle)"},
		{"unknown host", func(f *fixture, srv *testServer) { f.trust(t, "127.0.0.2:22", newHostKey(t).PublicKey()) }, false,
			"unknown host: the known_hosts file %s has no key for this host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			hostKey := newHostKey(t)
			srv := newTestServer(t, f.signer.PublicKey(), hostKey)
			tc.trust(f, srv)

			n, err := f.dialer(t).Dial(context.Background(), srv.target("worker-1", ""))
			var hk *HostKeyError
			if !errors.As(err, &hk) {
				if n != nil {
					n.Close()
				}
				t.Fatalf("err = %v, want a HostKeyError", err)
			}
			if hk.Node != "worker-1" || hk.Address != srv.addr || hk.Mismatch != tc.mismatch || hk.Jump != "" ||
				ssh.FingerprintSHA256(hk.Key) != ssh.FingerprintSHA256(hostKey.PublicKey()) {
				t.Errorf("HostKeyError = %+v", hk)
			}
			want := "node worker-1 (" + srv.addr + "): " + strings.Replace(tc.want, "%s", f.knownHosts, 1)
			if !strings.HasPrefix(err.Error(), want) {
				t.Errorf("err = %q\nwant prefix %q", err, want)
			}
			if auths, _, execs, _ := srv.seen(); auths != 0 || len(execs) != 0 {
				t.Errorf("server saw %d authentication attempts and commands %q, want none", auths, execs)
			}
		})
	}
}

func TestDialPicksTheKnownHostKey(t *testing.T) {
	// The server has an ECDSA and an ed25519 key; the client would rather
	// have ECDSA but known_hosts holds only the ed25519 one.
	f := newFixture(t)
	ed := newHostKey(t)
	srv := newTestServer(t, f.signer.PublicKey(), newECDSAHostKey(t), ed)
	f.trust(t, srv.addr, ed.PublicKey())
	n := f.dial(t, f.dialer(t), srv.target("worker-1", ""))
	if _, err := n.Run(context.Background(), "true", nil); err != nil {
		t.Fatal(err)
	}
}

func TestDialRefusesHostWithoutTheKnownKeyType(t *testing.T) {
	f := newFixture(t)
	srv := newTestServer(t, f.signer.PublicKey(), newECDSAHostKey(t))
	f.trust(t, srv.addr, newHostKey(t).PublicKey())
	_, err := f.dialer(t).Dial(context.Background(), srv.target("worker-1", ""))
	var hk *HostKeyError
	if !errors.As(err, &hk) || !hk.Mismatch || hk.Key != nil || !strings.Contains(err.Error(), "host key mismatch") {
		t.Fatalf("err = %v, want a host key mismatch", err)
	}
	if auths, _, _, _ := srv.seen(); auths != 0 {
		t.Errorf("server saw %d authentication attempts", auths)
	}
}

func TestKnownAlgorithms(t *testing.T) {
	f := newFixture(t)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaPub, err := ssh.NewPublicKey(&rsaKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	f.trust(t, "10.0.0.1:22", rsaPub)
	f.trust(t, "10.0.0.1:22", newHostKey(t).PublicKey())
	d := f.dialer(t)
	got := strings.Join(knownAlgorithms(d.knownHosts, "10.0.0.1:22"), " ")
	if want := "ssh-ed25519 rsa-sha2-512 rsa-sha2-256 ssh-rsa"; got != want {
		t.Errorf("algorithms = %q, want %q", got, want)
	}
	if got := knownAlgorithms(d.knownHosts, "10.0.0.2:22"); got != nil {
		t.Errorf("algorithms for an unknown host = %q, want none (the defaults)", got)
	}
}

func TestDialWithAgent(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	keyring := agent.NewKeyring()
	if err := keyring.Add(agent.AddedKey{PrivateKey: f.key}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); agent.ServeAgent(keyring, c) }()
		}
	}()
	t.Setenv("SSH_AUTH_SOCK", sock)

	d, err := NewDialer(f.knownHosts) // no identity file: the agent only
	if err != nil {
		t.Fatal(err)
	}
	n := f.dial(t, d, srv.target("worker-1", ""))
	if out, err := n.Run(context.Background(), "echo via agent", nil); err != nil || string(out) != "via agent\n" {
		t.Fatalf("Run = %q, %v", out, err)
	}

	// An unreachable agent is skipped when there is an identity file too.
	d = f.dialer(t, WithAgentSocket(filepath.Join(t.TempDir(), "gone.sock")))
	f.dial(t, d, srv.target("worker-1", ""))
}

func TestDialThroughJumpHost(t *testing.T) {
	f := newFixture(t)
	jump := f.server(t)
	node := f.server(t)
	d := f.dialer(t, WithJump("bastion@"+jump.addr))
	n := f.dial(t, d, node.target("worker-1", ""))
	if out, err := n.Run(context.Background(), "echo hi", nil); err != nil || string(out) != "hi\n" {
		t.Fatalf("Run = %q, %v", out, err)
	}
	_, jumpUsers, jumpExecs, forwards := jump.seen()
	_, _, nodeExecs, _ := node.seen()
	if len(jumpUsers) != 1 || jumpUsers[0] != "bastion" || len(jumpExecs) != 0 || len(forwards) != 1 || forwards[0] != node.addr {
		t.Errorf("jump host saw users %q, commands %q, forwards %q", jumpUsers, jumpExecs, forwards)
	}
	if len(nodeExecs) != 1 || nodeExecs[0] != "echo hi" {
		t.Errorf("node saw commands %q", nodeExecs)
	}

	// The jump host's key is checked too.
	untrusted := newTestServer(t, f.signer.PublicKey(), newHostKey(t))
	_, err := f.dialer(t, WithJump(untrusted.addr)).Dial(context.Background(), node.target("worker-1", ""))
	var hk *HostKeyError
	if !errors.As(err, &hk) || hk.Jump != untrusted.addr || hk.Node != "worker-1" ||
		!strings.HasPrefix(err.Error(), "node worker-1 ("+node.addr+"): jump host "+untrusted.addr+": unknown host") {
		t.Fatalf("err = %v, want the jump host's key refused", err)
	}
}

func TestDialFailuresNameTheNode(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	closed := closedAddr(t)
	other := newFixture(t) // a key the server does not accept
	other.knownHosts = f.knownHosts

	for _, tc := range []struct {
		name   string
		d      *Dialer
		target Address
		want   string
	}{
		{"refused", f.dialer(t), Address{Name: "worker-2", Address: "127.0.0.1", Port: closed}, "): dial: connect: connection refused"},
		{"key not accepted", other.dialer(t), srv.target("worker-3", "ubuntu"), "): login as ubuntu: ssh: handshake failed: ssh: unable to authenticate"},
		{"jump host refused", f.dialer(t, WithJump("127.0.0.1:"+strconv.Itoa(closed))), srv.target("worker-4", ""), "): jump host 127.0.0.1:" + strconv.Itoa(closed) + ": dial: connect: connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.d.Dial(context.Background(), tc.target)
			var e *Error
			if !errors.As(err, &e) || e.Node != tc.target.Name || !strings.HasPrefix(err.Error(), "node "+tc.target.Name+" ("+tc.target.Addr()+tc.want) {
				t.Fatalf("err = %v, want prefix %q", err, "node "+tc.target.Name+" ("+tc.target.Addr()+tc.want)
			}
		})
	}
}

func TestNewDialerErrors(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKeyWithPassphrase(key, "", []byte("secret"))
	if err != nil {
		t.Fatal(err)
	}
	encrypted := filepath.Join(dir, "id_encrypted")
	if err := os.WriteFile(encrypted, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "id_garbage")
	if err := os.WriteFile(garbage, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	noAgent := WithAgentSocket("")
	for _, tc := range []struct {
		name       string
		knownHosts string
		opts       []Option
		want       string
	}{
		{"no known_hosts", "", []Option{WithIdentityFile(f.identityFile)}, "no known_hosts file"},
		{"missing known_hosts", filepath.Join(dir, "nope"), []Option{WithIdentityFile(f.identityFile)}, "known_hosts: open " + filepath.Join(dir, "nope")},
		{"no credentials", f.knownHosts, []Option{noAgent}, "no SSH credentials"},
		{"missing identity", f.knownHosts, []Option{WithIdentityFile(filepath.Join(dir, "id_none"))}, "identity file: open " + filepath.Join(dir, "id_none")},
		{"encrypted identity", f.knownHosts, []Option{WithIdentityFile(encrypted)}, "identity file " + encrypted + ": encrypted with a passphrase"},
		{"garbage identity", f.knownHosts, []Option{WithIdentityFile(garbage)}, "identity file " + garbage + ": "},
		{"bad jump", f.knownHosts, []Option{WithIdentityFile(f.identityFile), WithJump("user@host:http")}, `jump host "user@host:http": bad port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewDialer(tc.knownHosts, tc.opts...)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("err = %v, want prefix %q", err, tc.want)
			}
		})
	}
}

func TestParseJump(t *testing.T) {
	for spec, want := range map[string]string{
		"bastion":             "root@bastion:22",
		"ops@bastion":         "ops@bastion:22",
		"ops@10.0.0.1:2222":   "ops@10.0.0.1:2222",
		"[fd00::1]:2222":      "root@[fd00::1]:2222",
		"[fd00::1]":           "root@[fd00::1]:22",
		"a@b@bastion.example": "a@b@bastion.example:22",
		"":                    "error",
		"ops@":                "error",
		"bastion:0":           "error",
		"fd00::1":             "root@[fd00::1]:22",
		"bastion:22:22":       "error",
	} {
		got := "error"
		if j, err := parseJump(spec); err == nil {
			got = j.user() + "@" + j.Addr()
		}
		if got != want {
			t.Errorf("parseJump(%q) = %s, want %s", spec, got, want)
		}
	}
}

// closedAddr is a port on 127.0.0.1 that nothing listens on.
func closedAddr(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}
