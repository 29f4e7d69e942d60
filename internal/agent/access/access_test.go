package access

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/agent/hoststep"
	"github.com/kubelift/kubelift/internal/agent/hoststep/hoststeptest"
	"github.com/kubelift/kubelift/internal/agent/serve"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// serveNode starts worker-1's agent on the client, its steps run as the
// test's processes in a directory of the test's.
func serveNode(t *testing.T, c *fake.Clientset, units *hoststeptest.Direct) (stepsDir string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	stepsDir = t.TempDir()
	a := &serve.Agent{Client: c, Node: "worker-1", Tick: 20 * time.Millisecond, SweepEvery: 50 * time.Millisecond,
		Host: &hoststep.Host{Root: "/", Dir: stepsDir, Units: units}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	go func() { done <- a.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return stepsDir
}

// A command runs on the node through its agent and answers as over SSH:
// its output, or an *nodeaccess.ExitError naming the node.
func TestRunThroughTheAgent(t *testing.T) {
	c, units := newClient(), &hoststeptest.Direct{}
	steps := serveNode(t, c, units)
	conn := &Connector{Client: c, Run: "r1", Poll: 20 * time.Millisecond}
	n, err := conn.Dial(context.Background(), nodeaccess.Address{Name: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "kubelet.conf")
	if err := os.WriteFile(file, []byte("on the node\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := n.Run(ctx, nodescript.ReadFile.Command(file), nil)
	if err != nil || string(out) != "on the node\n" {
		t.Fatalf("read-file: %q %v", out, err)
	}
	_, err = n.Run(ctx, nodescript.ReadFile.Command(file+".absent"), nil)
	var ee *nodeaccess.ExitError
	var ne *nodeaccess.Error
	if !errors.As(err, &ee) || ee.Code != 1 || !errors.As(err, &ne) || ne.Node != "worker-1" || !strings.Contains(err.Error(), `run "read-file"`) {
		t.Errorf("a failing step: %v", err)
	}
	if _, err := n.Run(ctx, "reboot", nil); err == nil || !strings.Contains(err.Error(), "agent mode runs only kubelift's node scripts") {
		t.Errorf("a command that is no node script: %v", err)
	}
	// The answers came through the run's one watch of its requests, not
	// a read per step and poll.
	for _, a := range c.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "secrets" {
			t.Errorf("the connector read a request from the API: %v", a)
		}
	}
	list, _ := c.CoreV1().Secrets(agent.Namespace).List(ctx, metav1.ListOptions{})
	if len(list.Items) != 2 {
		t.Errorf("%d requests, want 2", len(list.Items))
	}
	for _, s := range list.Items {
		if units.Starts(hoststep.UnitName(s.Name)) != 1 {
			t.Errorf("request %s started %d times", s.Name, units.Starts(hoststep.UnitName(s.Name)))
		}
	}
	if err := conn.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if list, _ := c.CoreV1().Secrets(agent.Namespace).List(ctx, metav1.ListOptions{}); len(list.Items) != 0 {
		t.Errorf("%d requests after the run's cleanup", len(list.Items))
	}
	// In one request (a run of 1000 nodes makes some 10,000 requests).
	deletes := map[string]int{}
	for _, a := range c.Actions() {
		if a.GetResource().Resource == "secrets" {
			deletes[a.GetVerb()]++
		}
	}
	if deletes["delete-collection"] != 1 || deletes["delete"] != 0 {
		t.Errorf("the run's cleanup: %d delete-collection, %d delete; want one delete-collection", deletes["delete-collection"], deletes["delete"])
	}
	// The agent forgets a deleted request's directory on the host.
	for ctx.Err() == nil {
		if left, _ := os.ReadDir(steps); len(left) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	left, _ := os.ReadDir(steps)
	t.Errorf("%d step directories left on the host after the requests' deletion", len(left))
}

// A request the agent cannot read is answered, failed, with the reason;
// a Secret that is no request (its type) is not the agent's to answer,
// even with the node's label and no data.
func TestRefusedRequest(t *testing.T) {
	c := newClient()
	stray := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "stray", Namespace: agent.Namespace, Labels: map[string]string{agent.LabelNode: "worker-1"}}}
	if _, err := c.CoreV1().Secrets(agent.Namespace).Create(context.Background(), stray, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	serveNode(t, c, &hoststeptest.Direct{})
	r, err := agent.NewRequest("r1", "worker-1", 1, nodescript.Exists.Command("/"), nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := r.Secret()
	s.Data["script"] = []byte("reboot")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.CoreV1().Secrets(agent.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var res *agent.Result
	for res == nil && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
		got, _ := c.CoreV1().Secrets(agent.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
		res, _ = agent.ParseResult(got)
	}
	if res == nil || !strings.Contains(res.Failed, `script "reboot": not one of kubelift's node scripts`) {
		t.Errorf("a forged request: %+v", res)
	}
	if got, _ := c.CoreV1().Secrets(agent.Namespace).Get(ctx, "stray", metav1.GetOptions{}); got.Data != nil {
		t.Errorf("the agent answered a Secret that is no request: %v", got.Data)
	}
}

// A node with no agent leaves the step unanswered: the run's context
// ends it.
func TestNoAgent(t *testing.T) {
	c := newClient()
	conn := &Connector{Client: c, Run: "r1", Poll: 20 * time.Millisecond}
	n, _ := conn.Dial(context.Background(), nodeaccess.Address{Name: "worker-2"})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := n.Run(ctx, nodescript.Exists.Command("/"), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("no agent: %v", err)
	}
	// The request given up goes: an agent that comes up later does not
	// run it.
	if list, _ := c.CoreV1().Secrets(agent.Namespace).List(context.Background(), metav1.ListOptions{}); len(list.Items) != 0 {
		t.Errorf("%d requests left after the run gave up", len(list.Items))
	}
}

// A request under the name this run's next step takes, asking another
// step (a run id used twice), is refused, not taken as the answer.
func TestRunIDUsedTwice(t *testing.T) {
	c := newClient()
	old, err := agent.NewRequest("r9", "worker-1", 1, nodescript.Exists.Command("/etc"), nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := old.Secret()
	answered, _ := agent.WithResult(s, agent.Result{Stdout: []byte("yes\n")})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.CoreV1().Secrets(agent.Namespace).Create(ctx, answered, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n, _ := (&Connector{Client: c, Run: "r9", Poll: 20 * time.Millisecond}).Dial(ctx, nodeaccess.Address{Name: "worker-1"})
	if out, err := n.Run(ctx, nodescript.Exists.Command("/var"), nil); err == nil || !strings.Contains(err.Error(), "a run id used twice") {
		t.Errorf("another step's answer: %q %v", out, err)
	}
	// Nor the answer to the same step from the run that used the id.
	n, _ = (&Connector{Client: c, Run: "r9", Poll: 20 * time.Millisecond}).Dial(ctx, nodeaccess.Address{Name: "worker-1"})
	if out, err := n.Run(ctx, nodescript.Exists.Command("/etc"), nil); err == nil || !strings.Contains(err.Error(), "answered already") {
		t.Errorf("the same step, answered for another run: %q %v", out, err)
	}
}

// A small file goes to the node in the step's standard input (put-file),
// whole, with its mode; one over the bound is refused before any request.
func TestUpload(t *testing.T) {
	c := newClient()
	serveNode(t, c, &hoststeptest.Direct{})
	conn := &Connector{Client: c, Run: "r1", Poll: 20 * time.Millisecond}
	n, err := conn.Dial(context.Background(), nodeaccess.Address{Name: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	file := filepath.Join(t.TempDir(), "upgrade.yaml")
	content := "apiVersion: kubeadm.k8s.io/v1beta4\nkind: UpgradeConfiguration\n"
	if sent, err := n.Upload(ctx, file, 0o640, strings.NewReader(content)); err != nil || sent != int64(len(content)) {
		t.Fatalf("upload: %d, %v", sent, err)
	}
	if data, err := os.ReadFile(file); err != nil || string(data) != content {
		t.Fatalf("the node's file: %q, %v", data, err)
	}
	if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v", fi.Mode())
	}
	big := strings.NewReader(strings.Repeat("x", agent.MaxStdin+1))
	if _, err := n.Upload(ctx, file+".big", 0o600, big); err == nil || !strings.Contains(err.Error(), "only small files") {
		t.Errorf("a file over the bound: %v", err)
	}
	if _, err := os.Stat(file + ".big"); err == nil {
		t.Error("the file over the bound was written")
	}
}

// A run that takes the upgrade's lock names its agents' requests after
// the lock's holder, so that the next holder knows whose to take over.
func TestRunOfHolder(t *testing.T) {
	for holder, want := range map[string]string{"admin-vm_51fca777e552": "51fca777e552", "kubelift_0a1b2c3d4e5f": "0a1b2c3d4e5f", "nounderscore": "", "": "", "host_NOT-a-run!": ""} {
		if got := RunOfHolder(holder); got != want {
			t.Errorf("RunOfHolder(%q) = %q, want %q", holder, got, want)
		}
	}
}

// A request deleted while its step is awaited (a run taking over this
// one's requests) ends the wait at once, from the watch, saying so.
func TestDeletedRequestEndsTheWait(t *testing.T) {
	c := newClient()
	conn := &Connector{Client: c, Run: "r1", Poll: 10 * time.Millisecond}
	n, err := conn.Dial(context.Background(), nodeaccess.Address{Name: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			list, _ := c.CoreV1().Secrets(agent.Namespace).List(context.Background(), metav1.ListOptions{})
			if len(list.Items) == 1 && conn.watch().synced() {
				if _, err := conn.watch().lister.Get(list.Items[0].Name); err == nil {
					time.Sleep(100 * time.Millisecond) // the waiting step has seen it there too (every 10 ms)
					_ = c.CoreV1().Secrets(agent.Namespace).Delete(context.Background(), list.Items[0].Name, metav1.DeleteOptions{})
					return
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), recheck/2)
	defer cancel()
	_, err = n.Run(ctx, nodescript.ReadFile.Command("/etc/hostname"), nil)
	if err == nil || !strings.Contains(err.Error(), "the request was deleted before its answer") {
		t.Fatalf("err = %v, want the deletion named", err)
	}
	conn.stopWatch()
}
