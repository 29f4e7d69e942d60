// Package agent is agent mode's wire format: a node step that a run asks
// of a node's agent, and the agent's answer, both kept in one Secret in
// Namespace (docs/agent-mode.md). A request names one of kubelift's
// constant node scripts and its arguments, never a shell command, so a
// requester can make a node run those scripts and nothing else. Either
// side's writing is parsed where it enters, and what does not parse is
// refused naming the Secret, the field and the value.
package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// Namespace holds agent mode's requests, its pods and their account.
const Namespace = "kubelift-system"

const (
	// LabelNode selects a node's requests: the node's name, or "h-" and
	// a hash of it where the name is longer than a label value may be.
	LabelNode = "kubelift.dev/node"
	// LabelRun is the run that asked.
	LabelRun = "kubelift.dev/run"
	// AnnotationNode is the node's whole name (what the admission policy
	// compares with the agent's token).
	AnnotationNode = "kubelift.dev/node-name"
	// SecretType marks a step's Secret.
	SecretType corev1.SecretType = "kubelift.dev/step"
)

// Bounds on what a step carries through the API (a Secret holds at most
// 1 MiB): bulk data travels through the registry, or in ranges.
const (
	MaxStdin   = 256 << 10
	MaxStdout  = 512 << 10
	StderrTail = 4 << 10
)

// The Secret's data keys.
const (
	keyScript   = "script"
	keyArgs     = "args"
	keyStdin    = "stdin"
	keyDeadline = "deadline"
	keyResult   = "result"
	keyStdout   = "stdout"
)

// Request is one node step a run asks of a node's agent.
type Request struct {
	// Name is the Secret's: kubelift-step-RUN-NODEHASH-SEQ.
	Name string
	Run  string
	Node string
	// Script and Args are what the step runs: Script.Command(Args...).
	Script nodescript.Script
	Args   []string
	Stdin  []byte
	// Deadline bounds the step on the node; past it the step is stopped
	// and reported failed.
	Deadline time.Duration
}

var (
	runRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,18}[a-z0-9])?$`)
	// nameRE is a request's name (and, with .service, its unit's: short
	// of systemd's 256 characters).
	nameRE = regexp.MustCompile(`^kubelift-step-[a-z0-9]([a-z0-9-]{0,18}[a-z0-9])?-[0-9a-f]{16}-[0-9]{1,12}$`)
)

// NewRequest is the request that runs cmd (a command nodescript built:
// any other is refused) on node with stdin, as the seq'th step of run
// (lower-case letters, digits and inner dashes, at most 20).
func NewRequest(run, node string, seq int, cmd string, stdin []byte, deadline time.Duration) (Request, error) {
	sc, args, err := nodescript.Parse(cmd)
	if err == nil && sc.Name == nodescript.AgentStep.Name {
		err = errors.New("agent-step is how the agent runs a step, not a step")
	}
	if err != nil {
		return Request{}, fmt.Errorf("agent mode runs only kubelift's node scripts: %w", err)
	}
	r := Request{Name: fmt.Sprintf("kubelift-step-%s-%s-%d", run, NodeHash(node), seq), Run: run, Node: node,
		Script: sc, Args: args, Stdin: stdin, Deadline: deadline.Round(time.Second)}
	if deadline > 0 && r.Deadline < time.Second {
		r.Deadline = time.Second // the Secret keeps whole seconds
	}
	return r, r.validate()
}

func (r Request) validate() error {
	switch {
	case !runRE.MatchString(r.Run):
		return fmt.Errorf("run %q: lower-case letters, digits and inner dashes, at most 20", r.Run)
	case len(validation.IsDNS1123Subdomain(r.Node)) > 0:
		return fmt.Errorf("node %q: not a node name (%v)", r.Node, validation.IsDNS1123Subdomain(r.Node))
	case len(r.Stdin) > MaxStdin:
		return fmt.Errorf("standard input of %d bytes: agent mode carries at most %d (larger files travel through the registry)", len(r.Stdin), MaxStdin)
	case r.Deadline <= 0:
		return fmt.Errorf("deadline %s: must be more than 0", r.Deadline)
	}
	return nil
}

// Command is the shell command the step runs on the node.
func (r Request) Command() string { return r.Script.Command(r.Args...) }

// NodeLabel is the value of LabelNode for node.
func NodeLabel(node string) string {
	if len(node) <= validation.LabelValueMaxLength {
		return node
	}
	return "h-" + NodeHash(node)
}

// NodeHash is a short hash of node's name, for names of its objects.
func NodeHash(node string) string {
	h := sha256.Sum256([]byte(node))
	return hex.EncodeToString(h[:8])
}

// Secret is the request as the run creates it.
func (r Request) Secret() (*corev1.Secret, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	args, err := json.Marshal(r.Args)
	if err != nil {
		return nil, err
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: Namespace,
			Labels:      map[string]string{LabelNode: NodeLabel(r.Node), LabelRun: r.Run, "app.kubernetes.io/managed-by": "kubelift"},
			Annotations: map[string]string{AnnotationNode: r.Node}},
		Type: SecretType,
		Data: map[string][]byte{keyScript: []byte(r.Script.Name), keyArgs: args, keyStdin: r.Stdin,
			keyDeadline: []byte(strconv.FormatInt(int64(r.Deadline/time.Second), 10))},
	}, nil
}

// ParseRequest reads the request s holds, refusing a script kubelift
// does not have or a field that does not parse.
func ParseRequest(s *corev1.Secret) (Request, error) {
	bad := func(field string, v any, why string) error {
		return fmt.Errorf("step %s/%s: %s %q: %s", s.Namespace, s.Name, field, v, why)
	}
	if s.Type != SecretType {
		return Request{}, bad("type", s.Type, "not "+string(SecretType))
	}
	if !nameRE.MatchString(s.Name) {
		return Request{}, bad("name", s.Name, "not kubelift-step-RUN-NODEHASH-SEQ")
	}
	r := Request{Name: s.Name, Run: s.Labels[LabelRun], Node: s.Annotations[AnnotationNode], Stdin: s.Data[keyStdin]}
	name := string(s.Data[keyScript])
	sc, ok := nodescript.Lookup(name)
	if !ok || sc.Name == nodescript.AgentStep.Name {
		return Request{}, bad("script", name, "not one of kubelift's node scripts")
	}
	r.Script = sc
	if err := json.Unmarshal(s.Data[keyArgs], &r.Args); err != nil {
		return Request{}, bad("args", string(s.Data[keyArgs]), err.Error())
	}
	secs, err := strconv.ParseInt(string(s.Data[keyDeadline]), 10, 32)
	if err != nil {
		return Request{}, bad("deadline", string(s.Data[keyDeadline]), "not a number of seconds")
	}
	r.Deadline = time.Duration(secs) * time.Second
	if NodeLabel(r.Node) != s.Labels[LabelNode] {
		return Request{}, bad("label "+LabelNode, s.Labels[LabelNode], "not the node "+r.Node+" its annotation names")
	}
	if err := r.validate(); err != nil {
		return Request{}, fmt.Errorf("step %s/%s: %w", s.Namespace, s.Name, err)
	}
	return r, nil
}

// Result is a node's answer to a request.
type Result struct {
	// Exit is the script's exit status (128+n: killed by signal n).
	Exit int `json:"exit"`
	// Stderr is the end of its standard error (StderrTail bytes).
	Stderr   string    `json:"stderr,omitempty"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Unit is the host's transient unit that ran it.
	Unit string `json:"unit"`
	// Failed says why the step has no exit status of its own: its
	// deadline passed, its unit ended without a result, or the request
	// could not run at all.
	Failed string `json:"failed,omitempty"`
	// Stdout is its standard output (MaxStdout bytes at most).
	Stdout []byte `json:"-"`
}

