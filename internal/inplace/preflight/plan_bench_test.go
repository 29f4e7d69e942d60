package preflight_test

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/preflight/preflighttest"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// bigWorld is a plan's view of a cluster of n workers (plus cp-1) with
// podsPer pods each, every container running with the old kubelet's
// hash: what evaluate reads after the SSH reads.
func bigWorld(tb testing.TB, n, podsPer int) *preflighttest.World {
	w := preflighttest.New(tb)
	old, err := kubeletcompat.NewHasher(w.Catalog, "v1.30.14")
	if err != nil {
		tb.Fatal(err)
	}
	w.View.Nodes, w.View.Addresses = w.View.Nodes[:1], w.View.Addresses[:1]
	cpFacts := w.View.Facts["cp-1"]
	w.View.Facts = map[string]*nodefacts.Facts{"cp-1": cpFacts}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("worker-%05d", i)
		w.View.Nodes = append(w.View.Nodes, preflighttest.Node(name, "worker"))
		w.View.Addresses = append(w.View.Addresses, preflighttest.Address(name, release.RoleWorker))
		f := &nodefacts.Facts{Name: name, Components: map[string]string{"kubelet": "v1.30.14"}, Flags: map[string][]string{}, FlagSources: map[string]string{},
			Values: map[string]string{}, Staged: map[string]string{}, FreeBytes: 10 << 30}
		for j := 0; j < podsPer; j++ {
			p := preflighttest.Pod(fmt.Sprintf("p-%05d-%02d", i, j), name, j%3 != 0)
			p.UID = types.UID(fmt.Sprintf("uid-%05d-%02d", i, j))
			w.View.Pods = append(w.View.Pods, p)
			h, _ := old.Hash(&p.Spec.Containers[0])
			f.Containers = append(f.Containers, kubeletcompat.RuntimeContainer{ID: "c-" + string(p.UID), PodUID: string(p.UID), Namespace: p.Namespace,
				Pod: p.Name, Name: "app", Running: true, StartedAt: w.Opts.Now().Add(-time.Hour), Hash: kubeletcompat.Label(h)})
		}
		w.View.Facts[name] = f
	}
	w.Opts.MaxUnavailable = "100"
	return w
}

// BenchmarkPlan evaluates the plan of 500 and of 5000 workers with 30
// pods each (150,000 pods): every check, restart prediction included,
// over what the SSH reads returned. make bench-scale prints the times and
// their ratio to linear growth.
func BenchmarkPlan(b *testing.B) {
	for _, n := range []int{500, 5000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			w := bigWorld(b, n, 30)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p, err := preflight.Evaluate(b.Context(), w.Opts, w.View)
				if err != nil && p == nil {
					b.Fatal(err)
				}
				if len(p.Nodes) != n+1 {
					b.Fatalf("%d nodes planned", len(p.Nodes))
				}
			}
		})
	}
}
