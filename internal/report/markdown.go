package report

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Markdown writes the report as Markdown, for a ticket that takes text:
// the summary, the nodes, the findings, availability, the bundle (the
// timeline as each node's steps with their times).
func (r *Report) Markdown(w io.Writer) error {
	var b strings.Builder
	cell := func(s string) string { return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s) }
	fmt.Fprintf(&b, "# Kubernetes upgrade %s to %s: %s\n\n", r.From, r.To, r.State)
	fmt.Fprintf(&b, "- started %s, last recorded %s\n", r.Started.UTC().Format(time.RFC3339), r.Ended.UTC().Format(time.RFC3339))
	if len(r.Hops) > 0 {
		fmt.Fprintf(&b, "- the control plane passed through %s\n", strings.Join(r.Hops, ", "))
	}
	fmt.Fprintf(&b, "- containers running before the swaps: %d; kept %d, restarted %d, of static pods recreated %d\n", r.Totals.Before, r.Totals.Kept, r.Totals.Restarted, r.Totals.Recreated)
	if r.LastError != "" {
		fmt.Fprintf(&b, "- last error: %s\n", cell(r.LastError))
	}
	b.WriteString("\n## Nodes\n\n| node | role | status | kubelet | runtime | took | before | kept | restarted | recreated |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, n := range r.Nodes {
		counts := "| - | - | - | - |"
		if c := n.Containers; c != nil {
			counts = fmt.Sprintf("| %d | %d | %d | %d |", c.Before, c.Kept, c.Restarted, c.Recreated)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s → %s | %s → %s | %s %s\n", n.Name, n.Role, cell(n.Status), n.Before.Kubelet, n.After.Kubelet, cell(n.Before.Runtime), cell(n.After.Runtime),
			n.Took.Round(time.Millisecond), counts)
	}
	b.WriteString("\n## Timeline\n\n")
	for _, p := range r.Phases {
		fmt.Fprintf(&b, "- %s: %s to %s\n", p.Name, p.Start.UTC().Format(time.TimeOnly), p.End.UTC().Format(time.TimeOnly))
	}
	for _, n := range r.Nodes {
		var steps []string
		for _, s := range n.Steps {
			steps = append(steps, fmt.Sprintf("%s %s (%s)", s.Start.UTC().Format(time.TimeOnly), s.Name, s.End.Sub(s.Start).Round(time.Millisecond)))
		}
		fmt.Fprintf(&b, "\n**%s**: %s\n", n.Name, strings.Join(steps, "; "))
	}
	b.WriteString("\n## Findings of the plan\n\n")
	if len(r.Findings) == 0 {
		b.WriteString("None.\n")
	} else {
		b.WriteString("| severity | check | object | finding | how it was dealt with |\n|---|---|---|---|---|\n")
		for _, f := range r.Findings {
			fmt.Fprintf(&b, "| %s | %s | `%s` | %s | %s |\n", f.Severity, f.Check, cell(f.Object), cell(f.Message), cell(f.Resolution))
		}
		if r.Omitted > 0 {
			fmt.Fprintf(&b, "\nand %d more (upgrade plan lists them).\n", r.Omitted)
		}
	}
	if a := r.Availability; a != nil {
		b.WriteString("\n## Availability while it ran\n\n| target | requests | failed | streams | broken | longest without an answer |\n|---|---|---|---|---|---|\n")
		for _, t := range a.Targets {
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %s |\n", cell(t.Name), t.Requests, t.Failed, t.Streams, t.Broken, t.LongestGap.Round(time.Millisecond))
		}
	}
	if bd := r.Bundle; bd != nil {
		fmt.Fprintf(&b, "\n## Bundle\n\n- digest `%s`\n- signed by `%s`\n- made %s\n\n| image or file | digest |\n|---|---|\n", bd.Digest, bd.Signer, bd.Created.UTC().Format(time.RFC3339))
		for _, a := range slices.Concat(bd.Images, bd.Files) {
			fmt.Fprintf(&b, "| %s | `%s` |\n", cell(a.Name), a.Digest)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
