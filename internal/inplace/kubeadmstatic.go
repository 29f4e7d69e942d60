package inplace

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/registry"
	"github.com/kubelift/kubelift/internal/waiter"
)

// staticVersions are the versions the node's control-plane static pods
// run, read from their mirror pods (component=NAME, the image's tag), for
// those Running and Ready only; a tag that does not parse is refused.
func (r *applyRun) staticVersions(ctx context.Context, node string) (map[string]string, error) {
	pods, err := r.controlPlanePods(ctx, node)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for i := range pods {
		comp, v, err := staticComponent(&pods[i])
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", node, err)
		}
		if comp != "" && podReady(&pods[i]) {
			out[comp] = v
		}
	}
	return out, nil
}

// controlPlanePods lists the mirror pods of node's static control plane.
func (r *applyRun) controlPlanePods(ctx context.Context, node string) ([]corev1.Pod, error) {
	pods, err := r.client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node, LabelSelector: "tier=control-plane"})
	if err != nil {
		return nil, fmt.Errorf("node %s: list its control-plane pods: %w", node, err)
	}
	return pods.Items, nil
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
