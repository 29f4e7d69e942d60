package serve

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// host plays steps that end a while after they start.
type host struct {
	mu     sync.Mutex
	starts map[string]int
	ended  map[string]time.Time
	runs   int
	swept  chan struct{} // closed on the first Sweep
	once   sync.Once
}

func (h *host) Run(_ context.Context, r agent.Request) (*agent.Result, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.runs++
	if h.starts[r.Name]++; h.starts[r.Name] == 1 {
		h.ended[r.Name] = time.Now().Add(30 * time.Millisecond)
	}
	if time.Now().Before(h.ended[r.Name]) {
		return nil, nil
	}
	return &agent.Result{Exit: 0, Stdout: []byte("done\n"), Unit: r.Name + ".service"}, nil
}

func (h *host) Forget(string) {}

func (h *host) Sweep(context.Context, func(string) bool) error {
	h.once.Do(func() { close(h.swept) })
	return nil
}

// A request is started on its watch event and answered soon after its
// step ends, not on a walk of every request: with walks an hour apart,
// it is answered all the same, its step started once and looked at a
// few times.
func TestServeActsOnEvents(t *testing.T) {
	c := fake.NewClientset()
	h := &host{starts: map[string]int{}, ended: map[string]time.Time{}, swept: make(chan struct{})}
	a := &Agent{Client: c, Node: "worker-1", Host: h, Tick: time.Hour, SweepEvery: time.Hour,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()

	// Made once the agent's first walk is over (its sweep ends it).
	select {
	case <-h.swept:
	case <-ctx.Done():
		t.Fatal("the agent never walked its requests")
	}
	r, err := agent.NewRequest("r1", "worker-1", 1, nodescript.ReadFile.Command("/etc/hostname"), nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Secret()
	if err != nil {
		t.Fatal(err)
	}
	secrets := c.CoreV1().Secrets(agent.Namespace)
	if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var res *agent.Result
	for res == nil && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
		got, err := secrets.Get(ctx, r.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res, err = agent.ParseResult(got); err != nil {
			t.Fatal(err)
		}
	}
	if res == nil || res.Exit != 0 || string(res.Stdout) != "done\n" {
		t.Fatalf("the request's answer: %+v (%v)", res, ctx.Err())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.starts[r.Name] < 2 || h.runs > 20 {
		t.Errorf("the step was looked at %d times (%d runs in all): want a few", h.starts[r.Name], h.runs)
	}
}
