package runbook

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/kubelift/kubelift/internal/inplace/drain"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/resolve"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// planStep builds the plan and refuses on blocking findings apply does
// not resolve itself.
func (r *upgradeRun) planStep(ctx context.Context) error {
	v, err := preflight.Read(ctx, r.opts.Plan)
	if err != nil {
		return err
	}
	p, err := preflight.Evaluate(ctx, r.opts.Plan, v)
	if err != nil && !errors.Is(err, preflight.ErrBlocked) {
		return err
	}
	r.plan, r.view, r.res.Plan = p, v, p
	r.driver = driverFor(v)
	r.tgts = map[string]nodeaccess.Address{}
	for _, t := range v.Addresses {
		r.tgts[t.Name] = t
	}
	for _, n := range r.opts.Nodes {
		if _, ok := r.tgts[n]; !ok {
			return fmt.Errorf("--nodes: node %s is not in the cluster", n)
		}
	}
	if r.opts.KubeadmConfig != nil {
		switch {
		case v.Kubeadm == nil:
			return fmt.Errorf("--kubeadm-config: the cluster was not built by kubeadm (no configmap %s/%s): there is no kubeadm to give it to", kubeadm.ConfigNamespace, kubeadm.ConfigMapName)
		case r.target.Version.Minor < 31:
			return fmt.Errorf("--kubeadm-config: kubeadm %s has no UpgradeConfiguration (kubeadm v1.31 and later do)", r.target.Version)
		}
	}
	recorded, err := record.Read(ctx, r.client)
	if err != nil {
		return err
	}
	r.resumingControlPlane = recorded.ControlPlaneInFlight(r.target.Version.String())
	blocking, waited := resolve.Unresolved(p, r.resolution())
	for _, f := range waited {
		r.log.Warn("resuming a control plane upgrade in flight: the control plane step waits for this", "object", f.Object, "finding", f.Message)
	}
	if len(blocking) > 0 {
		return fmt.Errorf("%w by %d findings (upgrade plan shows them):\n  %s", preflight.ErrBlocked, len(blocking), strings.Join(blocking, "\n  "))
	}
	done, err := r.done(ctx)
	if err != nil {
		return err
	}
	if done {
		r.res.NothingToDo = true
		r.log.Info("every node already runs the target: nothing to do", "version", r.target.Version.String())
	}
	return nil
}

// selected: the node's kubelet moves in this run (control-plane nodes and
// the chosen workers).
func (r *upgradeRun) selected(name string) bool {
	if len(r.opts.Nodes) == 0 && r.opts.Selector == nil {
		return true
	}
	if r.tgts[name].Role == release.RoleControlPlane || slices.Contains(r.opts.Nodes, name) {
		return true
	}
	if n := r.view.Node(name); n != nil && r.opts.Selector != nil {
		return r.opts.Selector.Matches(labels.Set(n.Labels))
	}
	return false
}

// done: every selected node's kubelet and every control-plane component
// run the target, and nothing a run left is unfinished: no Node carries
// kubelift's in-flight record or cordon, and the record of an upgrade to
// the target says it completed (a run that died after the last swap, or
// before its last step, is finished, not taken for done).
func (r *upgradeRun) done(ctx context.Context) (bool, error) {
	to := r.target.Version.String()
	for i := range r.view.Nodes {
		a := r.view.Nodes[i].Annotations
		if _, ok := a[record.AnnotationInFlight]; (ok || a[drain.AnnotationCordoned] == "true") && r.selected(r.view.Nodes[i].Name) {
			return false, nil
		}
	}
	s, err := record.Read(ctx, r.client)
	if err != nil {
		return false, err
	}
	if s != nil && s.To == to && s.State != record.StateComplete && s.State != record.StateRolledBack {
		if s.State != record.StateUpgradingKubelets {
			return false, nil
		}
		for _, e := range s.Nodes {
			if e.Status == record.NodeUpgrading {
				return false, nil
			}
		}
		// Manual mode leaves workers for a later apply; with none left,
		// the run that stopped never said complete.
		every := true
		for _, n := range r.plan.Nodes {
			every = every && n.AtTarget(r.target)
		}
		if every {
			return false, nil
		}
	}
	return r.plan.AllAtTarget(r.target, r.selected), nil
}

