package inplace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/registry"
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
func (kubeadmDriver) Components(n *NodeState) []string {
	if n.Role != release.RoleControlPlane {
		return nil
	}
	return append([]string{}, release.ControlPlaneFiles...)
}

// BackupEtcd snapshots the local etcd from inside its static pod on the
// first control-plane node.
func (d kubeadmDriver) BackupEtcd(ctx context.Context, r *applyRun) (string, error) {
	if !d.cfg.LocalEtcd {
		return "", errors.New("the cluster's etcd is external (kubeadm-config etcd.external): back it up where it runs")
	}
	node := r.plan.firstControlPlane()
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
	if node == r.plan.firstControlPlane() {
		verb = "apply"
	}
	if allAt(at, to) {
		// Moved already, by a run this one resumes: kubeadm may still be
		// going past the static pods (its config, kubelet and addon
		// phases), or have stopped there. Follow it to its end (re-run
		// when it failed or was killed, as kubeadm's own advice is), so
		// that nothing else moves while it runs; then Ready there too.
		// A node moved without a kubeadm run of this upgrade is only
		// waited for.
		if err := r.onNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error {
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
				r.markMoved(node, "")
				if err := r.runKubeadm(ctx, o, run, args); err != nil {
					return err
				}
			}
			return r.waitStaticAt(ctx, o, to)
		}); err != nil {
			r.setNode(ctx, node, failedStatus(err), "kubeadm", err)
			return err
		}
		return r.waitAddons(ctx)
	}
	err = r.onNode(ctx, node, func(ctx context.Context, o *nodeops.Ops) error {
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
	})
	if err != nil {
		r.setNode(ctx, node, failedStatus(err), "kubeadm", err)
		return err
	}
	if !r.dry {
		r.log.Info("upgraded", "node", node, "control plane", "kubeadm", "version", to)
	}
	return r.waitAddons(ctx)
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
	if node != r.plan.firstControlPlane() {
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

// firstControlPlane is the control-plane node `kubeadm upgrade apply`
// runs on: the first in the plan's order ("" when none).
func (p *Plan) firstControlPlane() string {
	for _, n := range p.Nodes {
		if n.Role == release.RoleControlPlane {
			return n.Name
		}
	}
	return ""
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
	if _, err := o.Run(ctx, "check the staged kubeadm", nodescript.CheckFile, prog, r.fileSHA("kubeadm", archOr(r.nodeState(o.Name).Arch))); err != nil {
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

// staticVersions are the versions the node's control-plane static pods
// run, read from their mirror pods (component=NAME, the image's tag), for
// those Running and Ready only; a tag that does not parse is refused.
func (r *applyRun) staticVersions(ctx context.Context, node string) (map[string]string, error) {
	pods, err := r.client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node, LabelSelector: "tier=control-plane"})
	if err != nil {
		return nil, fmt.Errorf("node %s: list its control-plane pods: %w", node, err)
	}
	out := map[string]string{}
	for i := range pods.Items {
		comp, v, err := staticComponent(&pods.Items[i])
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", node, err)
		}
		if comp != "" && podReady(&pods.Items[i]) {
			out[comp] = v
		}
	}
	return out, nil
}

