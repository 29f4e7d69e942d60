package fleet

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"

	"golang.org/x/crypto/ssh"
)

// listen opens every node's listener and starts serving it.
func (f *Fleet) listen() error {
	port := f.cfg.Port
	fixed := port != 0
	if !fixed {
		port = 22
	}
	for i, n := range f.order {
		l, err := net.Listen("tcp", net.JoinHostPort(n.spec.Address, strconv.Itoa(port)))
		if err != nil && !fixed {
			// 22 is taken or not ours to bind: one free port for all
			// (the first node's), else a free port of the node's own.
			if l, err = net.Listen("tcp", net.JoinHostPort(n.spec.Address, "0")); err == nil && i == 0 {
				port = l.Addr().(*net.TCPAddr).Port
			}
		}
		if err != nil {
			return fmt.Errorf("fleet: node %s: %w", n.spec.Name, err)
		}
		n.port = l.Addr().(*net.TCPAddr).Port
		f.mu.Lock()
		f.listeners = append(f.listeners, l)
		f.mu.Unlock()
		f.wg.Add(1)
		go f.accept(n, l)
	}
	return nil
}

// serverConfig makes a node's host key and its server configuration.
func (f *Fleet) serverConfig() (*ssh.ServerConfig, ssh.Signer, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	signer, err := ssh.NewSignerFromKey(key)
	if err != nil {
		return nil, nil, err
	}
	want := f.clientKey.Marshal()
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(c ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
			// The engine logs in as root (no sudo); other users would
			// wrap every script in `sudo -n -- sh -c`, which no handler
			// expects.
			if c.User() != "root" {
				return nil, errors.New("fleet nodes accept root only")
			}
			if !bytes.Equal(k.Marshal(), want) {
				return nil, errors.New("key not authorized")
			}
			return nil, nil
		},
	}
	cfg.AddHostKey(signer)
	return cfg, signer, nil
}

func (f *Fleet) accept(n *node, l net.Listener) {
	defer f.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			c.Close()
			return
		}
		f.conns[c] = struct{}{}
		f.wg.Add(1)
		f.mu.Unlock()
		f.connections.Add(1)
		go f.serveConn(n, c)
	}
}

func (f *Fleet) serveConn(n *node, c net.Conn) {
	defer f.wg.Done()
	defer func() {
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
		c.Close()
	}()
	sc, chans, reqs, err := ssh.NewServerConn(c, n.config)
	if err != nil {
		return
	}
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.UnknownChannelType, "fleet nodes serve sessions only")
			continue
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.session(n, nc)
		}()
	}
}

// session plays one exec request and reports its exit status.
func (f *Fleet) session(n *node, nc ssh.NewChannel) {
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	started := false
	for req := range reqs {
		if req.Type != "exec" || started {
			// env, pty-req, signal...: the engine sends none that
			// matters (a signal comes with closing the channel).
			if req.WantReply {
				req.Reply(false, nil)
			}
			continue
		}
		var p struct{ Command string }
		if err := ssh.Unmarshal(req.Payload, &p); err != nil {
			req.Reply(false, nil)
			continue
		}
		started = true
		req.Reply(true, nil)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			code := f.exec(n, p.Command, &stdio{in: ch, out: ch, err: ch.Stderr()})
			ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
			ch.Close()
		}()
	}
}

// stdio are a command's streams.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}
