// Package access reaches nodes through their agents (agent mode): a
// nodeaccess.Connector whose nodes run each command as a step request in
// the API (internal/agent) and read the node's answer from it, so that
// the engine runs the same node scripts, with the same arguments, as
// over SSH.
package access

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/waiter"
)

// Connector reaches nodes through their agents, for one run.
type Connector struct {
	Client kubernetes.Interface
	// Run names this process's requests (NewRunID).
	Run string
	// Deadline bounds a step whose context has no deadline (an hour
	// when 0).
	Deadline time.Duration
	// Wait polls for answers in the cache of the run's watch of its
	// requests (every Poll, 20 ms when 0: a read of the cache).
	Wait waiter.Waiter
	Poll time.Duration
	// Image is the agents' image (REPOSITORY@DIGEST); with it the
	// connector keeps each node's agent pod up: Dial waits for it (Ready
	// at most, 3 minutes when 0), and a step unanswered for Grace (10 s
	// when 0) has its pod made again where it is gone. Empty: agents are
	// run by someone else.
	Image string
	Ready time.Duration
	Grace time.Duration

	seq atomic.Int64
	// replaced: nodes whose ended agent pod this connector replaced;
	// answers: the watch of the run's requests (none once watchStopped).
	mu           sync.Mutex
	replaced     map[string]bool
	answers      *answers
	watchStopped bool
}

// Start makes what agent mode needs in the cluster (Setup) and starts an
// agent on each of nodes, for run (NewRunID, or RunOfHolder for a run
// that takes the upgrade's lock); Stop ends it.
func Start(ctx context.Context, client kubernetes.Interface, run, image string, nodes []string) (*Connector, error) {
	if err := Setup(ctx, client); err != nil {
		return nil, fmt.Errorf("agent mode: %w", err)
	}
	c := &Connector{Client: client, Run: run, Image: image}
	if err := c.EnsureAgents(ctx, image, nodes); err != nil {
		return nil, errors.Join(err, c.Stop(ctx))
	}
	return c, nil
}

// Stop deletes the run's requests and the agents' pods (a step in flight
// goes on in its unit on the host).
func (c *Connector) Stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	defer c.stopWatch()
	return errors.Join(c.Cleanup(ctx), c.RemoveAgents(ctx))
}

// NewRunID is a run's name for its requests: random, 10 hex digits.
func NewRunID() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// RunOfHolder is the run id of the run that holds, or held, the
// upgrade's lock as holder (upgradelock.NewHolder: HOST_HEX): its random
// part, so that the next holder, taking over the lock of a run that
// stopped, knows which run's agents and requests it takes over.
func RunOfHolder(holder string) string {
	if i := strings.LastIndexByte(holder, '_'); i >= 0 && agent.ValidRun(holder[i+1:]) {
		return holder[i+1:]
	}
	return ""
}

// Dial returns the node t names, reached through its agent, once that
// agent runs (when the connector has an Image).
func (c *Connector) Dial(ctx context.Context, t nodeaccess.Address) (nodeaccess.Node, error) {
	n := &node{c: c, name: t.Name}
	if err := c.agentUp(ctx, t.Name); err != nil {
		return nil, n.fail("reach its agent", err)
	}
	return n, nil
}

// Cleanup deletes this run's requests (the agents then forget them).
func (c *Connector) Cleanup(ctx context.Context) error { return c.deleteRequests(ctx, c.Run) }

// deleteRequests deletes the step requests of run (Secrets of the step
// type only, whatever else bears the label).
func (c *Connector) deleteRequests(ctx context.Context, run string) error {
	sel := labels.SelectorFromSet(labels.Set{agent.LabelRun: run}).String()
	secrets := c.Client.CoreV1().Secrets(agent.Namespace)
	// One request for them all (a run of 1000 nodes makes some 10,000);
	// one by one where the API server refuses that.
	if err := secrets.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel, FieldSelector: "type=" + string(agent.SecretType)}); err == nil {
		return nil
	}
	list, err := secrets.List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("listing the step requests of run %s (%s in %s): %w", run, sel, agent.Namespace, err)
	}
	var errs []error
	for _, s := range list.Items {
		if s.Type != agent.SecretType {
			continue
		}
		if err := secrets.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting step request %s/%s of run %s: %w", agent.Namespace, s.Name, run, err))
		}
	}
	return errors.Join(errs...)
}

type node struct {
	c    *Connector
	name string
}

func (n *node) fail(op string, err error) error {
	return &nodeaccess.Error{Node: n.name, Address: "agent", Op: op, Err: err}
}

