package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// fault makes a handler fail on a node: the next times commands (times <
// 0: every one) exit with code, saying so on stderr.
type fault struct {
	code, times int
}

// Fail makes the next times commands that handler plays on node exit with
// code (times < 0: all of them from now on); handler is a name of Stats'
// Commands ("back up", "swap", "running version" ...). For tests that
// inject a failure at each step of the engine.
func (f *Fleet) Fail(node, handler string, code, times int) {
	n := f.nodes[node]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.faults == nil {
		n.faults = map[string]*fault{}
	}
	n.faults[handler] = &fault{code: code, times: times}
}

// StopWhenRestarted makes unit on node stop (and stay stopped: a unit
// with no Restart=) whenever trigger restarts there, as a controller
// manager that leads exits when its API server restarts and it loses its
// lease.
func (f *Fleet) StopWhenRestarted(node, unit, trigger string) {
	n := f.nodes[node]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopsWith == nil {
		n.stopsWith = map[string]string{}
	}
	n.stopsWith[unit] = trigger
}

// block holds one command: reached is closed when it arrives, release
// lets it go on.
type block struct {
	reached, release chan struct{}
}

// Block holds the next command that handler plays on node until the
// returned release is called (a command that takes as long as the test
// says, the engine in the middle of a node step meanwhile); reached is
// closed when that command arrives. release may be called more than once.
func (f *Fleet) Block(node, handler string) (reached <-chan struct{}, release func()) {
	n := f.nodes[node]
	b := &block{reached: make(chan struct{}), release: make(chan struct{})}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.blocks == nil {
		n.blocks = map[string]*block{}
	}
	n.blocks[handler] = b
	var once sync.Once
	return b.reached, func() { once.Do(func() { close(b.release) }) }
}

// held waits while a Block holds handler's command on n (once).
func (n *node) held(handler string) {
	n.mu.Lock()
	b := n.blocks[handler]
	delete(n.blocks, handler)
	n.mu.Unlock()
	if b != nil {
		close(b.reached)
		<-b.release
	}
}

// injected reports the exit code of a fault for handler on n, consuming
// one of its times (0: none).
func (n *node) injected(handler string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	ft := n.faults[handler]
	if ft == nil || ft.times == 0 {
		return 0
	}
	if ft.times > 0 {
		ft.times--
	}
	return ft.code
}

// CrashAt makes unit on node exit at once whenever it starts at version
// (systemd reports MainPID 0), as a new binary that refuses a flag its
// release removed: it stops now if it runs that version.
func (f *Fleet) CrashAt(node, unit, version string) {
	n := f.nodes[node]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.crashes == nil {
		n.crashes = map[string]string{}
	}
	n.crashes[unit] = version
	if u := n.units[unit]; u != nil && u.version == version {
		u.version, u.pid, u.cmdline = "", 0, nil
	}
}

// RestartContainers makes every kubelet restart on node restart every
// container too (new container IDs), as upstream's kubelet does when the
// hash of every container changes: for tests of what the engine does
// once containers restarted.
func (f *Fleet) RestartContainers(node string) {
	n := f.nodes[node]
	n.mu.Lock()
	n.restartsContainers = true
	n.mu.Unlock()
}

// containerID is a container's ID on a node: ContainerID, and after
// restarts forced by RestartContainers, one per generation.
func containerID(uid types.UID, container string, generation int) string {
	if generation == 0 {
		return ContainerID(uid, container)
	}
	s := sha256.Sum256([]byte(string(uid) + "/" + container + "/" + strconv.Itoa(generation)))
	return hex.EncodeToString(s[:])
}

func injectedMessage(node, handler string, code int) string {
	return fmt.Sprintf("fleet: %s: %s: injected failure (exit %d)", node, handler, code)
}