// staticComponent is the control-plane component a mirror pod runs and
// its version (the tag of its image): "" for other pods.
func staticComponent(p *corev1.Pod) (string, string, error) {
	comp := p.Labels["component"]
	if _, mirror := p.Annotations[kubeletcompat.MirrorAnnotation]; !mirror || !slices.Contains(release.ControlPlaneFiles, comp) {
		return "", "", nil
	}
	for _, c := range p.Spec.Containers {
		if c.Name != comp {
			continue
		}
		tag := kubeadm.ImageTag(c.Image)
		if tag == "" {
			return "", "", fmt.Errorf("pod %s/%s image %q: no tag to read its version from", p.Namespace, p.Name, c.Image)
		}
		v, err := catalog.ParseReported(tag)
		if err != nil {
			return "", "", fmt.Errorf("pod %s/%s image %q: %w", p.Namespace, p.Name, c.Image, err)
		}
		return comp, v.String(), nil
	}
	return "", "", nil
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func allAt(at map[string]string, to string) bool {
	for _, c := range release.ControlPlaneFiles {
		if at[c] != to {
			return false
		}
	}
	return true
}

// waitStaticAt waits until the node's control-plane static pods run the
// target and are Ready, and its API server answers /readyz.
func (r *applyRun) waitStaticAt(ctx context.Context, o *nodeops.Ops, to string) error {
	defer r.timed(&r.res.Waiting)()
	err := r.wait.Poll(ctx, time.Second, r.opts.ReadyTimeout, func(ctx context.Context) error {
		at, err := r.staticVersions(ctx, o.Name)
		if err != nil {
			return err
		}
		for _, c := range release.ControlPlaneFiles {
			if at[c] != to {
				return fmt.Errorf("%s runs %q (or is not Ready), want %s", c, at[c], to)
			}
		}
		if r.opts.Plan.REST != nil {
			return readyz(ctx, r.opts.Plan.REST, r.tgts[o.Name].Address)
		}
		return nil
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("node %s: the control plane is not Ready at %s within %s: %w", o.Name, to, r.opts.ReadyTimeout, err)
	}
	return err
}

// waitAddons waits until kubeadm's addons have rolled out: the kube-proxy
// DaemonSet's pods all updated and available, and so CoreDNS's
// Deployment; before that, a kubelet swap would see kube-proxy's
// containers replaced by the rollout and take it for a restart.
func (r *applyRun) waitAddons(ctx context.Context) error {
	if r.dry {
		r.would("", "wait for kubeadm's addons (kube-proxy, CoreDNS) to roll out", "")
		return nil
	}
	defer r.timed(&r.res.Waiting)()
	err := r.wait.Poll(ctx, time.Second, r.opts.ReadyTimeout, func(ctx context.Context) error {
		ds, err := r.client.AppsV1().DaemonSets(metav1.NamespaceSystem).Get(ctx, "kube-proxy", metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return err
		default:
			if why := daemonSetRolling(ds); why != "" {
				return errors.New(why)
			}
		}
		dep, err := r.client.AppsV1().Deployments(metav1.NamespaceSystem).Get(ctx, "coredns", metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return err
		default:
			if why := deploymentRolling(dep); why != "" {
				return errors.New(why)
			}
		}
		return nil
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("kubeadm's addons did not roll out within %s: %w", r.opts.ReadyTimeout, err)
	}
	return err
}

func daemonSetRolling(ds *appsv1.DaemonSet) string {
	s := ds.Status
	if s.ObservedGeneration < ds.Generation || s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberAvailable != s.DesiredNumberScheduled {
		return fmt.Sprintf("daemonset %s/%s rolling out: %d of %d updated, %d available", ds.Namespace, ds.Name, s.UpdatedNumberScheduled, s.DesiredNumberScheduled, s.NumberAvailable)
	}
	return ""
}

func deploymentRolling(d *appsv1.Deployment) string {
	s := d.Status
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	if s.ObservedGeneration < d.Generation || s.UpdatedReplicas != want || s.AvailableReplicas != want || s.Replicas != want {
		return fmt.Sprintf("deployment %s/%s rolling out: %d of %d updated, %d available", d.Namespace, d.Name, s.UpdatedReplicas, want, s.AvailableReplicas)
	}
	return ""
}

// staticComponents adds to a kubeadm control-plane node's components the
// versions its static control-plane pods run (their mirror pods' images,
// Running and Ready only); a version that does not parse is refused.
func (pc *planCheck) staticComponents(node string, comps map[string]string, bad []nodefacts.BadValue) (map[string]string, []nodefacts.BadValue) {
	out := map[string]string{}
	for k, v := range comps {
		out[k] = v
	}
	for i := range pc.view.pods {
		p := &pc.view.pods[i]
		if p.Spec.NodeName != node || p.Namespace != metav1.NamespaceSystem {
			continue
		}
		comp, v, err := staticComponent(p)
		if err != nil {
			bad = append(bad, nodefacts.BadValue{Node: node, Field: "pod " + p.Namespace + "/" + p.Name + " image", Value: imageOf(p), Reason: err.Error()})
			continue
		}
		if comp != "" && podReady(p) {
			out[comp] = v
		}
	}
	return out, bad
}

func imageOf(p *corev1.Pod) string {
	if len(p.Spec.Containers) > 0 {
		return p.Spec.Containers[0].Image
	}
	return ""
}

// kubeadmImages: on a kubeadm cluster, every image `kubeadm upgrade
// apply` will pull at the target is in the private registry where the
// cluster's imageRepository says (kubeadm's names, CoreDNS's path
// included), with the bundle's digest; and kubeadm restarts by design
// what the plan says it will.
func (pc *planCheck) kubeadmImages(ctx context.Context) {
	kc := pc.view.kubeadm
	if kc == nil {
		return
	}
	want, err := kc.Images(pc.target.Catalog)
	if err != nil {
		pc.add(Blocking, CheckKubeadm, "version/"+pc.target.Version.String(), err.Error(), "")
		return
	}
	imported := map[string]string{} // upstream ref -> digest the bundle holds
	var domain string
	for _, im := range pc.target.Record.Images {
		imported[im.Ref] = im.Digest
		if t, err := name.ParseReference(im.Target, name.WeakValidation); err == nil {
			domain = t.Context().RegistryStr()
		}
	}
	p := &registry.Pusher{Access: pc.opts.Access, Jobs: 4}
	for _, im := range want {
		ref, err := name.ParseReference(im.Want, name.WeakValidation)
		if err != nil {
			pc.add(Blocking, CheckKubeadm, "image/"+im.Want, fmt.Sprintf("kubeadm would pull %q: not an image reference: %v", im.Want, err), "fix imageRepository in kube-system/kubeadm-config")
			continue
		}
		if domain != "" && ref.Context().RegistryStr() != domain {
			pc.add(Warning, CheckKubeadm, "image/"+im.Want, fmt.Sprintf("kubeadm will pull %s from %s, not the private registry %s the bundle was imported to: not checked", im.Want, ref.Context().RegistryStr(), domain),
				"make sure the nodes can pull it (a containerd mirror), or point imageRepository at the private registry")
			continue
		}
		got, err := p.ManifestDigest(ctx, ref)
		switch {
		case err != nil:
			pc.add(Blocking, CheckKubeadm, "image/"+im.Want, fmt.Sprintf("cannot check the private registry for %s, which kubeadm upgrade pulls: %v", im.Want, err), "pass the registry flags (--username, --ca-file ...)")
		case got == (v1.Hash{}):
			pc.add(Blocking, CheckKubeadm, "image/"+im.Want, fmt.Sprintf("kubeadm upgrade pulls %s (imageRepository %s), which is not in the registry", im.Want, kc.ImageRepository),
				fmt.Sprintf("import the bundle so that its images land under %s (upgrade import --domain and --namespace; without --keep-path CoreDNS lands at NAMESPACE/coredns, as kubeadm asks for a custom repository)", kc.ImageRepository))
		case imported[im.Upstream] != "" && got.String() != imported[im.Upstream]:
			pc.add(Warning, CheckKubeadm, "image/"+im.Want, fmt.Sprintf("%s in the registry is %s, not the bundle's %s: kubeadm will run what the registry holds", im.Want, got, imported[im.Upstream]), "re-import the bundle to that place")
		}
	}
	// What kubeadm restarts, by design.
	var static, proxies int
	for i := range pc.view.pods {
		p := &pc.view.pods[i]
		if p.Namespace != metav1.NamespaceSystem {
			continue
		}
		if _, mirror := p.Annotations[kubeletcompat.MirrorAnnotation]; mirror && p.Labels["tier"] == "control-plane" {
			static++
		}
		if p.Labels["k8s-app"] == "kube-proxy" {
			proxies++
		}
	}
	pc.add(Info, CheckKubeadm, "cluster/kubeadm", fmt.Sprintf("kubeadm %s: `kubeadm upgrade apply %s` on %s, `kubeadm upgrade node` on every other node; by design kubeadm restarts the %d control-plane static pods it changes (etcd too when its manifest changes), rolls the kube-proxy DaemonSet (%d pods, its image names the version) and CoreDNS if its spec changes; no workload pod is restarted by kubeadm",
		kc.KubernetesVersion, pc.target.Version, pc.plan.firstControlPlane(), static, proxies), "")
}

// waitLeaders waits until the controller manager and the scheduler lead
// from processes that run now: each one's leader lease renewed after the
// holder's static pod started, and that pod Ready. kubeadm's first health
// check runs a Job that must complete within 15 seconds; right after a
// control plane was put back (a failed kubeadm run), a lease renewed by
// the process that was replaced still looks live while the new one waits
// for it to expire.
func (r *applyRun) waitLeaders(ctx context.Context) error {
	if r.dry {
		r.would("", "wait for the controller manager and scheduler to lead from the processes that run now", "")
		return nil
	}
	defer r.timed(&r.res.Waiting)()
	err := r.wait.Poll(ctx, time.Second, r.opts.ReadyTimeout, func(ctx context.Context) error {
		for _, comp := range []string{"kube-controller-manager", "kube-scheduler"} {
			if why := r.leadsNow(ctx, comp); why != "" {
				return errors.New(why)
			}
		}
		return nil
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("the control plane has no live leaders within %s: %w", r.opts.ReadyTimeout, err)
	}
	return err
}

// leadsNow says why comp does not lead from a process that runs now, or
// "" when it does. Its lease's holder is NODE_ID (the static pod's host
// name); a holder of another form is taken at its lease's word.
func (r *applyRun) leadsNow(ctx context.Context, comp string) string {
	l, err := r.client.CoordinationV1().Leases(metav1.NamespaceSystem).Get(ctx, comp, metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("lease kube-system/%s: %v", comp, err)
	}
	if l.Spec.HolderIdentity == nil || l.Spec.RenewTime == nil || *l.Spec.HolderIdentity == "" {
		return fmt.Sprintf("lease kube-system/%s has no holder", comp)
	}
	renewed := l.Spec.RenewTime.Time
	node, _, ok := strings.Cut(*l.Spec.HolderIdentity, "_")
	if !ok {
		return ""
	}
	p, err := r.client.CoreV1().Pods(metav1.NamespaceSystem).Get(ctx, comp+"-"+node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "" // not a static pod of this name: the lease's word
	}
	if err != nil {
		return fmt.Sprintf("pod kube-system/%s-%s: %v", comp, node, err)
	}
	if !podReady(p) {
		return fmt.Sprintf("%s on %s is not Ready", comp, node)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running != nil && !renewed.After(cs.State.Running.StartedAt.Time) {
			return fmt.Sprintf("%s's lease was last renewed (%s) before its process on %s started (%s): no leader yet", comp, renewed.Format(time.RFC3339), node, cs.State.Running.StartedAt.Format(time.RFC3339))
		}
	}
	return ""
}
