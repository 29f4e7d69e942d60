package kube

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// NetNS is a network namespace the test made, with one address of its own
// (on a veth pair inside it: node IPs may not be loopback).
type NetNS struct {
	Name string
	Addr string
}

// NewNetNS creates namespace name with addr/24 on an interface inside it.
// Delete removes it.
func NewNetNS(name, addr string) (*NetNS, error) {
	n := &NetNS{Name: name, Addr: addr}
	_ = exec.Command("ip", "netns", "del", name).Run() // a leftover from a killed run
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %v: %s", name, err, out)
	}
	script := fmt.Sprintf("ip link set lo up && ip link add node0 type veth peer name node0p && ip addr add %s/24 dev node0 && ip link set node0p up && ip link set node0 up", addr)
	if out, err := exec.Command("ip", "netns", "exec", name, "sh", "-c", script).CombinedOutput(); err != nil {
		n.Delete()
		return nil, fmt.Errorf("set up %s: %v: %s", name, err, out)
	}
	return n, nil
}

// Delete removes the namespace.
func (n *NetNS) Delete() { _ = exec.Command("ip", "netns", "del", n.Name).Run() }

// Command runs name with args inside the namespace. It uses nsenter, which
// switches the network namespace only: "ip netns exec" also mounts a fresh
// /sys, hiding /sys/fs/cgroup, which the kubelet needs.
func (n *NetNS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=/var/run/netns/" + n.Name, "--", name}, args...)...)
}

// DialContext opens a connection from inside the namespace: the socket is
// created while the goroutine's OS thread has joined the namespace, and
// the thread goes back to its own namespace before it is released. (If it
// cannot, it stays locked and ends with the goroutine. Threads must not end
// otherwise: a child process started from a thread gets its Pdeathsig when
// that thread exits.)
func (n *NetNS) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer orig.Close()
		target, err := os.Open("/var/run/netns/" + n.Name)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("setns %s: %w", n.Name, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, address)
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}
