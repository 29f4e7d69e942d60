package etcd

import (
	"fmt"
	"strings"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// tracingGate is the API server's feature gate whose etcd client tracing,
// through v1.33, replaces the client's retries.
const tracingGate = "APIServerTracing"

// Unretried says which control-plane nodes run an API server that passes
// etcd's "leader changed" on to its clients, and what to do about it ("",
// "" where none does): kube-apiserver v1.27 to v1.33 with APIServerTracing
// on (its default from v1.27, when it went beta; before, only when set
// true). Its tracing interceptor is a DialOption of the etcd client,
// which the client adds after its own retrying interceptor, and gRPC
// keeps one: the last. v1.34 traces with a stats handler, and the retries
// stay. An etcd move hands the leadership over once (the leader moves
// last); a read in flight at that instant fails with a 500, and the API
// server's /readyz etcd check fails for a second (the sandbox measured it:
// 6 of 7 handovers with the gate on, 0 of 12 with it off; docs/etcd.md).
func Unretried(nodes []nodeaccess.Address, facts map[string]*nodefacts.Facts) (msg, fix string) {
	var hit []string
	for _, a := range nodes {
		f := facts[a.Name]
		if a.Role != release.RoleControlPlane || f == nil {
			continue
		}
		v, err := catalog.ParseReported(f.Components["kube-apiserver"])
		if err != nil || v.Major != 1 || v.Minor > 33 {
			continue // no API server read here (its own checks say so), or one that retries
		}
		on := v.Minor >= 27
		if set, ok := f.FeatureGate("kube-apiserver", tracingGate); ok {
			on = set
		}
		if on {
			hit = append(hit, a.Name+" ("+v.String()+")")
		}
	}
	if len(hit) == 0 {
		return "", ""
	}
	return fmt.Sprintf("the API servers on %s do not retry etcd's \"leader changed\" (%s is on: from v1.27 to v1.33 its etcd tracing replaces the etcd client's retries): a request in flight when etcd's leader hands over, once in this move, fails with a 500, and /readyz says etcd failed for about a second",
			strings.Join(hit, ", "), tracingGate),
		"let the API's clients retry (controllers do), or start those API servers with --feature-gates=" + tracingGate + "=false before the move (v1.34 retries with tracing on); docs/etcd.md"
}
