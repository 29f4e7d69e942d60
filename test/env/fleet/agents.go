package fleet

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/agent/serve"
)

// ServeAgents plays agent mode's side of every node: kubelift's own agent
// loop (internal/agent/serve) for each node, in this process, watching
// that node's step requests through client (one client for all: give it
// the request budget of as many agents), each step played by the fleet's
// handlers as the same command over SSH would be. A request made before
// an agent watches is served once it does (its first list). stop ends
// them.
func (f *Fleet) ServeAgents(ctx context.Context, client kubernetes.Interface, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, n := range f.order {
		a := &serve.Agent{Client: client, Node: n.spec.Name, Host: &agentHost{f: f, n: n, steps: map[string]*agentStep{}},
			Log: log.With("node", n.spec.Name)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Serve(ctx); err != nil && ctx.Err() == nil {
				f.cfg.Log("fleet: agent of %s: %v", a.Node, err)
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// agentHost is a simulated node's host as the agent sees it
// (serve.Host): a request runs once, its answer kept until it is
// forgotten.
type agentHost struct {
	f         *Fleet
	n         *node
	mu        sync.Mutex
	steps     map[string]*agentStep
	forgotten map[string]bool
}

type agentStep struct {
	done chan struct{}
	res  agent.Result
}

// Run starts r's command unless it began, and answers once it ended.
func (h *agentHost) Run(_ context.Context, r agent.Request) (*agent.Result, error) {
	h.mu.Lock()
	if h.forgotten[r.Name] {
		h.mu.Unlock()
		return nil, nil // deleted: never started (again)
	}
	s, ok := h.steps[r.Name]
	if !ok {
		s = &agentStep{done: make(chan struct{})}
		h.steps[r.Name] = s
		go h.play(r, s)
	}
	h.mu.Unlock()
	select {
	case <-s.done:
		res := s.res
		return &res, nil
	default:
		return nil, nil
	}
}

func (h *agentHost) play(r agent.Request, s *agentStep) {
	var out, stderr bytes.Buffer
	began := time.Now()
	code := h.f.exec(h.n, r.Script.Command(r.Args...), &stdio{in: bytes.NewReader(r.Stdin), out: &out, err: &stderr})
	e := stderr.String()
	if len(e) > agent.StderrTail {
		e = e[len(e)-agent.StderrTail:]
	}
	s.res = agent.Result{Exit: code, Stdout: out.Bytes(), Stderr: e, Started: began, Finished: time.Now(),
		Unit: fmt.Sprintf("kubelift-step-%s.service", r.Name)}
	close(s.done)
}

// Forget drops a deleted request's answer, and never starts it again
// (a step still playing ends on its own).
func (h *agentHost) Forget(name string) {
	h.mu.Lock()
	if h.forgotten == nil {
		h.forgotten = map[string]bool{}
	}
	h.forgotten[name] = true
	delete(h.steps, name)
	h.mu.Unlock()
}

// Sweep drops the answers of requests no longer kept.
func (h *agentHost) Sweep(_ context.Context, keep func(name string) bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for name, s := range h.steps {
		select {
		case <-s.done:
			if !keep(name) {
				delete(h.steps, name)
			}
		default:
		}
	}
	return nil
}
