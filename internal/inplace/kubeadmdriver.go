package inplace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/waiter"
)

// KubeadmRunDir is where, on a node, each kubeadm run kubelift starts
// keeps its output (NAME.log), exit status (NAME.rc) and pid.
const KubeadmRunDir = "/var/lib/kubelift/kubeadm"

// errKubeadmFailed: kubeadm ended with a status other than 0 (having put
// back what it moved, as it does on every error).
var errKubeadmFailed = errors.New("kubeadm failed")

// kubeadmTimeout bounds one `kubeadm upgrade` on a node: kubeadm waits up
// to 5 minutes for each static pod it moves, and etcd, the API server,
// the controller manager and the scheduler may each take that long.
const kubeadmTimeout = 25 * time.Minute

// kubeadmDriver upgrades a kubeadm-built control plane the way kubeadm's
// documentation does, with the target's kubeadm staged on every node:
// `kubeadm upgrade apply` on the first control-plane node, `kubeadm
// upgrade node` on the others, each run detached on the node and followed
// (a lost connection or a killed kubelift does not stop kubeadm halfway;
// the next run follows the same one). kubeadm moves the static pods one
// by one and puts a failed one back itself; kubelift reports its reason.
// Workers get `kubeadm upgrade node` (their kubelet's configuration)
// before their kubelet is swapped, as on any cluster.
type kubeadmDriver struct {
	cfg *kubeadm.Config
}

func (kubeadmDriver) Kind() string { return release.KindKubeadm }

// Components: every control-plane node runs all three as static pods.
func (kubeadmDriver) Components(n *preflight.NodeState) []string {
	return preflight.Components(release.KindKubeadm, n)
}

// BackupEtcd snapshots the local etcd from inside its static pod on the
// first control-plane node.
func (d kubeadmDriver) BackupEtcd(ctx context.Context, r *applyRun) (string, error) {
	if !d.cfg.LocalEtcd {
		return "", errors.New("the cluster's etcd is external (kubeadm-config etcd.external): back it up where it runs")
	}
	node := r.plan.FirstControlPlane()
	if node == "" {
		return "", errors.New("no control-plane node to back etcd up from")
	}
	snap := path.Join(r.opts.BackupDir, r.plan.From[0], fmt.Sprintf("etcd-snapshot-%s.db", r.opts.Plan.Now().UTC().Format("20060102T150405Z")))
	err := r.onNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error {
		_, err := o.Run(ctx, "etcd snapshot", nodescript.KubeadmEtcdSnapshot, snap, d.cfg.EtcdDataDir, path.Join(d.cfg.CertificatesDir, "etcd"))
		return err
	})
	if err != nil {
		return "", err
	}
	return node + ":" + snap, nil
}

// Upgrade runs `kubeadm upgrade apply` (first control-plane node) or
// `kubeadm upgrade node` (the others) unless every control-plane static
// pod of the node runs the target already, then waits until they do and
// are Ready, and until kubeadm's addons (kube-proxy, CoreDNS) have rolled
// out.
//
// t is the run's target: plan refuses hops on a kubeadm cluster.
func (d kubeadmDriver) Upgrade(ctx context.Context, r *applyRun, node string, t *release.Release) error {
	if t != r.target {
		return fmt.Errorf("node %s: kubelift moves a kubeadm control plane one minor at a time, not through %s", node, t.Version)
	}
	to := t.Version.String()
	// Read through an API server restart: a run resumed while kubeadm
	// moves the control plane may find it restarting.
	var at map[string]string
	err := r.wait.Poll(ctx, time.Second, r.opts.ReadyTimeout, func(ctx context.Context) error {
		var err error
		at, err = r.staticVersions(ctx, node)
		return err
	})
	if err != nil {
		return err
	}
	verb := "node" // kubeadm upgrade apply on the first, upgrade node on the others
	if node == r.plan.FirstControlPlane() {
		verb = "apply"
	}
	if allAt(at, to) {
		if err := r.onNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error { return d.follow(ctx, r, o, verb, to) }); err != nil {
			r.setNode(ctx, node, failedStatus(err), "kubeadm", err)
			return err
		}
		return r.waitAddons(ctx)
	}
	err = r.onNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error { return d.move(ctx, r, o, verb, to) })
	if err != nil {
		r.setNode(ctx, node, failedStatus(err), "kubeadm", err)
		return err
	}
	if !r.dry {
		r.log.Info("upgraded", "node", node, "control plane", "kubeadm", "version", to)
	}
	return r.waitAddons(ctx)
}