// Run asks the node's agent to run cmd (a node script's command) and
// waits for its answer.
func (n *node) Run(ctx context.Context, cmd string, stdin io.Reader) ([]byte, error) {
	var in []byte
	if stdin != nil {
		var err error
		if in, err = io.ReadAll(io.LimitReader(stdin, agent.MaxStdin+1)); err != nil {
			return nil, n.fail("read the step's input", err)
		}
	}
	deadline := n.c.Deadline
	if deadline <= 0 {
		deadline = time.Hour
	}
	if d, ok := ctx.Deadline(); ok {
		deadline = time.Until(d)
	}
	r, err := agent.NewRequest(n.c.Run, n.name, int(n.c.seq.Add(1)), cmd, in, deadline)
	op := fmt.Sprintf("run %q", r.Script.Name)
	if err != nil {
		return nil, n.fail(op, err)
	}
	s, err := r.Secret()
	if err != nil {
		return nil, n.fail(op, err)
	}
	secrets := n.c.Client.CoreV1().Secrets(agent.Namespace)
	_, err = secrets.Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// A run id used twice: never another run's answer.
		err = sameRequest(ctx, secrets, r)
	}
	if err != nil {
		return nil, n.fail(op, fmt.Errorf("asking its agent (secret %s/%s): %w", agent.Namespace, r.Name, err))
	}
	poll := n.c.Poll
	if poll <= 0 {
		poll = 20 * time.Millisecond
	}
	grace := n.c.Grace
	if grace <= 0 {
		grace = 10 * time.Second
	}
	var res *agent.Result
	asked := n.c.Wait.Now()
	w := &waiting{name: r.Name, read: asked}
	err = n.c.Wait.Poll(ctx, poll, deadline+time.Minute, func(ctx context.Context) error {
		if n.c.Image != "" && n.c.Wait.Since(asked) >= grace {
			// Unanswered for a while: the agent may be gone (its pod
			// deleted or evicted); a new one answers from the host.
			asked = n.c.Wait.Now()
			p, err := n.c.revive(ctx, n.name)
			if err != nil {
				return err
			}
			if p != nil {
				if err := cannotStart(p, n.c.Image); err != nil {
					return waiter.Stop(err)
				}
			}
		}
		if res, err = n.c.answer(ctx, w); err != nil {
			return err
		}
		if res == nil {
			return errors.New("no answer yet")
		}
		return nil
	})
	if err != nil {
		// Given up: the request goes, so that no agent that comes up
		// later runs a step the run no longer waits for (one that began
		// runs to its end in its unit).
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if derr := secrets.Delete(dctx, r.Name, metav1.DeleteOptions{}); derr != nil && !apierrors.IsNotFound(derr) {
			err = errors.Join(err, fmt.Errorf("deleting the request given up: %w", derr))
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, n.fail(op, fmt.Errorf("waiting for its agent's answer (secret %s/%s): %w", agent.Namespace, r.Name, err))
	}
	if err := res.Err(); err != nil {
		return res.Stdout, n.fail(op, err)
	}
	return res.Stdout, nil
}

// Upload writes a small file (MaxStdin at most: a configuration; the
// files a run stages travel through the registry) with the put-file
// node script, its content on the step's standard input.
func (n *node) Upload(ctx context.Context, p string, mode os.FileMode, r io.Reader) (int64, error) {
	data, err := io.ReadAll(io.LimitReader(r, agent.MaxStdin+1))
	if err != nil {
		return 0, n.fail("upload "+p, err)
	}
	if len(data) > agent.MaxStdin {
		return 0, n.fail("upload "+p, fmt.Errorf("more than %d bytes: agent mode sends only small files to a node (stage larger ones from the registry)", agent.MaxStdin))
	}
	if _, err := n.Run(ctx, nodescript.PutFile.Command(p, fmt.Sprintf("%04o", mode.Perm())), bytes.NewReader(data)); err != nil {
		return 0, err
	}
	return int64(len(data)), nil
}

// Stream runs cmd and writes its output to w (bounded, as every step's).
func (n *node) Stream(ctx context.Context, cmd string, w io.Writer) (int64, error) {
	out, err := n.Run(ctx, cmd, nil)
	if err != nil {
		return 0, err
	}
	written, err := w.Write(out)
	return int64(written), err
}

// Close has nothing to close.
func (n *node) Close() error { return nil }

// sameRequest says whether the request in the API under r's name is r,
// not yet answered: a request of that name is another run's (a run id
// used twice), whose answer must never pass for this run's.
func sameRequest(ctx context.Context, secrets typedcorev1.SecretInterface, r agent.Request) error {
	got, err := secrets.Get(ctx, r.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	old, err := agent.ParseRequest(got)
	if err != nil {
		return err
	}
	if old.Command() != r.Command() || !bytes.Equal(old.Stdin, r.Stdin) || old.Node != r.Node {
		return fmt.Errorf("it exists and asks another step (%s): a run id used twice", old.Script.Name)
	}
	if res, err := agent.ParseResult(got); err != nil || res != nil {
		return errors.Join(err, errors.New("it exists and is answered already: a run id used twice"))
	}
	return nil
}
