package sandbox

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// lbBackend is an API server stand-in behind the balancer: /readyz
// answers as ready says, and every answer names the backend.
type lbBackend struct {
	name  string
	ready atomic.Bool
	srv   *httptest.Server
}

// startLB starts one backend per name, all ready, and a balancer in front
// of them; logs receives every line the balancer logs.
func startLB(t *testing.T, names ...string) (listen string, backends []*lbBackend, logs <-chan string) {
	t.Helper()
	var addrs []string
	for _, n := range names {
		b := &lbBackend{name: n}
		b.ready.Store(true)
		b.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Backend", b.name)
			if r.URL.Path == "/readyz" && !b.ready.Load() {
				http.Error(w, "[-]etcd failed", http.StatusInternalServerError)
			}
		}))
		t.Cleanup(b.srv.Close)
		backends = append(backends, b)
		addrs = append(addrs, b.srv.Listener.Addr().String())
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen = l.Addr().String()
	l.Close()
	lines := make(chan string, 100)
	logf := func(format string, args ...any) {
		select {
		case lines <- fmt.Sprintf(format, args...):
		default:
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ServeLB(ctx, listen, addrs, logf) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	return listen, backends, lines
}

// lbConn opens a connection through the balancer at listen, speaks TLS
// and HTTP on it, and says which backend answered.
func lbConn(t *testing.T, listen string) (*tls.Conn, *bufio.Reader, string) {
	t.Helper()
	var raw net.Conn
	for i := 0; raw == nil; i++ {
		c, err := net.Dial("tcp", listen)
		if err == nil {
			raw = c
			break
		}
		if i == 100 {
			t.Fatalf("the balancer does not listen on %s: %v", listen, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn := tls.Client(raw, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test's own servers
	t.Cleanup(func() { conn.Close() })
	br := bufio.NewReader(conn)
	return conn, br, lbGet(t, conn, br)
}

// lbGet asks for / on conn and returns the backend that answered.
func lbGet(t *testing.T, conn *tls.Conn, br *bufio.Reader) string {
	t.Helper()
	if err := conn.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: lb\r\n\r\n"); err != nil {
		t.Fatalf("writing through the balancer: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading through the balancer: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.Header.Get("X-Backend")
}

// waitLog waits (up to a minute) for a logged line that holds want.
func waitLog(t *testing.T, logs <-chan string, want string) string {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case l := <-logs:
			if strings.Contains(l, want) {
				return l
			}
		case <-timeout:
			t.Fatalf("the balancer logged no line with %q within a minute", want)
		}
	}
}

// A connection forwarded to an API server that stops being ready is
// closed once the server is marked down while another is ready
// (haproxy's on-marked-down shutdown-sessions), so that its client dials
// again and reaches a ready one: a kubelet held on a server whose etcd
// member is down waits 35 s for every request
// (kubernetes/kubernetes#99602).
func TestLBClosesConnectionsToABackendMarkedDown(t *testing.T) {
	listen, backends, logs := startLB(t, "a", "b")
	conn, _, reached := lbConn(t, listen)
	for _, b := range backends {
		if b.name == reached {
			b.ready.Store(false) // its etcd member restarts, and stays down
		}
	}
	waitLog(t, logs, "connections to it closed")
	_, err := io.ReadAll(conn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection to %s, marked down, was still open a minute later", reached)
	}
	if !isClosed(err) {
		t.Fatalf("reading the connection: %v", err)
	}
}

// With no other API server ready (every check timing out on a busy
// machine), the balancer keeps the connections to the one marked down:
// closing them would break the requests on them for nothing (FC27: a
// kubeadm HA sandbox's Up failed on such a closed connection). Once
// another is ready, they are closed.
func TestLBKeepsConnectionsUntilAnotherBackendIsReady(t *testing.T) {
	listen, backends, logs := startLB(t, "a", "b")
	conn, br, reached := lbConn(t, listen)
	for _, b := range backends {
		b.ready.Store(false)
	}
	line := waitLog(t, logs, "down after")
	if !strings.Contains(line, "connections are kept") {
		t.Fatalf("the balancer marked a backend down with none other ready and said: %s", line)
	}
	if again := lbGet(t, conn, br); again != reached {
		t.Fatalf("the held connection was answered by %s, not %s", again, reached)
	}
	for _, b := range backends {
		if b.name != reached {
			b.ready.Store(true)
		}
	}
	waitLog(t, logs, "connections to it closed")
	if _, err := io.ReadAll(conn); !isClosed(err) {
		t.Fatalf("the connection to %s, down while another is ready: %v", reached, err)
	}
}

// isClosed says err is what reading a connection the balancer closed
// gives: the end of the stream, or a reset.
func isClosed(err error) bool {
	return err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "connection reset")
}
