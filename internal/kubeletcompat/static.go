package kubeletcompat

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/kubelift/kubelift/internal/catalog"
)

// MirrorAnnotation marks a mirror pod: the API's copy of a static pod the
// kubelet runs from a file on its node. Its value is the static pod's own
// UID, the one its containers carry in the runtime (the mirror pod's
// metadata.uid is the API server's and differs).
const MirrorAnnotation = "kubernetes.io/config.mirror"

// StaticUID returns the UID the kubelet gave a mirror pod's static pod,
// and whether pod is a mirror pod.
func StaticUID(pod *corev1.Pod) (string, bool) {
	uid, ok := pod.Annotations[MirrorAnnotation]
	return uid, ok && uid != ""
}

// ByRuntimeUID indexes pods by the UID their containers carry in the
// runtime: a pod's own, a mirror pod's static pod's.
func ByRuntimeUID(pods []*corev1.Pod) map[string]*corev1.Pod {
	out := make(map[string]*corev1.Pod, len(pods))
	for _, p := range pods {
		if uid, ok := StaticUID(p); ok {
			out[uid] = p
			continue
		}
		out[string(p.UID)] = p
	}
	return out
}

// StaticPodsRecreated says whether a kubelet moving from one version to
// another gives every static pod a new UID, and so kills its containers
// and starts the pod anew. The kubelet derives a static pod's UID from an
// MD5 of its decoded, defaulted internal Pod struct printed field by field
// (pkg/kubelet/config/common.go, applyDefaults and hash.DeepHashObject),
// nil fields included, so a field added to the Pod types changes every
// UID although no manifest changed: every minor adds some (1.31:
// PodSecurityContext.SupplementalGroupsPolicy, which every pod's
// defaulted security context prints). Patch releases add none.
// kubernetes#116080; no hash-skip file can keep them, since the old pod
// is gone, not changed.
func StaticPodsRecreated(from, to catalog.Version) bool {
	return from.Major != to.Major || from.Minor != to.Minor
}