// follow finishes a node moved already, by a run this one resumes:
// kubeadm may still be going past the static pods (its config, kubelet
// and addon phases), or have stopped there. Follow it to its end (re-run
// when it failed or was killed, as kubeadm's own advice is), so that
// nothing else moves while it runs; then Ready there too. A node moved
// without a kubeadm run of this upgrade is only waited for.
func (kubeadmDriver) follow(ctx context.Context, r *applyRun, o *nodeops.Ops, verb, to string) error {
	if r.dry {
		return nil
	}
	run := r.kubeadmRun(verb)
	out, err := o.Run(ctx, "kubeadm status", nodescript.KubeadmStatus, KubeadmRunDir, run)
	if err != nil {
		return err
	}
	if status, rest, _ := strings.Cut(out, "\n"); strings.TrimSpace(status) != "lost" || strings.TrimSpace(rest) != "" {
		args, err := r.kubeadmArgs(ctx, o, verb)
		if err != nil {
			return err
		}
		r.markMoved(o.Name, "")
		if err := r.runKubeadm(ctx, o, run, args); err != nil {
			return err
		}
	}
	return r.waitStaticAt(ctx, o, to)
}

// move runs `kubeadm upgrade VERB` on the node once the leaders lead and
// the run holds the lock, and waits for the static pods at to. A kubeadm
// that fails puts the old manifests back itself: then the control plane
// is waited for at the old version and leading again, and the error wraps
// ErrNodeFailed.
func (kubeadmDriver) move(ctx context.Context, r *applyRun, o *nodeops.Ops, verb, to string) error {
	node := o.Name
	r.setNode(ctx, node, record.NodeUpgrading, "kubeadm", nil)
	args, err := r.kubeadmArgs(ctx, o, verb)
	if err != nil {
		return err
	}
	run := r.kubeadmRun(verb)
	r.event(ctx, node, "UpgradingControlPlane", fmt.Sprintf("kubelift: kubeadm %s (%s -> %s)", strings.Join(args, " "), o.From, to))
	if err := r.waitLeaders(ctx); err != nil {
		return err
	}
	if err := r.fence(ctx); err != nil {
		return fmt.Errorf("node %s: kubeadm not started: %w", node, err)
	}
	r.markMoved(node, "")
	if err := r.runKubeadm(ctx, o, run, args); err != nil {
		if !errors.Is(err, errKubeadmFailed) {
			return err
		}
		// kubeadm put the old manifests back: wait until the control
		// plane runs them again (its API server restarts meanwhile).
		if werr := r.waitStaticAt(ctx, o, o.From); werr != nil {
			return fmt.Errorf("%w; after it, the control plane is not back at %s: %v", err, o.From, werr)
		}
		// ... and leads again (the next run's plan checks the leases).
		if werr := r.waitLeaders(ctx); werr != nil {
			return fmt.Errorf("%w; after it, %v", err, werr)
		}
		return fmt.Errorf("%w: %w; kubeadm put node %s's control plane back at %s", ErrNodeFailed, err, node, o.From)
	}
	if r.dry {
		r.would(node, "wait for the control plane's static pods to run "+to+" and be Ready", "")
		return nil
	}
	return r.waitStaticAt(ctx, o, to)
}

