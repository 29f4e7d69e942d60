package preflight

import (
	"fmt"
	"slices"
	"strings"
)

// Resolution is what an apply does itself that a blocking finding may
// be about: the checks it is told to ignore, a drain, labels put back,
// the control-plane nodes a run it resumes was moving, and the nodes
// whose kubelets it moves.
type Resolution struct {
	Ignore        []Check
	Drain         bool
	RestoreLabels bool
	// ResumingControlPlane are the control-plane nodes kubeadm was
	// moving when the run this one resumes stopped.
	ResumingControlPlane map[string]bool
	Selected             func(node string) bool
}

// Unresolved are the plan's blocking findings an apply with res does not
// resolve itself, in words; waited are those it resolves by waiting for
// the control-plane move it resumes.
func (p *Plan) Unresolved(res Resolution) (blocking []string, waited []Finding) {
	for _, f := range p.Findings {
		if f.Severity != Blocking {
			continue
		}
		ok, wait := res.resolves(f)
		if wait {
			waited = append(waited, f)
		}
		if !ok {
			blocking = append(blocking, fmt.Sprintf("%s %s: %s", f.Check, f.Object, f.Message))
		}
	}
	return blocking, waited
}

// resolves says apply itself fixes a blocking finding, or it is about a
// worker this run leaves alone; wait, that it does so by waiting for the
// control-plane move it resumes.
func (res Resolution) resolves(f Finding) (ok, wait bool) {
	switch {
	case f.Check == CheckValues:
		return false, false // never ignored, whatever the node: nothing runs on values that did not parse
	case f.Node != "" && !res.Selected(f.Node), slices.Contains(res.Ignore, f.Check):
		return true, false
	case f.Check == CheckRestarts && res.Drain:
		return true, false // drained first: nothing runs there to restart
	case f.Check == CheckHealth && len(res.ResumingControlPlane) > 0 &&
		(res.ResumingControlPlane[strings.TrimPrefix(f.Object, "apiserver/")] || strings.HasPrefix(f.Object, "lease/")):
		// The run this one resumes stopped while kubeadm moved a
		// control-plane node (it may be restarting that node's API
		// server, or the leaders, right now): the control plane step
		// follows that kubeadm run, waits for the node's static pods to
		// be Ready at the target, and for the leases before the next
		// node.
		return true, true
	}
	return f.Check == CheckReadmission && f.Code == CodeLabelsMissing && res.RestoreLabels, false
}
