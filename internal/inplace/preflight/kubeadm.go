package preflight

import (
	"context"
	"fmt"
	"slices"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/registry"
)

// staticComponents adds to a kubeadm control-plane node's components the
// versions its static control-plane pods run (their mirror pods' images,
// Running and Ready only); a version that does not parse is refused.
func (pc *planCheck) staticComponents(node string, comps map[string]string, bad []nodefacts.BadValue) (map[string]string, []nodefacts.BadValue) {
	out := map[string]string{}
	for k, v := range comps {
		out[k] = v
	}
	for i := range pc.view.Pods {
		p := &pc.view.Pods[i]
		if p.Spec.NodeName != node || p.Namespace != metav1.NamespaceSystem {
			continue
		}
		comp, v, err := StaticComponent(p)
		if err != nil {
			bad = append(bad, nodefacts.BadValue{Node: node, Field: "pod " + p.Namespace + "/" + p.Name + " image", Value: imageOf(p), Reason: err.Error()})
			continue
		}
		if comp != "" && cluster.PodReady(p) {
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
	kc := pc.view.Kubeadm
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
		case got == (v1.Hash{}) && im.PinnedBy != "":
			pc.add(Blocking, CheckKubeadm, "image/"+im.Want, fmt.Sprintf("kubeadm upgrade pulls %s (its tag pinned by %s in kube-system/kubeadm-config), which is not in the registry", im.Want, im.PinnedBy),
				fmt.Sprintf("push that image to the registry, or remove %s so that kubeadm pulls the bundle's %s", im.PinnedBy, im.Upstream))
		case got == (v1.Hash{}):
			pc.add(Blocking, CheckKubeadm, "image/"+im.Want, fmt.Sprintf("kubeadm upgrade pulls %s (imageRepository %s), which is not in the registry", im.Want, kc.ImageRepository),
				fmt.Sprintf("import the bundle so that its images land under %s (upgrade import --domain and --namespace; without --keep-path CoreDNS lands at NAMESPACE/coredns, as kubeadm asks for a custom repository)", kc.ImageRepository))
		case im.PinnedBy == "" && imported[im.Upstream] != "" && got.String() != imported[im.Upstream]:
			pc.add(Warning, CheckKubeadm, "image/"+im.Want, fmt.Sprintf("%s in the registry is %s, not the bundle's %s: kubeadm will run what the registry holds", im.Want, got, imported[im.Upstream]), "re-import the bundle to that place")
		}
	}
	// What kubeadm restarts, by design.
	var static, proxies int
	for i := range pc.view.Pods {
		p := &pc.view.Pods[i]
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
		kc.KubernetesVersion, pc.target.Version, pc.plan.FirstControlPlane(), static, proxies), "")
}

// FirstControlPlane is the control-plane node `kubeadm upgrade apply`
// runs on: the first in the plan's order ("" when none).
func (p *Plan) FirstControlPlane() string {
	for _, n := range p.Nodes {
		if n.Role == release.RoleControlPlane {
			return n.Name
		}
	}
	return ""
}

// StaticComponent is the control-plane component a mirror pod runs and
// its version (the tag of its image): "" for other pods.
func StaticComponent(p *corev1.Pod) (string, string, error) {
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
