// Package report is the record of an upgrade for the change ticket: from
// the cluster's record (its plan, each node's timeline, what verify
// counted), the Nodes as they are now and the verified release, a report
// of what was planned, what ran, how long each node took, what restarted
// and what the bundle was, as data (JSON), Markdown or one self-contained
// HTML page (inline CSS and SVG: it opens with no network).
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
)

// Report is an upgrade's report.
type Report struct {
	Generated    time.Time        `json:"generated"`
	From         string           `json:"from"`
	To           string           `json:"to"`
	State        string           `json:"state"`
	ControlPlane string           `json:"controlPlane,omitempty"`
	Hops         []string         `json:"hops,omitempty"`
	Started      time.Time        `json:"started"`
	Ended        time.Time        `json:"ended"`
	LastError    string           `json:"lastError,omitempty"`
	EtcdBackup   string           `json:"etcdBackup,omitempty"`
	Bundle       *Bundle          `json:"bundle,omitempty"`
	Findings     []record.Finding `json:"findings"`
	// Omitted counts the plan's findings the record did not keep.
	Omitted int    `json:"omittedFindings,omitempty"`
	Nodes   []Node `json:"nodes"`
	// Phases mark the chart: the control plane's move to each release
	// (the hops, then the target), then the kubelets.
	Phases       []Phase       `json:"phases"`
	Availability *Availability `json:"availability,omitempty"`
	// Totals sums the nodes' containers.
	Totals record.Containers `json:"containers"`
}

// Bundle is the release's bundle as verified: who signed it, and what it
// carried by digest.
type Bundle struct {
	Digest  string     `json:"digest"`
	Signer  string     `json:"signer,omitempty"`
	Created time.Time  `json:"created"`
	Images  []Artifact `json:"images,omitempty"`
	Files   []Artifact `json:"files,omitempty"`
}

// Artifact is an image or a file of the bundle by digest.
type Artifact struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
}

// Node is one node's part.
type Node struct {
	Name   string `json:"name"`
	Role   string `json:"role"`
	Status string `json:"status"`
	// Before is as the plan read it; After the kubelet and runtime the
	// Node reports now, and the parts the run moved.
	Before     Versions           `json:"before"`
	After      Versions           `json:"after"`
	Containers *record.Containers `json:"containers,omitempty"`
	Steps      []Step             `json:"steps"`
	// Took is from its first step's start to its last step's end.
	Took      time.Duration `json:"took"`
	LastError string        `json:"lastError,omitempty"`
}

// Versions are a node's kubelet, runtime and binaries.
type Versions struct {
	Kubelet    string            `json:"kubelet,omitempty"`
	Runtime    string            `json:"runtime,omitempty"`
	Components map[string]string `json:"components,omitempty"`
}

