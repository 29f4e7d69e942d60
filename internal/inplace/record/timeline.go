package record

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// The timeline: each node's steps as the run went through them, with
// their times, for `status --watch` and `upgrade report`. A span is
// three numbers ([step, start, duration]: the step's index in the
// record's Steps, and milliseconds since the upgrade started), so that
// a thousand nodes' timelines stay a few hundred kilobytes of the
// ConfigMap's mebibyte.

// Span is one step of a node.
type Span struct {
	// Step indexes Upgrade.Steps.
	Step int
	// Start is milliseconds after Upgrade.Started; Dur milliseconds, or
	// -1 while the step goes on.
	Start, Dur int64
}

// MarshalJSON writes [step, start, dur].
func (p Span) MarshalJSON() ([]byte, error) {
	return json.Marshal([3]int64{int64(p.Step), p.Start, p.Dur})
}

// UnmarshalJSON reads [step, start, dur].
func (p *Span) UnmarshalJSON(b []byte) error {
	var a [3]int64
	if err := json.Unmarshal(b, &a); err != nil {
		return errors.New("a span is [step, start ms, duration ms]")
	}
	p.Step, p.Start, p.Dur = int(a[0]), a[1], a[2]
	return nil
}

// maxStepName bounds a step's name read back; maxSpanMS a span's start
// and duration (a year: no upgrade lasts longer); maxSpans a node's
// spans (a kubelet's walk is 19 steps: room for retries, then the
// newest are kept).
const (
	maxStepName = 256
	maxSpanMS   = 366 * 24 * 3600 * 1000
	maxSpans    = 120
)

// MaxSize is the most the record may marshal to: a ConfigMap holds a
// mebibyte, with room for its metadata.
const MaxSize = 900 << 10

// Marshal is the record as it is written. Past MaxSize it sheds what
// only the report reads, the plan's nodes first, then the timelines,
// rather than fail the write a resume and a rollback need.
func Marshal(s *Upgrade) ([]byte, error) {
	data, err := json.Marshal(s)
	if err != nil || len(data) <= MaxSize {
		return data, err
	}
	c := *s
	if c.Plan != nil {
		p := *c.Plan
		p.Nodes, c.Plan = nil, &p
		if data, err = json.Marshal(&c); err != nil || len(data) <= MaxSize {
			return data, err
		}
	}
	c.Nodes = slices.Clone(c.Nodes)
	for i := range c.Nodes {
		c.Nodes[i].Spans = nil
	}
	c.Steps = nil
	return json.Marshal(&c)
}

// Begin records that node entered step at now, ending the step it was
// in; a step it is in already goes on.
func (s *Upgrade) Begin(node, role, step string, now time.Time) {
	n := s.Node(node, role)
	i := s.stepIndex(step)
	if k := len(n.Spans) - 1; k >= 0 && n.Spans[k].Dur < 0 {
		if n.Spans[k].Step == i {
			return
		}
		s.end(n, now)
	}
	if len(n.Spans) >= maxSpans {
		n.Spans = slices.Delete(n.Spans, 0, len(n.Spans)-maxSpans+1)
	}
	n.Spans = append(n.Spans, Span{Step: i, Start: s.since(now), Dur: -1})
}

// End ends node's step in flight, if any, at now.
func (s *Upgrade) End(node string, now time.Time) {
	for i := range s.Nodes {
		if s.Nodes[i].Name == node {
			s.end(&s.Nodes[i], now)
			return
		}
	}
}

func (s *Upgrade) end(n *Node, now time.Time) {
	if k := len(n.Spans) - 1; k >= 0 && n.Spans[k].Dur < 0 {
		n.Spans[k].Dur = max(0, s.since(now)-n.Spans[k].Start)
	}
}

func (s *Upgrade) since(now time.Time) int64 {
	return min(maxSpanMS, max(0, now.Sub(s.Started).Milliseconds()))
}

func (s *Upgrade) stepIndex(step string) int {
	for i, name := range s.Steps {
		if name == step {
			return i
		}
	}
	s.Steps = append(s.Steps, step)
	return len(s.Steps) - 1
}

// Step is a span read back: its name and times.
type Step struct {
	Name  string    `json:"name"`
	Start time.Time `json:"start"`
	// End is zero while the step goes on.
	End time.Time `json:"end,omitzero"`
}

// Duration is the step's, up to now while it goes on.
func (p Step) Duration(now time.Time) time.Duration {
	if p.End.IsZero() {
		return now.Sub(p.Start)
	}
	return p.End.Sub(p.Start)
}

// Timeline is n's steps with their names and times.
func (s *Upgrade) Timeline(n *Node) []Step {
	out := make([]Step, 0, len(n.Spans))
	for _, p := range n.Spans {
		st := Step{Name: s.Steps[p.Step], Start: s.Started.Add(time.Duration(p.Start) * time.Millisecond)}
		if p.Dur >= 0 {
			st.End = st.Start.Add(time.Duration(p.Dur) * time.Millisecond)
		}
		out = append(out, st)
	}
	return out
}

// checkTimeline refuses a timeline that does not parse, naming the node
// and the span.
func (s *Upgrade) checkTimeline() error {
	for i, name := range s.Steps {
		if name == "" || len(name) > maxStepName {
			return fmt.Errorf("steps[%d]: %q is not a step's name", i, name)
		}
	}
	for _, n := range s.Nodes {
		for k, p := range n.Spans {
			if p.Step < 0 || p.Step >= len(s.Steps) || p.Start < 0 || p.Start > maxSpanMS || p.Dur < -1 || p.Dur > maxSpanMS || (p.Dur < 0 && k != len(n.Spans)-1) {
				return fmt.Errorf("node %s: spans[%d] [%d, %d, %d]: want a step of the %d named, a start and a duration (-1 only for the last)",
					n.Name, k, p.Step, p.Start, p.Dur, len(s.Steps))
			}
		}
	}
	return nil
}
