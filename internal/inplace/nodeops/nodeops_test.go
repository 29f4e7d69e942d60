package nodeops

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
)

// The unit restart's time is read off swap's last line, by the node's
// clock; a line that does not parse or does not fit in the call counts as
// nothing.
func TestRestartTime(t *testing.T) {
	for _, tc := range []struct {
		out  string
		call time.Duration
		want time.Duration
	}{
		{"### restart 100.25 110.75\n", 12 * time.Second, 10500 * time.Millisecond},
		{"some warning\n### restart 5.00 5.40\n", time.Second, 400 * time.Millisecond},
		{"", time.Second, 0},
		{"### restart 110.75 100.25\n", time.Minute, 0},      // backwards
		{"### restart 1 100\n", time.Second, 0},              // longer than the call
		{"### restart 1 x\n", time.Second, 0},                // not a number
		{"### restart 1 2 3\n", time.Minute, 0},              // not two numbers
		{"### restart NaN NaN\n", time.Minute, 0},            // NaN
		{"### restart 0 1e300\n", time.Duration(1 << 62), 0}, // out of range
	} {
		if got := restartTime(tc.out, tc.call); got != tc.want {
			t.Errorf("restartTime(%q, %s) = %s, want %s", tc.out, tc.call, got, tc.want)
		}
	}
}

// A node's containers are its workloads': agent mode's agent (the run's
// own, made again where it goes) is not one of them.
func TestContainersLeaveTheAgentOut(t *testing.T) {
	ps := `{"containers":[` +
		`{"id":"aaa","state":"CONTAINER_RUNNING","metadata":{"name":"api"},"labels":{"io.kubernetes.pod.namespace":"shop","io.kubernetes.pod.name":"api-1","io.kubernetes.pod.uid":"u1","io.kubernetes.container.name":"api"}},` +
		`{"id":"bbb","state":"CONTAINER_RUNNING","metadata":{"name":"agent"},"labels":{"io.kubernetes.pod.namespace":"kubelift-system","io.kubernetes.pod.name":"kubelift-agent-1","io.kubernetes.pod.uid":"u2","io.kubernetes.container.name":"agent"}}]}`
	node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
		nodescript.Containers.Name: func([]string) (string, error) {
			return ps + tasksMarker + "TASK PID STATUS\naaa 10 RUNNING\nbbb 11 RUNNING\n", nil
		},
	}}
	o := &Ops{Node: node, Name: "worker-1"}
	got, err := o.Containers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["aaa"].What != "shop/api-1/api" || got["aaa"].PID != 10 {
		t.Errorf("containers %+v, want shop's only", got)
	}
}

// A runtime that does not answer for a moment (containerd restarting) is
// asked again; one that answers with another error is not.
func TestContainersWaitForTheRuntime(t *testing.T) {
	defer func(p time.Duration) { runtimeRetryPause = p }(runtimeRetryPause)
	runtimeRetryPause = time.Millisecond
	ps := `{"containers":[{"id":"aaa","state":"CONTAINER_RUNNING","metadata":{"name":"api"},"labels":{"io.kubernetes.pod.namespace":"shop","io.kubernetes.pod.name":"api-1","io.kubernetes.pod.uid":"u1","io.kubernetes.container.name":"api"}}]}`
	down := 2
	calls := 0
	node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
		nodescript.Containers.Name: func([]string) (string, error) {
			calls++
			if calls <= down {
				return "", errors.New(`exit status 1: level=fatal msg="validate service connection: validate CRI v1 runtime API for endpoint \"unix:///run/containerd/containerd.sock\": rpc error: code = Unavailable desc = connection error"`)
			}
			return ps + tasksMarker + "TASK PID STATUS\naaa 10 RUNNING\n", nil
		},
	}}
	o := &Ops{Node: node, Name: "worker-2"}
	got, err := o.ContainersWaiting(context.Background())
	if err != nil || len(got) != 1 || calls != 3 {
		t.Fatalf("containers after the runtime came back: %v, %v, %d calls", got, err, calls)
	}
	calls, down = 0, 1000
	if _, err := o.ContainersWaiting(context.Background()); err == nil || calls != runtimeRetries+1 {
		t.Fatalf("a runtime that never comes back: %v after %d calls, want %d", err, calls, runtimeRetries+1)
	}
	calls = 0
	node.Scripts[nodescript.Containers.Name] = func([]string) (string, error) { calls++; return "", errors.New("exit status 127: crictl: not found") }
	if _, err := o.ContainersWaiting(context.Background()); err == nil || calls != 1 {
		t.Fatalf("another error: %v after %d calls, want 1", err, calls)
	}
}