// Step is a span of a node's timeline.
type Step struct {
	Name  string    `json:"name"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Phase is the release the control plane moved to in this step ("" for
	// a kubelet's step).
	Phase string `json:"phase,omitempty"`
}

// Phase is a stretch of the upgrade: the control plane to a release, or
// the kubelets.
type Phase struct {
	Name  string    `json:"name"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// Availability is a prober's result (the format of test/env/prober and
// `make demo`'s): per target the requests answered and failed, the
// connections broken, the longest time without an answer.
type Availability struct {
	Started time.Time            `json:"started"`
	Ended   time.Time            `json:"ended"`
	Targets []AvailabilityTarget `json:"targets"`
}

// AvailabilityTarget is one target probed.
type AvailabilityTarget struct {
	Name       string        `json:"name"`
	Requests   int           `json:"requests"`
	Failed     int           `json:"failed"`
	Streams    int           `json:"streams"`
	Broken     int           `json:"broken"`
	LongestGap time.Duration `json:"longestGap"`
}

// ReadAvailability reads a prober's result, refusing what does not
// parse (naming the file and the target).
func ReadAvailability(name string, r io.Reader) (*Availability, error) {
	var a Availability
	if err := json.NewDecoder(io.LimitReader(r, 64<<20)).Decode(&a); err != nil {
		return nil, fmt.Errorf("availability %s: %w", name, err)
	}
	for _, t := range a.Targets {
		if t.Name == "" || len(t.Name) > 512 || t.Requests < 0 || t.Failed < 0 || t.Failed > t.Requests || t.Streams < 0 || t.Broken < 0 || t.LongestGap < 0 {
			return nil, fmt.Errorf("availability %s: target %q: counts that do not add up (requests %d, failed %d, streams %d, broken %d, longest gap %s)",
				name, t.Name, t.Requests, t.Failed, t.Streams, t.Broken, t.LongestGap)
		}
	}
	return &a, nil
}

// partTo is a control-plane step's name: "kube-apiserver to v1.31.14".
var partTo = regexp.MustCompile(`^(\S+) to (v\d+\.\d+\.\d+\S*)$`)

// Build makes the report of u: nodes are the Nodes now (nil: after
// versions unknown), rel the release it went to (nil: no bundle),
// avail a prober's result (nil: none ran).
func Build(u *record.Upgrade, nodes []corev1.Node, rel *release.Release, avail *Availability, now time.Time) *Report {
	r := &Report{Generated: now.UTC(), From: u.From, To: u.To, State: u.State, ControlPlane: u.ControlPlane, Hops: u.Hops,
		Started: u.Started, Ended: u.Updated, LastError: u.LastError, EtcdBackup: u.Backup, Availability: avail, Findings: []record.Finding{}}
	if u.Plan != nil {
		r.Findings = append(r.Findings, u.Plan.Findings...)
		r.Omitted = u.Plan.Omitted
	}
	if rel != nil {
		r.Bundle = bundleOf(rel)
	}
	planned := map[string]record.PlannedNode{}
	if u.Plan != nil {
		for _, n := range u.Plan.Nodes {
			planned[n.Name] = n
		}
	}
	live := map[string]*corev1.Node{}
	for i := range nodes {
		live[nodes[i].Name] = &nodes[i]
	}
	chain := append(slices.Clone(u.Hops), u.To)
	phases := map[string]*Phase{}
	for i := range u.Nodes {
		n := &u.Nodes[i]
		out := Node{Name: n.Name, Role: n.Role, Status: n.Status, Containers: n.Containers, LastError: n.LastError, Steps: []Step{}}
		p := planned[n.Name]
		out.Before = Versions{Kubelet: p.Kubelet, Runtime: p.Runtime, Components: p.Components}
		out.After = Versions{Components: map[string]string{}}
		if ln := live[n.Name]; ln != nil {
			out.After.Kubelet, out.After.Runtime = ln.Status.NodeInfo.KubeletVersion, ln.Status.NodeInfo.ContainerRuntimeVersion
		}
		kubeadm := 0
		for _, s := range u.Timeline(n) {
			st := Step{Name: s.Name, Start: s.Start, End: s.End}
			if st.End.IsZero() {
				st.End = u.Updated // in flight when the record was last written
			}
			if m := partTo.FindStringSubmatch(s.Name); m != nil {
				st.Phase = m[2]
				out.After.Components[m[1]] = m[2]
			} else if s.Name == "kubeadm" && kubeadm < len(chain) {
				st.Phase = chain[kubeadm]
				kubeadm++
			}
			name := "kubelets to " + u.To
			if st.Phase != "" {
				name = "control plane to " + st.Phase
			}
			widen(phases, name, st.Start, st.End)
			out.Steps = append(out.Steps, st)
		}
		if len(out.Steps) > 0 {
			out.Took = out.Steps[len(out.Steps)-1].End.Sub(out.Steps[0].Start)
		}
		for k, v := range out.Before.Components {
			if _, moved := out.After.Components[k]; !moved {
				if k == "kubelet" && out.After.Kubelet != "" {
					v = out.After.Kubelet
				}
				out.After.Components[k] = v
			}
		}
		if c := n.Containers; c != nil {
			r.Totals.Before += c.Before
			r.Totals.Kept += c.Kept
			r.Totals.Restarted += c.Restarted
			r.Totals.Recreated += c.Recreated
		}
		r.Nodes = append(r.Nodes, out)
	}
	for _, p := range phases {
		r.Phases = append(r.Phases, *p)
	}
	sort.Slice(r.Phases, func(i, j int) bool { return r.Phases[i].Start.Before(r.Phases[j].Start) })
	return r
}

func widen(phases map[string]*Phase, name string, start, end time.Time) {
	p := phases[name]
	if p == nil {
		phases[name] = &Phase{Name: name, Start: start, End: end}
		return
	}
	if start.Before(p.Start) {
		p.Start = start
	}
	if end.After(p.End) {
		p.End = end
	}
}

func bundleOf(rel *release.Release) *Bundle {
	b := &Bundle{}
	if rel.Record != nil {
		b.Digest = rel.Record.BundleDigest
	}
	if m := rel.Manifest; m != nil {
		b.Signer, b.Created = m.Signer, m.Created
		for _, img := range m.Images {
			b.Images = append(b.Images, Artifact{Name: img.Ref, Digest: img.Digest})
		}
		for _, f := range m.Files {
			b.Files = append(b.Files, Artifact{Name: f.Path, Digest: "sha256:" + f.SHA256})
		}
	}
	return b
}
