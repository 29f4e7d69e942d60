package kubeadm

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
)

// Settle: on a kubeadm node, the leaders' leases are renewed, the
// control-plane static pods run version and are Ready (waitStaticAt),
// lead from processes that run now (waitLeaders), and keep the same
// containers, none restarted, a health window later.
func (d Driver) Settle(ctx context.Context, r *driver.Run, node, version string, _ bool, _ map[string]bool) error {
	if err := driver.WaitLeasesRenewed(ctx, r); err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	window := r.HealthWindow
	return r.OnNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error {
		deadline := r.Wait.Now().Add(r.ReadyTimeout + 2*window)
		for {
			if err := d.waitStaticAt(ctx, r, o, version); err != nil {
				return err
			}
			if err := waitLeaders(ctx, r); err != nil {
				return err
			}
			before, err := staticContainers(ctx, r, node)
			if err != nil {
				return err
			}
			if err := r.Wait.Pause(ctx, window); err != nil {
				return err
			}
			after, err := staticContainers(ctx, r, node)
			if err != nil {
				return err
			}
			var moved []string
			for comp, id := range before {
				if after[comp] != id {
					moved = append(moved, fmt.Sprintf("%s (container %s, now %s)", comp, id, after[comp]))
				}
			}
			slices.Sort(moved)
			if len(moved) == 0 {
				return nil
			}
			if r.Wait.Now().After(deadline) {
				return fmt.Errorf("node %s: %s restarted within the health window (%s), again and again for %s", node, strings.Join(moved, ", "), window, r.ReadyTimeout+2*window)
			}
			r.Log.Warn("restarted within the health window: waiting for a steady one", "node", node, "parts", moved, "window", window)
		}
	})
}

// staticContainers maps each control-plane static pod on node to its
// container's ID and restart count, as the API says them.
func staticContainers(ctx context.Context, r *driver.Run, node string) (map[string]string, error) {
	pods, err := controlPlanePods(ctx, r, node)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for i := range pods {
		p := &pods[i]
		comp, _, err := preflight.StaticComponent(p)
		if err != nil || comp == "" {
			continue
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == comp {
				out[comp] = fmt.Sprintf("%s#%d", cs.ContainerID, cs.RestartCount)
			}
		}
	}
	return out, nil
}
