package driver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/waiter"
)

// A part is one program a systemd unit runs on a node (an API server, a
// kubelet, kube-proxy): swapped forward, restored backward. The binary
// driver moves the control plane's parts; the runbook the kubelets and
// kube-proxy, on every kind of cluster.

// WaitPart waits for part to run version (and the API server to answer
// /readyz at the node's address).
func WaitPart(ctx context.Context, r *Run, o *nodeops.Ops, part, version string) error {
	if r.Dry {
		r.Fx.Would(o.Name, fmt.Sprintf("wait for %s to run %s and be healthy", part, version), "")
		return nil
	}
	defer r.Fx.Timed()()
	err := r.Wait.Poll(ctx, time.Second, r.ReadyTimeout, func(ctx context.Context) error {
		v, err := o.Running(ctx, part)
		switch {
		case err != nil:
			return err
		case v != version:
			return fmt.Errorf("%s runs %q, want %s", part, v, version)
		case part == "kube-apiserver" && r.REST != nil:
			return cluster.Readyz(ctx, r.REST, r.Addresses[o.Name].Address)
		}
		return nil
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("node %s: %s not healthy at %s within %s: %w", o.Name, part, version, r.ReadyTimeout, err)
	}
	return err
}

// PutBack restores part after a failed swap and waits for the old
// version (o.From); nil when it runs there again, else the cause with
// what failed. A run that lost its lock for good leaves the part to the
// run that holds it.
func PutBack(ctx context.Context, r *Run, o *nodeops.Ops, part string, cause error) error {
	if lost := r.Fx.Lost(); lost != nil {
		r.Log.Error("not rolled back: another run holds the upgrade lock now, and finishes the node", "node", o.Name, "component", part, "err", cause)
		return fmt.Errorf("%w; %s on node %s not rolled back: %w (the run that holds it finishes the node)", cause, part, o.Name, lost)
	}
	ctx = context.WithoutCancel(ctx)
	r.Log.Error("rolling back", "node", o.Name, "component", part, "err", cause)
	r.Fx.Event(ctx, o.Name, "RollingBack", fmt.Sprintf("kubelift: %s back to %s: %v", part, o.From, cause))
	if err := o.Restore(ctx, part); err != nil {
		return fmt.Errorf("%w; rollback of %s failed too: %w", cause, part, err)
	}
	if err := WaitPart(ctx, r, o, part, o.From); err != nil {
		return fmt.Errorf("%w; after rollback %s: %w", cause, part, err)
	}
	return nil
}

// RolledBack is the error of a node put back at o.From after cause.
func RolledBack(o *nodeops.Ops, cause error) error {
	return fmt.Errorf("%w: node %s rolled back to %s: %w", ErrNodeFailed, o.Name, o.From, cause)
}

// UndoPart puts part back at o.From when it runs the version it went to
// (o.To), and waits for it there; a part that never moved, or is back
// already, is left alone (false).
func UndoPart(ctx context.Context, r *Run, o *nodeops.Ops, part string) (bool, error) {
	now, err := o.Running(ctx, part)
	if err != nil {
		return false, fmt.Errorf("node %s: cannot tell whether %s moved, so it is not rolled back: %w", o.Name, part, err)
	}
	if now == "" {
		// Down (crashing on the new version, or between restarts): what
		// its unit would start says whether it moved.
		if now, err = o.Installed(ctx, part); err != nil {
			return false, fmt.Errorf("node %s: %s does not run and its program cannot be read, so it is not rolled back: %w", o.Name, part, err)
		}
		if now != o.To {
			r.Log.Warn("does not run, and its program is not the target's: left as it is", "node", o.Name, "component", part, "program", o.Binary(part), "version", now)
		}
	}
	if now != o.To {
		return false, nil
	}
	r.Log.Info("rolling back", "node", o.Name, "component", part, "to", o.From)
	r.Fx.MarkMoved(o.Name, part)
	if err := o.Restore(ctx, part); err != nil {
		return true, err
	}
	return true, WaitPart(ctx, r, o, part, o.From)
}

// Moved records, per node, the parts a run swapped or restored since the
// node's control plane was last settled ("" for the node's control plane
// as a whole, kubeadm's). Safe for concurrent use; the zero value is
// empty.
type Moved struct {
	mu sync.Mutex
	m  map[string]map[string]bool
}

// Mark records that part moved on node.
func (m *Moved) Mark(node, part string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[string]map[string]bool{}
	}
	if m.m[node] == nil {
		m.m[node] = map[string]bool{}
	}
	m.m[node][part] = true
}

// Take is what moved on node since the last Take (nil: nothing).
func (m *Moved) Take(node string) map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	parts := m.m[node]
	delete(m.m, node)
	return parts
}
