package etcd

import (
	"strings"
	"testing"

	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// An API server passes etcd's "leader changed" on where tracing replaces
// its etcd client's retries: v1.27 to v1.33 with APIServerTracing on, by
// default or set; not with it set off, not from v1.34, not before v1.27
// unless set on; a worker's facts, or a version that does not parse,
// name nobody.
func TestUnretriedAPIServers(t *testing.T) {
	for _, c := range []struct {
		version, gates string
		hit            bool
	}{
		{"v1.31.4", "", true},
		{"v1.27.0", "", true},
		{"v1.33.13", "SomeGate=true", true},
		{"v1.31.4", "APIServerTracing=true", true},
		{"v1.31.4", "A=true, APIServerTracing = false", false},
		{"v1.31.4", "APIServerTracing=False", false},
		{"v1.31.4", "APIServerTracing=maybe", true}, // not a setting: the default holds
		{"v1.34.0", "", false},
		{"v1.37.2", "APIServerTracing=true", false},
		{"v1.26.15", "", false},
		{"v1.26.15", "APIServerTracing=true", true},
		{"1.31", "", false},
	} {
		nodes := []nodeaccess.Address{{Name: "cp-1", Role: release.RoleControlPlane}, {Name: "worker-1", Role: release.RoleWorker}}
		facts := map[string]*nodefacts.Facts{
			"cp-1":     {Components: map[string]string{"kube-apiserver": c.version}, Values: map[string]string{"kube-apiserver --feature-gates": c.gates}},
			"worker-1": {Components: map[string]string{"kube-apiserver": "v1.31.4"}, Values: map[string]string{}},
		}
		msg, fix := Unretried(nodes, facts)
		if got := msg != ""; got != c.hit {
			t.Errorf("%s with --feature-gates=%q: named %v (%q), want %v", c.version, c.gates, got, msg, c.hit)
			continue
		}
		if c.hit && (!strings.Contains(msg, "cp-1 ("+c.version+")") || strings.Contains(msg, "worker-1") || !strings.Contains(fix, "--feature-gates=APIServerTracing=false")) {
			t.Errorf("%s: message %q, fix %q", c.version, msg, fix)
		}
	}
}

// One or two members lose their quorum while each restarts: said, naming
// them; three are not.
func TestWarningsOnQuorum(t *testing.T) {
	for n, want := range map[int]string{1: "one member (cp-1)", 2: "two members (cp-1, cp-2)", 3: ""} {
		var members []Member
		for i := 1; i <= n; i++ {
			members = append(members, Member{Node: "cp-" + string(rune('0'+i))})
		}
		ws := Warnings(nil, nil, members)
		switch {
		case want == "" && len(ws) > 0:
			t.Errorf("%d members: %+v", n, ws)
		case want != "" && (len(ws) != 1 || !strings.Contains(ws[0].Message, want) || !strings.Contains(ws[0].Message, "quorum")):
			t.Errorf("%d members: %+v, want one warning naming %s", n, ws, want)
		}
	}
}
