package nodeaccess

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
)

func TestForEachReportsEachFailureAndGoesOn(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	d := f.dialer(t)
	targets := []Address{srv.target("cp-1", ""), {Name: "worker-2", Address: "127.0.0.1", Port: closedAddr(t)}, srv.target("worker-3", "ubuntu"), srv.target("worker-4", "")}

	var mu sync.Mutex
	ran := map[string]string{}
	errs := ForEach(context.Background(), d, targets, 2, func(ctx context.Context, tg Address, n Node) error {
		out, err := n.Run(ctx, "echo "+Quote(tg.Name), nil)
		mu.Lock()
		ran[tg.Name] = string(out)
		mu.Unlock()
		if tg.Name == "worker-4" {
			_, err = n.Run(ctx, "exit 7", nil)
		}
		return err
	})

	if len(errs) != 2 {
		t.Fatalf("errors = %v, want worker-2's and worker-4's", errs)
	}
	if err := errs["worker-2"]; err == nil || !strings.HasPrefix(err.Error(), "node worker-2 ("+targets[1].Addr()+"): dial: ") {
		t.Errorf("worker-2: err = %v, want a dial error naming it", err)
	}
	var exit *ExitError
	if err := errs["worker-4"]; !errors.As(err, &exit) || exit.Code != 7 || !strings.HasPrefix(err.Error(), "node worker-4 (") {
		t.Errorf("worker-4: err = %v, want exit status 7 naming it", err)
	}
	for _, name := range []string{"cp-1", "worker-3", "worker-4"} {
		if ran[name] != name+"\n" {
			t.Errorf("%s: ran %q", name, ran[name])
		}
	}
	if _, ok := ran["worker-2"]; ok {
		t.Error("fn ran for the unreachable node")
	}
}

func TestForEachBound(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	d := f.dialer(t)
	var targets []Address
	for _, name := range []string{"a", "b", "c", "d", "e", "f"} {
		targets = append(targets, srv.target(name, ""))
	}
	var mu sync.Mutex
	running, peak := 0, 0
	errs := ForEach(context.Background(), d, targets, 2, func(ctx context.Context, _ Address, n Node) error {
		mu.Lock()
		running++
		peak = max(peak, running)
		mu.Unlock()
		defer func() { mu.Lock(); running--; mu.Unlock() }()
		_, err := n.Run(ctx, "true", nil)
		return err
	})
	if len(errs) != 0 || peak > 2 {
		t.Fatalf("errors %v, peak %d nodes at once, want none and at most 2", errs, peak)
	}
}

func TestForEachCancelled(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	targets := []Address{srv.target("a", ""), srv.target("b", ""), srv.target("c", "")}
	errs := ForEach(ctx, f.dialer(t), targets, 1, func(context.Context, Address, Node) error {
		t.Error("fn called after ctx was cancelled")
		return nil
	})
	for _, tg := range targets {
		if err := errs[tg.Name]; !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "node "+tg.Name+" (") {
			t.Errorf("%s: err = %v, want context.Canceled naming the node", tg.Name, err)
		}
	}
}
