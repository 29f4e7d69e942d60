package nodeaccess

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// HostKeyError is a host that presented a key its known_hosts file does not
// hold for it. The connection is dropped before any credential is offered.
type HostKeyError struct {
	Node       string        // node name
	Address    string        // node host:port
	Jump       string        // the jump host's host:port, when it is the jump host's key
	KnownHosts string        // the known_hosts file checked
	Mismatch   bool          // known_hosts holds other keys for this host; else it has none
	Key        ssh.PublicKey // the key the host presented; nil if it has none of a type known_hosts holds for it
}

func (e *HostKeyError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "node %s (%s): ", e.Node, e.Address)
	if e.Jump != "" {
		fmt.Fprintf(&b, "jump host %s: ", e.Jump)
	}
	if e.Mismatch {
		fmt.Fprintf(&b, "host key mismatch: the known_hosts file %s has another key for this host (possible man-in-the-middle)", e.KnownHosts)
	} else {
		fmt.Fprintf(&b, "unknown host: the known_hosts file %s has no key for this host", e.KnownHosts)
	}
	if e.Key == nil {
		b.WriteString("; it offers no key of the types listed there")
	} else {
		fmt.Fprintf(&b, "; it presented %s %s", e.Key.Type(), ssh.FingerprintSHA256(e.Key))
	}
	return b.String()
}

// hostKeyCheck checks one host's key. It keeps the typed error because
// ssh.NewClientConn reports it inside handshake text.
type hostKeyCheck struct {
	known ssh.HostKeyCallback
	tmpl  HostKeyError // everything but Mismatch and Key
	err   *HostKeyError
}

func (c *hostKeyCheck) callback(hostname string, remote net.Addr, key ssh.PublicKey) error {
	err := c.known(hostname, remote, key)
	var ke *knownhosts.KeyError
	if !errors.As(err, &ke) {
		return err // nil, or a revoked key
	}
	c.err = &c.tmpl
	c.err.Mismatch, c.err.Key = len(ke.Want) > 0, key
	return c.err
}

// noCommonHostKeyType reports whether a handshake failed because the host
// offered no key of the types knownAlgorithms asked for: a changed key, as
// far as known_hosts can tell. x/crypto says so only in words.
func noCommonHostKeyType(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no common algorithm for host key")
}

// knownAlgorithms lists the host key algorithms of the keys known_hosts
// holds for addr, so that a host with several keys presents one we know
// rather than the one the client likes best. It asks known with a key no
// host has: the refusal lists the keys it would have accepted.
func knownAlgorithms(known ssh.HostKeyCallback, addr string) []string {
	var ke *knownhosts.KeyError
	if !errors.As(known(addr, &net.TCPAddr{IP: net.IPv4zero}, probeKey{}), &ke) {
		return nil
	}
	var types []string
	for _, k := range ke.Want {
		types = append(types, k.Key.Type())
	}
	slices.Sort(types)
	var algos []string
	for _, t := range types {
		if t == ssh.KeyAlgoRSA { // an RSA key signs with any of these
			algos = append(algos, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256)
		}
		algos = append(algos, t)
	}
	return algos
}

// probeKey is a key no host has.
type probeKey struct{}

func (probeKey) Type() string                        { return "kubelift-probe" }
func (probeKey) Marshal() []byte                     { return []byte("kubelift-probe") }
func (probeKey) Verify([]byte, *ssh.Signature) error { return errors.New("probe key") }
