//go:build ignore

// kubelift: the hash-skip cache. Added to pkg/kubelet/kuberuntime by
// kubelift's kubelet build (hack/build-kubelet.sh); not upstream code.
//
// After an in-place upgrade across a kubelet hash era (1.30 -> 1.31), every
// running container's recorded hash differs from what this kubelet
// computes, and upstream restarts them all ("definition changed"). When
// kubelift has written the hash-skip file before restarting this kubelet,
// containers that were started before this kubelet keep running; the rule
// is github.com/kubelift/kubelift/pkg/hashskip, shared with kubelift.

package kuberuntime

import (
	"sync"
	"time"

	"k8s.io/component-base/version"
	"k8s.io/klog/v2"

	"github.com/kubelift/kubelift/pkg/hashskip"

	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
)

// kubeliftKubeletStart is when this kubelet process started (package
// initialization), the boundary of the rule.
var kubeliftKubeletStart = time.Now()

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

// kubeliftSkipHash reports whether the hash comparison is skipped for a
// running container.
func kubeliftSkipHash(status *kubecontainer.Status) bool {
	f := kubeliftSkipFile()
	if f == nil {
		return false
	}
	skip := f.Skip(version.Get().GitVersion, kubeliftKubeletStart, status.StartedAt)
	if skip {
		klog.V(2).InfoS("kubelift: container started by kubelet "+f.OldKubeletVersion+" keeps running despite a different spec hash",
			"container", status.Name, "containerID", status.ID.String())
	}
	return skip
}
