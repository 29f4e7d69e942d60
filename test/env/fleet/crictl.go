package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
)

const byNode = "spec.nodeName"

// podIndex is one shared informer on every Pod (one LIST and WATCH for the
// whole fleet), indexed by node.
type podIndex struct {
	informer cache.SharedIndexInformer
	cancel   context.CancelFunc
	done     chan struct{}
}

// startPodIndex starts the informer; bound(node, uid, true) is called for
// each pod bound to a node, bound(node, uid, false) when it is deleted.
func startPodIndex(ctx context.Context, c kubernetes.Interface, bound func(node string, uid types.UID, present bool)) (*podIndex, error) {
	ctx, cancel := context.WithCancel(ctx)
	lw := &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			return c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			return c.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, o)
		},
	}
	// The fake clientset sends no end-of-initial-events bookmark: the
	// wrapper tells the reflector so, and it lists and watches instead.
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, c), &corev1.Pod{}, 0, cache.Indexers{byNode: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			return []string{p.Spec.NodeName}, nil
		}
		return nil, nil
	}})
	// Thousands of pods: keep only what crictl shows and the hashes need.
	_ = inf.SetTransform(func(obj any) (any, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			p.ManagedFields = nil
		}
		return obj, nil
	})
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
				bound(p.Spec.NodeName, p.UID, true)
			}
		},
		UpdateFunc: func(_, obj any) {
			if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
				bound(p.Spec.NodeName, p.UID, true)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
				bound(p.Spec.NodeName, p.UID, false)
			}
		},
	})
	if err != nil {
		cancel()
		return nil, err
	}
	p := &podIndex{informer: inf, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		inf.Run(ctx.Done())
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced, reg.HasSynced) {
		p.stop()
		return nil, fmt.Errorf("fleet: pods: the informer did not sync: %w", context.Cause(ctx))
	}
	return p, nil
}

func (p *podIndex) stop() {
	p.cancel()
	<-p.done
}

// onNode returns the pods bound to node, by namespace and name.
func (p *podIndex) onNode(node string) []*corev1.Pod {
	objs, _ := p.informer.GetIndexer().ByIndex(byNode, node)
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		pods = append(pods, o.(*corev1.Pod))
	}
	sort.Slice(pods, func(i, j int) bool {
		return pods[i].Namespace < pods[j].Namespace || pods[i].Namespace == pods[j].Namespace && pods[i].Name < pods[j].Name
	})
	return pods
}

// podBound records which kubelet created a pod's containers: the one the
// node runs when the pod is first seen there (the node's first kubelet for
// pods already there at Start).
func (f *Fleet) podBound(name string, uid types.UID, present bool) {
	n := f.nodes[name]
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !present {
		delete(n.created, uid)
		return
	}
	if _, ok := n.created[uid]; !ok {
		n.created[uid] = n.kubelet
	}
}

// ContainerID is the id of a pod's container on a fleet node: the same
// across kubelet restarts, as the kubelet keeps a running container.
func ContainerID(uid types.UID, container string) string {
	s := sha256.Sum256([]byte(string(uid) + "/" + container))
	return hex.EncodeToString(s[:])
}

// crictlContainer is a container as `crictl ps -o json` prints it (the
// CRI ListContainersResponse as protojson; see test/env/sandbox's Crictl).
type crictlContainer struct {
	ID           string            `json:"id"`
	PodSandboxID string            `json:"podSandboxId"`
	Metadata     map[string]any    `json:"metadata"`
	Image        map[string]string `json:"image"`
	ImageRef     string            `json:"imageRef"`
	State        string            `json:"state"`
	CreatedAt    string            `json:"createdAt"`
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations"`
}

// crictlPS is `crictl ps -o json` on n: a running container for each
// container of each pod bound to it that has not ended, carrying the hash
// the kubelet that created it computed.
func (f *Fleet) crictlPS(n *node) ([]byte, error) {
	doc := struct {
		Containers []crictlContainer `json:"containers"`
	}{Containers: []crictlContainer{}}
	if f.pods != nil {
		for _, p := range f.pods.onNode(n.spec.Name) {
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			n.mu.Lock()
			version, ok := n.created[p.UID]
			if !ok {
				// Seen by the index before its handler ran: created now.
				version = n.kubelet
			}
			generation := n.generation
			n.mu.Unlock()
			h := f.hashers.get(version, f.cfg.Log)
			created := p.CreationTimestamp.Time
			if p.Status.StartTime != nil {
				created = p.Status.StartTime.Time
			}
			restarts := map[string]int32{}
			for _, s := range p.Status.ContainerStatuses {
				restarts[s.Name] = s.RestartCount
			}
			sandbox := ContainerID(p.UID, "")
			for i := range p.Spec.Containers {
				c := &p.Spec.Containers[i]
				ann := map[string]string{
					"io.kubernetes.container.restartCount":             strconv.Itoa(int(restarts[c.Name])),
					"io.kubernetes.container.terminationMessagePath":   c.TerminationMessagePath,
					"io.kubernetes.container.terminationMessagePolicy": string(c.TerminationMessagePolicy),
					"io.kubernetes.pod.terminationGracePeriod":         "30",
				}
				if h != nil {
					if sum, err := h.Hash(c); err == nil {
						ann[kubeletcompat.HashAnnotation] = kubeletcompat.Label(sum)
					}
					if sum, ok, err := h.HashWithoutResources(c); ok && err == nil {
						ann[kubeletcompat.HashWithoutResourcesAnnotation] = kubeletcompat.Label(sum)
					}
				}
				doc.Containers = append(doc.Containers, crictlContainer{
					ID: containerID(p.UID, c.Name, generation), PodSandboxID: sandbox,
					Metadata: map[string]any{"name": c.Name, "attempt": restarts[c.Name]},
					Image:    map[string]string{"image": c.Image}, ImageRef: c.Image, State: "CONTAINER_RUNNING",
					CreatedAt: strconv.FormatInt(created.UnixNano(), 10),
					Labels: map[string]string{"io.kubernetes.container.name": c.Name, "io.kubernetes.pod.name": p.Name,
						"io.kubernetes.pod.namespace": p.Namespace, "io.kubernetes.pod.uid": string(p.UID)},
					Annotations: ann,
				})
			}
		}
	}
	return json.MarshalIndent(doc, "", "  ")
}

// hashers keeps one container hasher per kubelet version.
type hashers struct {
	cat *catalog.Catalog
	mu  sync.Mutex
	by  map[string]*hasherEntry
}

type hasherEntry struct{ h *kubeletcompat.Hasher }

// get returns version's hasher, or nil (logged once) for a version whose
// hash the catalog does not know: its containers then carry no hash.
func (hs *hashers) get(version string, log func(string, ...any)) *kubeletcompat.Hasher {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if e, ok := hs.by[version]; ok {
		return e.h
	}
	h, err := kubeletcompat.NewHasher(hs.cat, version)
	if err != nil {
		log("fleet: containers created by kubelet %q carry no hash: %v", version, err)
	}
	hs.by[version] = &hasherEntry{h: h}
	return h
}