// WithResult is s with res as its answer.
func WithResult(s *corev1.Secret, res Result) (*corev1.Secret, error) {
	if len(res.Stdout) > MaxStdout {
		return nil, fmt.Errorf("step %s: output of %d bytes, over agent mode's %d", s.Name, len(res.Stdout), MaxStdout)
	}
	if len(res.Stderr) > StderrTail {
		res.Stderr = res.Stderr[len(res.Stderr)-StderrTail:]
	}
	b, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	out := s.DeepCopy()
	if out.Data == nil {
		out.Data = map[string][]byte{}
	}
	out.Data[keyResult], out.Data[keyStdout] = b, res.Stdout
	return out, nil
}

// ParseResult reads the answer s holds: nil while there is none.
func ParseResult(s *corev1.Secret) (*Result, error) {
	b, ok := s.Data[keyResult]
	if !ok {
		return nil, nil
	}
	var res Result
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("step %s/%s: result %.80q: %w", s.Namespace, s.Name, b, err)
	}
	if res.Exit < 0 || res.Exit > 255 {
		return nil, fmt.Errorf("step %s/%s: result: exit status %d: not 0 to 255", s.Namespace, s.Name, res.Exit)
	}
	if len(s.Data[keyStdout]) > MaxStdout {
		return nil, fmt.Errorf("step %s/%s: output of %d bytes, over agent mode's %d", s.Namespace, s.Name, len(s.Data[keyStdout]), MaxStdout)
	}
	res.Stdout = s.Data[keyStdout]
	return &res, nil
}

// Err is the result as the SSH transport would have said it: nil for
// exit status 0, a *nodeaccess.ExitError for another (128+n where the
// script was killed by signal n), an error saying why for a step that
// did not end on its own.
func (res *Result) Err() error {
	switch {
	case res.Failed != "" && res.Stderr != "":
		return fmt.Errorf("%s: %s", res.Failed, res.Stderr)
	case res.Failed != "":
		return errors.New(res.Failed)
	case res.Exit == 0:
		return nil
	}
	return &nodeaccess.ExitError{Code: res.Exit, Stderr: res.Stderr}
}

// Made is an object agent mode makes in the cluster for a run, as plan
// lists it: its kind, its name, and what it is for or allows.
type Made struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	What string `json:"what"`
}

// ValidRun says whether run can name a run's requests (NewRunID's, or a
// lock holder's random part).
func ValidRun(run string) bool { return runRE.MatchString(run) }
