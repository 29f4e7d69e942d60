//go:build ignore

// kubelift: the hash-skip cache. Added to pkg/kubelet/kuberuntime by
// kubelift's kubelet build (hack/build-kubelet.sh); not upstream code.
//
// After an in-place upgrade across a kubelet hash era (1.30 -> 1.31), every
// running container's recorded hash differs from what this kubelet
// computes, and upstream restarts them all ("definition changed"). When
// kubelift has written the hash-skip file before restarting this kubelet,
// a container keeps running exactly when its recorded hash is the hash of
// its current spec in the era of the kubelet that ran before (the dual-era
// rule, github.com/kubelift/kubelift/pkg/hashskip, shared with kubelift):
// the old kubelet would see no change either. A spec changed since (an
// image set in place) is restarted, as upstream does.

package kuberuntime

import (
	"encoding/json"
	"hash/fnv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kubelift/kubelift/pkg/hashskip"

	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	hashutil "k8s.io/kubernetes/pkg/util/hash"
)

// kubeliftHashSkip caches the file, re-read at most every 10 seconds so
// that its removal (after convergence) takes effect.
var kubeliftHashSkip struct {
	sync.Mutex
	file *hashskip.File
	read time.Time
	now  func() time.Time
}

func kubeliftSkipFile() *hashskip.File {
	c := &kubeliftHashSkip
	c.Lock()
	defer c.Unlock()
	now := time.Now
	if c.now != nil {
		now = c.now
	}
	if !c.read.IsZero() && now().Sub(c.read) < 10*time.Second {
		return c.file
	}
	f, err := hashskip.Read(hashskip.Path())
	if err != nil {
		klog.ErrorS(err, "kubelift: ignoring the hash-skip file")
		f = nil
	}
	c.file, c.read = f, now()
	return f
}

// kubeliftOldEraHash is HashContainer of the kubelets of era, for the
// container's spec as it is now: the 1.16-1.30 kubelets' (fnv32a of the
// go-spew dump of the container's JSON), or this kubelet's own.
func kubeliftOldEraHash(container *v1.Container) func(era string) (uint64, bool) {
	return func(era string) (uint64, bool) {
		switch era {
		case hashskip.EraJSON, hashskip.EraJSONWithoutResources:
			hash := fnv.New32a()
			containerJSON, err := json.Marshal(container)
			if err != nil {
				return 0, false
			}
			hashutil.DeepHashObject(hash, containerJSON)
			return uint64(hash.Sum32()), true
		case hashskip.EraNameImage:
			return kubecontainer.HashContainer(container), true
		}
		return 0, false
	}
}

// kubeliftKeep reports whether a running container whose recorded hash
// differs from this kubelet's keeps running.
func kubeliftKeep(container *v1.Container, status *kubecontainer.Status) bool {
	f := kubeliftSkipFile()
	if f == nil {
		return false
	}
	keep := f.Keep(status.Hash, kubeliftOldEraHash(container))
	if keep {
		klog.V(2).InfoS("kubelift: container started by kubelet "+f.OldKubeletVersion+" keeps running: its spec hashes as that kubelet recorded it",
			"container", status.Name, "containerID", status.ID.String(), "era", f.OldHashEra)
	}
	return keep
}