// Undo puts node's control plane back at the version the run started
// from with the manifests kubeadm kept (kubeadmrollback.go), and waits
// for it there; a control plane that never moved (kubeadm put it back, or
// was never run) is left as it is. After the first control-plane node,
// what `kubeadm upgrade apply` changed in the cluster goes back too.
func (d kubeadmDriver) Undo(ctx context.Context, r *applyRun, node string) error {
	from, to := r.plan.From[0], r.target.Version.String()
	keep := path.Join(kubeadm.TmpDir, fmt.Sprintf("kubelift-rollback-manifests-%d", r.startedUnix()))
	err := r.onNodeFrom(ctx, node, from, func(ctx context.Context, o *nodeops.Ops) error {
		current, backups, err := readManifests(ctx, o)
		if err != nil {
			return err
		}
		restores, err := manifestRestores(node, from, to, current, backups)
		if err != nil || len(restores) == 0 {
			return err
		}
		r.setNode(ctx, node, record.NodeUpgrading, "kubeadm", nil)
		r.markMoved(node, "")
		for _, m := range restores {
			r.log.Info("rolling back", "node", node, "component", m.Component, "to", from, "manifest", m.Backup)
			if _, err := o.Run(ctx, "restore "+m.Component+"'s manifest", nodescript.KubeadmRestoreManifest, m.Backup, m.Current, keep); err != nil {
				return err
			}
		}
		if r.dry {
			r.would(node, "wait for the control plane's static pods to run "+from+" and be Ready", "")
			return nil
		}
		if err := r.waitStaticAt(ctx, o, from); err != nil {
			return err
		}
		r.setNode(ctx, node, record.NodeRolledBack, "kubeadm", nil)
		return nil
	})
	if err != nil {
		r.setNode(ctx, node, record.NodeFailed, "kubeadm", err)
		return err
	}
	if node != r.plan.FirstControlPlane() {
		return nil
	}
	return d.undoCluster(ctx, r, from, to)
}

// undoCluster puts back what `kubeadm upgrade apply` changed beyond the
// node: kubeadm-config's kubernetesVersion and the kube-proxy DaemonSet's
// image (then waits for its rollout). CoreDNS is left: kubeadm names one
// CoreDNS per minor, and only patch downgrades are rolled back.
func (kubeadmDriver) undoCluster(ctx context.Context, r *applyRun, from, to string) error {
	if r.dry {
		r.would("", "set kubeadm-config's kubernetesVersion and the kube-proxy DaemonSet's image back to "+from+" (where they say "+to+")", "")
		return r.waitAddons(ctx)
	}
	changed, err := kubeadm.SetVersion(ctx, r.client, to, from)
	if err != nil {
		return err
	}
	if changed {
		r.log.Info("rolled back", "configmap", kubeadm.ConfigNamespace+"/"+kubeadm.ConfigMapName, "kubernetesVersion", from)
	}
	if changed, err = kubeadm.SetProxyTag(ctx, r.client, to, from); err != nil {
		return err
	}
	if changed {
		r.log.Info("rolled back", "daemonset", "kube-system/kube-proxy", "tag", from)
	}
	return r.waitAddons(ctx)
}

// BeforeKubelet runs `kubeadm upgrade node` on a worker (its kubelet's
// configuration for the target), before its kubelet is swapped; control
// planes had theirs in the control-plane step.
func (d kubeadmDriver) BeforeKubelet(ctx context.Context, r *applyRun, o *nodeops.Ops) error {
	if r.tgts[o.Name].Role == release.RoleControlPlane {
		return nil
	}
	args, err := r.kubeadmArgs(ctx, o, "node")
	if err != nil {
		return err
	}
	return r.runKubeadm(ctx, o, r.kubeadmRun("node"), args)
}

// kubeadmArgs are the arguments of `kubeadm upgrade VERB` on the node:
// --patches when the node has kubeadm's patches directory, and with
// --kubeadm-config the node's UpgradeConfiguration, put on the node first
// (it then says the patches directory: kubeadm refuses the flag beside
// --config).
func (r *applyRun) kubeadmArgs(ctx context.Context, o *nodeops.Ops, verb string) ([]string, error) {
	patches, err := o.Exists(ctx, kubeadm.PatchesDir)
	if err != nil {
		return nil, err
	}
	config := ""
	if c := r.opts.KubeadmConfig; c != nil {
		data, at, err := c.ForNode(KubeadmRunDir, patches)
		if err != nil {
			return nil, fmt.Errorf("--kubeadm-config: %w", err)
		}
		if r.dry {
			r.would(o.Name, "put the UpgradeConfiguration (--kubeadm-config) at "+at, "")
		} else if _, err := o.Node.Upload(ctx, at, 0o600, bytes.NewReader(data)); err != nil {
			return nil, err
		}
		config = at
	}
	if verb == "apply" {
		return kubeadm.ApplyArgs(r.target.Version.String(), patches, config), nil
	}
	return kubeadm.NodeArgs(patches, config), nil
}

