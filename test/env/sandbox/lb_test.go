package sandbox

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// A connection forwarded to an API server that stops being ready is
// closed once the server is marked down (haproxy's on-marked-down
// shutdown-sessions), so that its client dials again and reaches a ready
// one: a kubelet held on a server whose etcd member is down waits 35 s
// for every request (kubernetes/kubernetes#99602).
func TestLBClosesConnectionsToABackendMarkedDown(t *testing.T) {
	var ready atomic.Bool
	ready.Store(true)
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" && !ready.Load() {
			http.Error(w, "[-]etcd failed", http.StatusInternalServerError)
		}
	}))
	defer api.Close()
	backend := api.Listener.Addr().String()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ServeLB(ctx, listen, []string{backend}) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()

	// A client through the balancer: the backend answers it over TLS.
	client := api.Client()
	client.Transport.(*http.Transport).DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, listen)
	}
	var conn net.Conn
	for i := 0; conn == nil; i++ {
		c, err := net.Dial("tcp", listen)
		if err == nil {
			conn = c
			break
		}
		if i == 100 {
			t.Fatalf("the balancer does not listen on %s: %v", listen, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer conn.Close()
	resp, err := client.Get(api.URL + "/readyz")
	if err != nil {
		t.Fatalf("through the balancer: %v", err)
	}
	resp.Body.Close()

	// The raw connection is forwarded and held; the backend stops being
	// ready (its etcd member restarts) and stays so.
	ready.Store(false)
	if err := conn.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(conn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the connection to a backend marked down was still open a minute later")
	}
	if err != nil {
		t.Fatalf("reading the connection: %v", err)
	}
}