func (r *upgradeRun) stageStep(ctx context.Context) error {
	var missing []nodeaccess.Address
	for _, n := range r.plan.Nodes {
		// The plan reads what is staged of the target only: with hops, a
		// control-plane node is always passed to Stage, which sends only
		// what is not there.
		if !n.Staged || (len(r.target.Hops) > 0 && n.Role == release.RoleControlPlane) {
			missing = append(missing, r.tgts[n.Name])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if r.dry {
		for _, t := range missing {
			arch := release.ArchOr(r.nodeState(t.Name).Arch)
			would := func(rel *release.Release, names []string, label string) {
				for _, name := range names {
					if f, _, ok := rel.File(name, arch); ok {
						r.would(t.Name, "stage "+label+name+" (pulled from the registry where the node reaches it, else sent over SSH)",
							nodescript.StageFile.Show(release.StagePath(r.opts.Plan.StageDir, rel.Version.String(), ""), f.Name, f.SHA256, strconv.FormatInt(f.Size, 10), "zstd", "0"))
					}
				}
			}
			for _, h := range r.target.Hops {
				would(h, release.HopFilesForKind(r.driver.Kind(), t.Role), h.Version.String()+"/")
			}
			if !r.nodeState(t.Name).Staged {
				names, err := stage.NodeFiles(r.target, r.driver.Kind(), t.Role, r.view.Node(t.Name), arch)
				if err != nil {
					return err
				}
				would(r.target, names, "")
			}
		}
		return nil
	}
	_, err := stage.Run(ctx, stage.Options{Release: r.target, Source: r.opts.Source, Nodes: r.view.Nodes, Addresses: missing,
		Connector: r.opts.Plan.Connector, Parallel: r.opts.Plan.Parallel, StageDir: r.opts.Plan.StageDir, CacheDir: r.opts.CacheDir, Kind: r.driver.Kind(),
		Via: r.opts.Plan.StageVia, Codec: r.opts.Plan.StageCodec, NodeCredentials: r.opts.Plan.NodeCredentials, Log: r.log})
	return err
}

// resolution is what this run does itself about blocking findings.
func (r *upgradeRun) resolution() resolve.Resolution {
	return resolve.Resolution{Ignore: r.opts.Ignore, Drain: r.opts.Drain, RestoreLabels: r.opts.RestoreLabels,
		ResumingControlPlane: r.resumingControlPlane, Selected: r.selected}
}

// recordStep starts (or continues) the state record: an upgrade to
// another version, a completed one and a rolled-back one start afresh (a
// new etcd snapshot among them).
func (r *upgradeRun) recordStep(ctx context.Context) error {
	s, err := record.Read(ctx, r.client)
	if err != nil {
		return err
	}
	to := r.target.Version.String()
	if s == nil || s.To != to || s.State == record.StateComplete || s.State == record.StateRolledBack {
		s = &record.Upgrade{From: strings.Join(r.plan.From, ","), To: to, State: record.StateStarted, Started: r.opts.Plan.Now().UTC()}
	}
	s.Holder, s.Bundle, s.LastError, s.ControlPlane = r.opts.Holder, r.target.Record.BundleDigest, "", r.driver.Kind()
	s.Hops, s.Plan = r.plan.Hops, record.KeepBefore(s.Plan, resolve.Summary(r.plan, r.resolution()))
	for _, n := range r.plan.Nodes {
		e := s.Node(n.Name, n.Role)
		inFlight := false
		if node := r.view.Node(n.Name); node != nil {
			_, inFlight = node.Annotations[record.AnnotationInFlight]
		}
		if n.AtTarget(r.target) && e.Status != record.NodeDone && !inFlight {
			e.Status = record.NodeDone
		}
	}
	r.mu.Lock()
	r.state = s
	r.mu.Unlock()
	return r.save(ctx)
}