// kubeadmRun names a kubeadm run of this upgrade on a node:
// upgrade-VERB-VERSION-STARTED (the upgrade record's start, in Unix
// seconds), so that a resumed run follows, or does not repeat, the one
// this upgrade started, and a later upgrade to the same version (after a
// rollback) runs kubeadm anew.
func (r *applyRun) kubeadmRun(verb string) string {
	return fmt.Sprintf("upgrade-%s-%s-%d", verb, r.target.Version, r.startedUnix())
}

// startedUnix is the upgrade record's start in Unix seconds (0 without
// one).
func (r *applyRun) startedUnix() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != nil {
		return r.state.Started.Unix()
	}
	return 0
}

// runKubeadm starts the staged kubeadm on the node with args, detached,
// as run NAME (or follows the one already going), and waits until it
// ends; an exit other than 0 is the node failed, with kubeadm's last
// lines for its reason.
func (r *applyRun) runKubeadm(ctx context.Context, o *nodeops.Ops, run string, args []string) error {
	prog := release.StagePath(r.opts.Plan.StageDir, r.target.Version.String(), "kubeadm")
	start := append([]string{KubeadmRunDir, run, prog}, args...)
	if r.dry {
		r.would(o.Name, "kubeadm "+strings.Join(args, " "), nodescript.KubeadmStart.Show(start...))
		return nil
	}
	// The staged kubeadm runs as root and no swap checks it: its signed
	// sum is checked on the node first.
	if _, err := o.Run(ctx, "check the staged kubeadm", nodescript.CheckFile, prog, r.fileSHA("kubeadm", release.ArchOr(r.nodeState(o.Name).Arch))); err != nil {
		return err
	}
	out, err := o.Run(ctx, "start kubeadm", nodescript.KubeadmStart, start...)
	if err != nil {
		return err
	}
	r.log.Info("kubeadm", "node", o.Name, "run", run, "args", strings.Join(args, " "), "state", strings.TrimSpace(out))
	defer r.timed(&r.res.Waiting)()
	var tail string
	err = r.wait.Poll(ctx, 2*time.Second, kubeadmTimeout, func(ctx context.Context) error {
		out, err := o.Run(ctx, "kubeadm status", nodescript.KubeadmStatus, KubeadmRunDir, run)
		if err != nil {
			return err // the node may be busy restarting its API server: try again
		}
		status, rest, _ := strings.Cut(out, "\n")
		tail = strings.TrimSpace(rest)
		switch status = strings.TrimSpace(status); {
		case status == "running":
			return errors.New("kubeadm is running")
		case status == "exit 0":
			return nil
		case strings.HasPrefix(status, "exit "):
			code, err := strconv.Atoi(strings.TrimPrefix(status, "exit "))
			if err != nil {
				return waiter.Stop(fmt.Errorf("node %s: kubeadm status %q: not an exit status", o.Name, status))
			}
			return waiter.Stop(fmt.Errorf("%w: node %s: kubeadm %s exited %d: %s", errKubeadmFailed, o.Name, strings.Join(args, " "), code, kubeadmReason(tail)))
		default:
			return waiter.Stop(fmt.Errorf("node %s: kubeadm %s stopped without an exit status (%q; killed?), what it moved may not be back: %s", o.Name, strings.Join(args, " "), status, kubeadmReason(tail)))
		}
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("node %s: kubeadm %s still running after %s (it goes on; %s/%s.log on the node says how): %s", o.Name, strings.Join(args, " "), kubeadmTimeout, KubeadmRunDir, run, kubeadmReason(tail))
	}
	return err
}

// kubeadmReason is what kubeadm said last, for an error message: the
// static pod it was moving when it stopped ("Preparing for "NAME"
// upgrade"), then its "error execution phase" or FATAL line and what
// follows when there is one, else its last lines.
func kubeadmReason(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	moving := ""
	for _, l := range lines {
		if _, rest, ok := strings.Cut(l, `Preparing for "`); ok {
			if name, _, ok := strings.Cut(rest, `"`); ok {
				moving = name
			}
		}
	}
	for i, l := range lines {
		if strings.Contains(l, "error execution phase") || strings.Contains(l, "[upgrade/apply] FATAL") || strings.HasPrefix(l, "error: ") {
			lines = lines[i:]
			break
		}
	}
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	if moving != "" {
		return "while it moved " + moving + ": " + strings.Join(lines, " | ")
	}
	return strings.Join(lines, " | ")
}
