package agent

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// A request travels as its script's name and arguments, and comes back
// as the same command.
func TestRequestRoundTrip(t *testing.T) {
	cmd := nodescript.Exists.Command("/var/lib/kubelift/staged/v1.31.4/kubelet", "it's quoted; $(reboot)")
	r, err := NewRequest("r1a2", "worker-1", 7, cmd, []byte("in"), 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Secret()
	if err != nil {
		t.Fatal(err)
	}
	if s.Namespace != Namespace || s.Labels[LabelNode] != "worker-1" || s.Labels[LabelRun] != "r1a2" || !strings.HasPrefix(s.Name, "kubelift-step-r1a2-") || !strings.HasSuffix(s.Name, "-7") {
		t.Errorf("secret %s/%s labels %v", s.Namespace, s.Name, s.Labels)
	}
	if strings.Contains(string(s.Data[keyScript]), "sh -c") {
		t.Errorf("the request carries a command: %q", s.Data[keyScript])
	}
	got, err := ParseRequest(s)
	if err != nil {
		t.Fatal(err)
	}
	if got.Command() != cmd || string(got.Stdin) != "in" || got.Deadline != 90*time.Second || got.Node != "worker-1" {
		t.Errorf("read back %+v", got)
	}
}

// Anything but one of the node scripts, as nodescript made it, is refused
// before it is sent, and a request that names another script, or whose
// fields do not parse, is refused by the agent, naming the field.
func TestRequestRefusals(t *testing.T) {
	for _, cmd := range []string{"reboot", nodescript.AgentStep.Command("/tmp/x", "10"), "sh -c 'reboot' kubelift-exists", strings.Replace(nodescript.Exists.Command("/x"), "set -", "reboot; set -", 1)} {
		if _, err := NewRequest("r1", "worker-1", 1, cmd, nil, time.Minute); err == nil {
			t.Errorf("%.40q: sent", cmd)
		}
	}
	ok := nodescript.Exists.Command("/x")
	for _, tc := range []struct {
		run, node string
		stdin     int
		want      string
	}{
		{"R1", "worker-1", 0, `run "R1"`},
		{"r1", "Worker_1", 0, `node "Worker_1"`},
		{"r1", "worker-1", MaxStdin + 1, "at most 262144"},
	} {
		if _, err := NewRequest(tc.run, tc.node, 1, ok, make([]byte, tc.stdin), time.Minute); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc, err, tc.want)
		}
	}

	r, _ := NewRequest("r1", "worker-1", 1, ok, nil, time.Minute)
	for _, tc := range []struct {
		field, value, want string
	}{
		{keyScript, "reboot", `script "reboot": not one of kubelift's node scripts`},
		{keyScript, "agent-step", `script "agent-step": not one of`},
		{keyArgs, "[1]", `args "[1]"`},
		{keyDeadline, "soon", `deadline "soon"`},
		{keyDeadline, "0", "deadline 0s"},
		{"name", "kubelift-step-" + strings.Repeat("x", 250), "not kubelift-step-RUN-NODEHASH-SEQ"},
	} {
		s, _ := r.Secret()
		if tc.field == "name" {
			s.Name = tc.value
		} else {
			s.Data[tc.field] = []byte(tc.value)
		}
		if _, err := ParseRequest(s); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), s.Name) {
			t.Errorf("%s=%q: %v, want %q", tc.field, tc.value, err, tc.want)
		}
	}
	s, _ := r.Secret()
	s.Labels[LabelNode] = "worker-2" // another node's agent would take it
	if _, err := ParseRequest(s); err == nil || !strings.Contains(err.Error(), "not the node worker-1") {
		t.Errorf("label of another node: %v", err)
	}
}

// A node name longer than a label value is labelled by its hash.
func TestLongNodeName(t *testing.T) {
	long := strings.Repeat("n", 70) + ".example.corp"
	r, err := NewRequest("r1", long, 1, nodescript.Exists.Command("/x"), nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := r.Secret()
	if v := s.Labels[LabelNode]; len(v) > 63 || !strings.HasPrefix(v, "h-") || s.Annotations[AnnotationNode] != long {
		t.Errorf("label %q annotation %q", v, s.Annotations[AnnotationNode])
	}
	if got, err := ParseRequest(s); err != nil || got.Node != long {
		t.Errorf("%v %q", err, got.Node)
	}
}

// A result is read back as the SSH transport says one.
func TestResult(t *testing.T) {
	r, _ := NewRequest("r1", "worker-1", 1, nodescript.Exists.Command("/x"), nil, time.Minute)
	s, _ := r.Secret()
	if res, err := ParseResult(s); res != nil || err != nil {
		t.Fatalf("no result yet: %v %v", res, err)
	}
	done, err := WithResult(s, Result{Exit: 65, Stderr: strings.Repeat("x", StderrTail) + "the end", Stdout: []byte("out"), Unit: "kubelift-step-x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Data[keyResult]; ok {
		t.Error("WithResult changed the request it was given")
	}
	res, err := ParseResult(done)
	if err != nil {
		t.Fatal(err)
	}
	var ee *nodeaccess.ExitError
	if !errors.As(res.Err(), &ee) || ee.Code != 65 || !strings.HasSuffix(ee.Stderr, "the end") || len(ee.Stderr) != StderrTail || string(res.Stdout) != "out" {
		t.Errorf("result %+v: %v", res, res.Err())
	}
	if _, err := WithResult(s, Result{Stdout: make([]byte, MaxStdout+1)}); err == nil {
		t.Error("an output over the bound was kept")
	}
	done.Data[keyResult] = []byte(`{"exit":300}`)
	if _, err := ParseResult(done); err == nil || !strings.Contains(err.Error(), "exit status 300") {
		t.Errorf("exit 300: %v", err)
	}
	failed, _ := WithResult(s, Result{Failed: "the step's unit ended without a result"})
	if res, _ := ParseResult(failed); res.Err() == nil || !strings.Contains(res.Err().Error(), "without a result") {
		t.Errorf("a failed step: %v", res.Err())
	}
}
