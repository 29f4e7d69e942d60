package runbook

import (
	"context"
	"fmt"
)

// settleControlPlane is asked after every control-plane node's step,
// forward (each hop, and the target) and backward (rollback): the run
// goes on only when the controller manager's and scheduler's leases are
// renewed again by a live holder, every part on the node runs version
// (read from the running process; a part that is down is started and
// waited for), and each is still the same process a health window
// later. An API server's restart makes the controller manager and
// scheduler that lead lose their leases and exit; without this, a step
// could end (and rollback say "rolled back") before their units started
// them again, or for good where a unit has no Restart=.
//
// At a hop (atLeast), a part past version (a run resumed past the hop) is
// as good as one at it.
//
// moved are the parts the step swapped or restored: with those the node
// ran before, they are the parts that must run (a unit the operator keeps
// stopped is left so).
func (r *upgradeRun) settleControlPlane(ctx context.Context, node, version string, atLeast bool, moved map[string]bool) error {
	window := r.opts.Plan.HealthWindow
	if r.dry {
		r.would(node, fmt.Sprintf("wait for every control-plane part to run %s (starting one that is down), the controller manager's and scheduler's leases renewed, and each part the same process %s later", version, window), "")
		return nil
	}
	defer r.timed(&r.res.Waiting)()
	return r.driver.Settle(ctx, r.driverRun(), node, version, atLeast, moved)
}
