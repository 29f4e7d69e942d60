package nodestack

import (
	"context"
	"errors"
	"fmt"

	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/release"
)

// ToolsFor is the move of a node's CNI plugins and crictl the bundle
// makes (release.ToolsMoveFor): nil when it makes none.
func (m Mover) ToolsFor(arch string) *release.ToolsMove {
	return m.Target.ToolsMoveFor(release.ArchOr(arch))
}

// WouldTools says, for a dry run, the tools move node gets ("" for none).
func (m Mover) WouldTools(node, arch string) string {
	if m.ToolsFor(arch) == nil {
		return ""
	}
	p, err := m.toolsPaths(node)
	if err != nil {
		return "refuse the node: " + err.Error()
	}
	cni, crictl := p.Resolved()
	return fmt.Sprintf("move the CNI plugins in %s and crictl at %s to the bundle's where they differ (nothing restarts; put back on failure)", cni, crictl)
}

// MoveTools moves o's node's CNI plugins and crictl as tm says: tools-swap
// replaces each program that differs from the bundle's, its old one
// backed up; a node that has the bundle's already is left as it is. If
// the swap fails, what it replaced is put back and the error says so.
// Pods keep their network: a CNI plugin runs only when a pod's network is
// set up or torn down.
func (m Mover) MoveTools(ctx context.Context, o *nodeops.Ops, tm *release.ToolsMove) error {
	p, err := m.toolsPaths(o.Name)
	if err != nil {
		return err
	}
	moved, err := o.SwapTools(ctx, tm, p)
	if err != nil {
		if rerr := o.RestoreTools(context.WithoutCancel(ctx)); rerr != nil {
			return errors.Join(err, fmt.Errorf("node %s: putting the old CNI plugins and crictl back: %w", o.Name, rerr))
		}
		return fmt.Errorf("%w; the old CNI plugins and crictl are back", err)
	}
	if moved > 0 {
		m.Event(ctx, o.Name, "MovedTools", fmt.Sprintf("kubelift: %d CNI plugins and crictl moved to the bundle's", moved))
	}
	cni, crictl := p.Resolved()
	m.Log.Info("tools moved", "node", o.Name, "programs", moved, "cniBinDir", cni, "crictl", crictl)
	return nil
}

// undoTools restores the CNI plugins and crictl a tools move on o's node
// backed up, where one did; with would (a dry run), it says so instead.
func (m Mover) undoTools(ctx context.Context, o *nodeops.Ops, would func(node, what string)) error {
	backed, err := o.ToolsBackedUp(ctx)
	if err != nil || !backed {
		return err
	}
	if would != nil {
		would(o.Name, "put back the CNI plugins and crictl the tools move replaced, where it found them")
		return nil
	}
	return m.putToolsBack(ctx, o)
}

// putToolsBack restores the CNI plugins and crictl a tools move on o's
// node backed up, into the places the backup names (not the facts read
// now: a runtime that does not answer, a common reason to roll back, must
// not stop it).
func (m Mover) putToolsBack(ctx context.Context, o *nodeops.Ops) error {
	if err := o.RestoreTools(ctx); err != nil {
		return err
	}
	m.Event(ctx, o.Name, "ToolsRestored", "kubelift: CNI plugins and crictl put back")
	return nil
}

// toolsPaths are where node keeps its CNI plugins and crictl, as the plan
// read them (nodefacts' containerd section and `crictl info`); a node
// whose facts were not read takes nodeops' defaults. A node whose runtime
// did not say where it takes the plugins from is refused: the bundle's
// would go where nothing runs them.
func (m Mover) toolsPaths(name string) (release.ToolsPaths, error) {
	if m.View == nil || m.View.Facts[name] == nil {
		return release.ToolsPaths{}, nil
	}
	c := m.View.Facts[name].Containerd
	if c.CNIBinDir == "" && c.CNIErr != "" {
		return release.ToolsPaths{}, fmt.Errorf("node %s: where its runtime takes the CNI plugins from was not read (%s): the CNI plugins and crictl not moved", name, c.CNIErr)
	}
	return release.ToolsPaths{CNIBinDir: c.CNIBinDir, Crictl: c.Crictl}, nil
}

// PutToolsBackAfter puts back the CNI plugins and crictl a tools move on
// o's node backed up, after cause: a later step of the node's, before its
// kubelet moved, failed and put back what it moved (the runtime), so the
// node is left as it was. It returns cause, saying so, or joined with
// what failed.
func (m Mover) PutToolsBackAfter(ctx context.Context, o *nodeops.Ops, cause error) error {
	ctx = context.WithoutCancel(ctx)
	backed, err := o.ToolsBackedUp(ctx)
	if err != nil {
		return errors.Join(cause, fmt.Errorf("node %s: whether this upgrade moved its CNI plugins and crictl: %w", o.Name, err))
	}
	if !backed {
		return cause
	}
	if err := m.putToolsBack(ctx, o); err != nil {
		return errors.Join(cause, fmt.Errorf("node %s: putting the old CNI plugins and crictl back: %w", o.Name, err))
	}
	return fmt.Errorf("%w; the old CNI plugins and crictl are back", cause)
}
