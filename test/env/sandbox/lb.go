package sandbox

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// A three-control-plane kubeadm sandbox reaches its API servers through
// a load balancer on the admin machine (ServeLB, unit
// kube-apiserver-lb.service), as kubeadm's HA clusters do through
// haproxy or a VIP: controlPlaneEndpoint names it, so kubelets, kube-proxy
// and the controller managers keep an API server while kubeadm restarts
// one. It forwards TCP (TLS passes through) to the API servers whose
// /readyz answers ok, checked every second as haproxy's `check-ssl`
// does, and a connection to a backend that refuses is tried on the next.
// A backend whose /readyz fails downFails times in a row is down, and the
// connections forwarded to it are closed once another backend is ready,
// as haproxy's `on-marked-down shutdown-sessions` does: a kubelet's one
// HTTP/2 connection stays with the API server it reached, and when that
// server's local etcd member is restarted every request on it times
// out, the kubelet's deletion of etcd's old mirror pod among them, which
// keeps the new etcd from starting for 35 s (kubernetes/kubernetes#99602;
// 47 s from kill to start on each control plane of
// test/stories/kubeadmha). Closed, the kubelet dials again and reaches a
// ready one. While no other backend is ready they are kept: closed, they
// would have nowhere better to go, and on a busy machine (a cold make
// test) every API server's check can time out at once. Each backend
// going down or coming back is logged.

// lbPort is the load balancer's port on the admin machine.
const lbPort = 6443

// downFails is how many failed checks in a row mark a backend down
// (haproxy's `fall`, 3 by default): a check that times out once on a
// busy machine only routes new connections elsewhere.
const downFails = 3

// checkTimeout bounds one check (haproxy's `timeout check` defaults to
// its `inter`, 2 s); checks start every second.
const checkTimeout = 2 * time.Second

// ServeLB forwards connections on listen to the ready backends until ctx
// ends, saying with logf when a backend goes down or comes back.
func ServeLB(ctx context.Context, listen string, backends []string, logf func(format string, args ...any)) error {
	if len(backends) == 0 {
		return errors.New("lb: no backends")
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	lb := &loadBalancer{backends: backends, ready: make([]atomic.Bool, len(backends)), fails: make([]int, len(backends)), lastErr: make([]string, len(backends)), closed: make([]bool, len(backends)), conns: map[net.Conn]int{}, logf: logf}
	go lb.check(ctx)
	go func() { <-ctx.Done(); l.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			lb.forward(ctx, c)
		}()
	}
}

type loadBalancer struct {
	backends []string
	ready    []atomic.Bool
	next     atomic.Uint32
	// fails counts each backend's failed checks in a row, lastErr says
	// why the last one failed, and closed that its connections were
	// closed since it went down (only check touches them); conns maps
	// each forwarded client connection to its backend.
	fails   []int
	lastErr []string
	closed  []bool
	mu      sync.Mutex
	conns   map[net.Conn]int
	logf    func(format string, args ...any)
}

// shutdown closes the connections forwarded to backend i, and says how
// many.
func (lb *loadBalancer) shutdown(i int) int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	n := 0
	for c, b := range lb.conns {
		if b == i {
			c.Close()
			n++
		}
	}
	return n
}

// anyReady says a backend other than i is ready.
func (lb *loadBalancer) anyReady(i int) bool {
	for k := range lb.backends {
		if k != i && lb.ready[k].Load() {
			return true
		}
	}
	return false
}

// check reads every backend's /readyz each second.
func (lb *loadBalancer) check(ctx context.Context) {
	client := &http.Client{Timeout: checkTimeout, Transport: &http.Transport{
		// The API servers' certificates are checked by the clients the
		// connections are forwarded for; this only asks ready or not.
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a health check, as haproxy's check-ssl verify none
		DisableKeepAlives: true,
	}}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		var wg sync.WaitGroup
		for i, b := range lb.backends {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+b+"/readyz", nil)
				if err != nil {
					lb.ready[i].Store(false)
					return
				}
				resp, err := client.Do(req)
				ok := err == nil && resp.StatusCode == http.StatusOK
				switch {
				case err != nil:
					lb.lastErr[i] = err.Error()
				case !ok:
					lb.lastErr[i] = resp.Status
				}
				if err == nil {
					_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
					resp.Body.Close()
				}
				lb.ready[i].Store(ok)
			}()
		}
		wg.Wait()
		for i, b := range lb.backends {
			if lb.ready[i].Load() {
				if lb.fails[i] >= downFails {
					lb.logf("%s is back: /readyz ok", b)
				}
				lb.fails[i], lb.closed[i] = 0, false
				continue
			}
			lb.fails[i]++
			if lb.fails[i] < downFails || lb.closed[i] {
				continue
			}
			// Down: its connections are closed once another is ready
			// (checked again each round while it stays down).
			if !lb.anyReady(i) {
				if lb.fails[i] == downFails {
					lb.logf("%s down after %d failed checks (last: %s); no other API server is ready, so its connections are kept", b, downFails, lb.lastErr[i])
				}
				continue
			}
			lb.closed[i] = true
			lb.logf("%s down after %d failed checks (last: %s): %d connections to it closed", b, lb.fails[i], lb.lastErr[i], lb.shutdown(i))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// forward pipes c to a ready backend, round robin, trying the next one
// that is ready when a dial fails (and any, when none is).
func (lb *loadBalancer) forward(ctx context.Context, c net.Conn) {
	defer c.Close()
	n := len(lb.backends)
	start := int(lb.next.Add(1))
	var order []int
	for _, wantReady := range []bool{true, false} {
		for k := range n {
			i := (start + k) % n
			if lb.ready[i].Load() == wantReady {
				order = append(order, i)
			}
		}
	}
	var up net.Conn
	for _, i := range order {
		d := net.Dialer{Timeout: 2 * time.Second}
		var err error
		if up, err = d.DialContext(ctx, "tcp", lb.backends[i]); err == nil {
			lb.mu.Lock()
			lb.conns[c] = i
			lb.mu.Unlock()
			defer func() {
				lb.mu.Lock()
				delete(lb.conns, c)
				lb.mu.Unlock()
			}()
			break
		}
	}
	if up == nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	select {
	case <-done:
	case <-ctx.Done():
	}
	// One side ended: the other gets a moment to finish, then both close.
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	case <-ctx.Done():
	}
}

// lbUnit runs ServeLB on the admin machine.
const lbUnit = `[Unit]
Description=Load balancer of the kubeadm control plane's API servers (as haproxy in kubeadm's HA guide)

[Service]
ExecStart=` + toolPath + ` lb --listen %s %s
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
`

// HA says the sandbox has three control planes.
func (s *State) HA() bool {
	n := 0
	for _, m := range s.Nodes() {
		if m.Role == "control-plane" {
			n++
		}
	}
	return n > 1
}

// controlPlaneEndpoint is what kubeadm's controlPlaneEndpoint names:
// the admin machine's load balancer with three control planes, else
// cp-1's API server.
func (s *State) controlPlaneEndpoint() string {
	if s.Kubeadm && s.HA() {
		return fmt.Sprintf("%s:%d", s.Admin().Address, lbPort)
	}
	return s.Nodes()[0].Address + ":6443"
}

// lbFiles gives the admin machine the load balancer's unit.
func (s *State) lbFiles(m *Machine) error {
	var flags string
	for _, n := range s.Nodes() {
		if n.Role == "control-plane" {
			flags += " --backend " + n.Address + ":6443"
		}
	}
	return writeUnit(m, "kube-apiserver-lb.service", fmt.Sprintf(lbUnit, s.controlPlaneEndpoint(), flags), true)
}
