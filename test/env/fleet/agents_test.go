package fleet

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubelift/kubelift/internal/agent/access"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// Through the fleet's agents (kubelift's agent loop, one per node) a node
// answers the engine's scripts as over SSH: the facts read either way are
// the same, and a file put through its agent is there to read.
func TestAgentsAnswerAsSSHDoes(t *testing.T) {
	w := newWorld(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A real API server sends a watch only the objects its label
	// selector picks (each agent its own node's requests); the fake
	// sends every one unless told.
	w.client.PrependWatchReactor("secrets", func(a k8stesting.Action) (bool, watch.Interface, error) {
		wa := a.(k8stesting.WatchAction)
		wi, err := w.client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		sel := wa.GetWatchRestrictions().Labels
		return true, watch.Filter(wi, func(e watch.Event) (watch.Event, bool) {
			m, ok := e.Object.(metav1.Object)
			return e, ok && (sel == nil || sel.Matches(labels.Set(m.GetLabels())))
		}), nil
	})
	stop := w.fleet.ServeAgents(ctx, w.client, slog.New(slog.DiscardHandler))
	defer stop()
	conn := &access.Connector{Client: w.client, Run: "r1", Poll: 10 * time.Millisecond}
	defer func() { _ = conn.Stop(context.Background()) }()
	for _, name := range []string{"cp-1", "worker-1"} {
		overSSH, err := nodefacts.Read(ctx, w.dial(t, name), name, release.DefaultStageDir, newVersion)
		if err != nil {
			t.Fatal(err)
		}
		n, err := conn.Dial(ctx, nodeaccess.Address{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		overAgent, err := nodefacts.Read(ctx, n, name, release.DefaultStageDir, newVersion)
		if err != nil {
			t.Fatal(err)
		}
		if a, b := fmt.Sprintf("%+v", overSSH), fmt.Sprintf("%+v", overAgent); a != b {
			t.Errorf("%s: facts over SSH\n%s\nover its agent\n%s", name, a, b)
		}
	}
	n, err := conn.Dial(ctx, nodeaccess.Address{Name: "worker-2"})
	if err != nil {
		t.Fatal(err)
	}
	const file = "/var/lib/kubelift/kubeadm/upgrade.yaml"
	if _, err := n.Upload(ctx, file, 0o600, bytes.NewReader([]byte("kind: UpgradeConfiguration\n"))); err != nil {
		t.Fatal(err)
	}
	if got, ok := w.fleet.ReadFile("worker-2", file); !ok || string(got) != "kind: UpgradeConfiguration\n" {
		t.Errorf("worker-2's %s after put-file: %q, %v", file, got, ok)
	}
	if out, err := n.Run(ctx, nodescript.ReadFile.Command(file), nil); err != nil || string(out) != "kind: UpgradeConfiguration\n" {
		t.Errorf("read-file over the agent: %q, %v", out, err)
	}
	if c := w.fleet.Stats().Commands["put file"]; c != 1 {
		t.Errorf("put file played %d times, want 1", c)
	}
}
