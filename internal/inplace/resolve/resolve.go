// Package resolve is what an apply does itself about the plan's blocking
// findings (a check ignored, a drain, labels put back, a control-plane
// move it resumes, nodes it leaves alone), and what the record keeps of
// the plan: each finding with how the run dealt with it.
package resolve

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
)

// Resolution is what an apply does itself that a blocking finding may
// be about: the checks it is told to ignore, a drain, labels put back,
// the control-plane nodes a run it resumes was moving, and the nodes
// whose kubelets it moves.
type Resolution struct {
	Ignore        []preflight.Check
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
func Unresolved(p *preflight.Plan, res Resolution) (blocking []string, waited []preflight.Finding) {
	for _, f := range p.Findings {
		if f.Severity != preflight.Blocking {
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
func (res Resolution) resolves(f preflight.Finding) (ok, wait bool) {
	how, wait := res.how(f)
	return how != "", wait
}

// how says, in words, how an apply with res deals with a blocking
// finding ("" when it does not).
func (res Resolution) how(f preflight.Finding) (how string, wait bool) {
	switch {
	case f.Check == preflight.CheckValues:
		return "", false // never ignored, whatever the node: nothing runs on values that did not parse
	case f.Node != "" && res.Selected != nil && !res.Selected(f.Node):
		return "about a node this run leaves alone", false
	case slices.Contains(res.Ignore, f.Check):
		return "ignored (--ignore-preflight " + string(f.Check) + ")", false
	case f.Check == preflight.CheckRestarts && res.Drain:
		return "drained first: nothing runs there to restart", false
	case f.Check == preflight.CheckHealth && len(res.ResumingControlPlane) > 0 &&
		(res.ResumingControlPlane[strings.TrimPrefix(f.Object, "apiserver/")] || strings.HasPrefix(f.Object, "lease/")):
		// The run this one resumes stopped while kubeadm moved a
		// control-plane node (it may be restarting that node's API
		// server, or the leaders, right now): the control plane step
		// follows that kubeadm run, waits for the node's static pods to
		// be Ready at the target, and for the leases before the next
		// node.
		return "waited for the control-plane move the run resumed", true
	case f.Check == preflight.CheckReadmission && f.Code == preflight.CodeLabelsMissing && res.RestoreLabels:
		return "labels put back before the kubelet (--restore-labels)", false
	}
	return "", false
}

// maxFindings bounds the findings the record keeps (one per pod can be
// thousands; the ConfigMap holds a mebibyte).
const maxFindings = 200

// Summary is what the record keeps of the plan an apply with res ran:
// the nodes' versions before, and each finding with how it was dealt
// with.
func Summary(p *preflight.Plan, res Resolution) *record.Plan {
	out := &record.Plan{}
	for _, n := range p.Nodes {
		out.Nodes = append(out.Nodes, record.PlannedNode{Name: n.Name, Role: n.Role, Kubelet: n.Kubelet, Components: n.Components, Runtime: n.Runtime})
	}
	for i, f := range p.Findings {
		if i == maxFindings {
			out.Omitted = len(p.Findings) - i
			break
		}
		how := "noted"
		switch f.Severity {
		case preflight.Warning:
			how = "a warning: the run went ahead"
		case preflight.Blocking:
			if how, _ = res.how(f); how == "" {
				how = "unresolved"
			}
		}
		out.Findings = append(out.Findings, record.Finding{Severity: string(f.Severity), Check: string(f.Check), Object: f.Object, Node: f.Node,
			Message: f.Message, Resolution: how})
	}
	return out
}
