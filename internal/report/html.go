package report

import (
	"fmt"
	"html/template"
	"io"
	"strings"
	"time"
)

// The chart's geometry, in SVG user units.
const (
	chartLabel  = 170 // the node names' column
	chartWidth  = 1000
	chartRow    = 22
	chartTop    = 34 // the phases' labels above the rows
	chartBottom = 26 // the time axis below
)

// bar is one step drawn: a node's row, its span in the chart.
type bar struct {
	X, Y, W, H  float64
	Class, Tip  string
	Node, Step  string
	StartMS, MS int64
}

type band struct {
	X, W, H float64
	Name    string
	Class   string
}

type tick struct {
	X     float64
	Label string
}

type label struct {
	Y    float64
	Name string
}

type chart struct {
	Width, Height float64
	PlotX, PlotW  float64
	Bars          []bar
	Bands         []band
	Ticks         []tick
	Labels        []label
	AxisY         float64
}

// chartOf lays the nodes' steps out: a row per node, a bar per step, the
// phases as bands behind them, a tick every round interval.
func (r *Report) chartOf() chart {
	c := chart{Width: chartLabel + chartWidth + 20, PlotX: chartLabel, PlotW: chartWidth}
	start, end := r.Started, r.Ended
	for _, n := range r.Nodes {
		for _, s := range n.Steps {
			if s.End.After(end) {
				end = s.End
			}
		}
	}
	total := end.Sub(start)
	if total <= 0 {
		total = time.Second
	}
	x := func(t time.Time) float64 { return chartLabel + float64(t.Sub(start))/float64(total)*chartWidth }
	rows := float64(len(r.Nodes)) * chartRow
	c.Height = chartTop + rows + chartBottom
	c.AxisY = chartTop + rows
	for i, p := range r.Phases {
		class := "kubelets"
		if strings.HasPrefix(p.Name, "control plane") {
			class = fmt.Sprintf("cp%d", i%2)
		}
		c.Bands = append(c.Bands, band{X: x(p.Start), W: max(1, x(p.End)-x(p.Start)), H: c.Height - chartBottom, Name: p.Name, Class: class})
	}
	for i, n := range r.Nodes {
		y := chartTop + float64(i)*chartRow
		c.Labels = append(c.Labels, label{Y: y + chartRow*0.7, Name: n.Name})
		for _, s := range n.Steps {
			w := max(1.5, x(s.End)-x(s.Start))
			c.Bars = append(c.Bars, bar{X: x(s.Start), Y: y + 3, W: w, H: chartRow - 6, Class: stepClass(s), Node: n.Name, Step: s.Name,
				StartMS: s.Start.Sub(r.Started).Milliseconds(), MS: s.End.Sub(s.Start).Milliseconds(),
				Tip: fmt.Sprintf("%s: %s, %s to %s (%s)", n.Name, s.Name, s.Start.UTC().Format(time.TimeOnly), s.End.UTC().Format(time.TimeOnly), s.End.Sub(s.Start).Round(time.Millisecond))})
		}
	}
	every := tickEvery(total)
	for t := time.Duration(0); t <= total; t += every {
		c.Ticks = append(c.Ticks, tick{X: x(start.Add(t)), Label: shortDuration(t)})
	}
	return c
}

// stepClass colours a step: the control plane's, the kubelet's swap,
// the waits, the others.
func stepClass(s Step) string {
	switch {
	case s.Phase != "":
		return "s-cp"
	case s.Name == "swap" || s.Name == "runtime" || s.Name == "tools":
		return "s-swap"
	case strings.HasPrefix(s.Name, "wait") || s.Name == "verify" || s.Name == "settle" || s.Name == "workload gate" || s.Name == "drain":
		return "s-wait"
	}
	return "s-step"
}

func tickEvery(total time.Duration) time.Duration {
	for _, d := range []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute,
		10 * time.Minute, 30 * time.Minute, time.Hour, 6 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour} {
		if total/d <= 12 {
			return d
		}
	}
	return total / 12 // at most a dozen ticks, however long
}

func shortDuration(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return strings.TrimSuffix(strings.TrimSuffix(d.String(), "0s"), "m0")
}

var page = template.Must(template.New("report").Funcs(template.FuncMap{
	"t":   func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	"dur": func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"f":   func(v float64) string { return fmt.Sprintf("%.1f", v) },
	"or": func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	},
}).Parse(pageHTML))

// HTML writes the report as one page that needs no network: its CSS
// and its chart (SVG) are inline, it loads nothing.
func (r *Report) HTML(w io.Writer) error {
	return page.Execute(w, struct {
		*Report
		Chart chart
	}{r, r.chartOf()})
}

const pageHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>kubelift upgrade {{.From}} to {{.To}}: {{.State}}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .5em 0; } th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.n { text-align: right; font-variant-numeric: tabular-nums; } code { font-size: 12px; }
.bad { color: #b00; font-weight: bold; } .ok { color: #070; }
svg text { font: 11px system-ui, sans-serif; }
.s-cp { fill: #7b4fb5; } .s-swap { fill: #d9822b; } .s-wait { fill: #9cb8d9; } .s-step { fill: #4f81b5; }
.cp0 { fill: #efe7f7; } .cp1 { fill: #e4d8f2; } .kubelets { fill: #eef4fa; }
</style>
</head>
<body>
<h1>Kubernetes upgrade {{.From}} to {{.To}}: <span class="{{if eq .State "upgrade-complete"}}ok{{else}}bad{{end}}">{{.State}}</span></h1>
<table>
<tr><th>started</th><td>{{t .Started}}</td></tr>
<tr><th>last recorded</th><td>{{t .Ended}}</td></tr>
<tr><th>control plane</th><td>{{or .ControlPlane}}{{if .Hops}}, through {{range $i, $h := .Hops}}{{if $i}}, {{end}}{{$h}}{{end}}{{end}}</td></tr>
<tr><th>containers</th><td>{{.Totals.Before}} running before the swaps: {{.Totals.Kept}} kept, <span class="{{if .Totals.Restarted}}bad{{else}}ok{{end}}">{{.Totals.Restarted}} restarted</span>{{if .Totals.Recreated}}, {{.Totals.Recreated}} of static pods recreated (by design){{end}}</td></tr>
{{if .EtcdBackup}}<tr><th>etcd snapshot</th><td><code>{{.EtcdBackup}}</code></td></tr>{{end}}
{{if .LastError}}<tr><th>last error</th><td class="bad">{{.LastError}}</td></tr>{{end}}
<tr><th>report made</th><td>{{t .Generated}}</td></tr>
</table>

<h2>Timeline</h2>
<svg xmlns="http://www.w3.org/2000/svg" id="timeline" width="{{f .Chart.Width}}" height="{{f .Chart.Height}}" viewBox="0 0 {{f .Chart.Width}} {{f .Chart.Height}}" role="img" aria-label="each node's steps over time">
{{range .Chart.Bands}}<g class="phase" data-phase="{{.Name}}"><rect class="{{.Class}}" x="{{f .X}}" y="14" width="{{f .W}}" height="{{f .H}}"/><text x="{{f .X}}" y="10">{{.Name}}</text></g>
{{end}}{{range .Chart.Labels}}<text x="4" y="{{f .Y}}">{{.Name}}</text>
{{end}}{{range .Chart.Bars}}<rect class="step {{.Class}}" x="{{f .X}}" y="{{f .Y}}" width="{{f .W}}" height="{{f .H}}" data-node="{{.Node}}" data-step="{{.Step}}" data-start-ms="{{.StartMS}}" data-ms="{{.MS}}"><title>{{.Tip}}</title></rect>
{{end}}<line x1="{{f .Chart.PlotX}}" y1="{{f .Chart.AxisY}}" x2="{{f .Chart.Width}}" y2="{{f .Chart.AxisY}}" stroke="#888"/>
{{range .Chart.Ticks}}<text x="{{f .X}}" y="{{f $.Chart.AxisY}}" dy="14">{{.Label}}</text>
{{end}}</svg>
<p><svg xmlns="http://www.w3.org/2000/svg" width="12" height="12"><rect class="s-cp" width="12" height="12"/></svg> control plane
<svg xmlns="http://www.w3.org/2000/svg" width="12" height="12"><rect class="s-swap" width="12" height="12"/></svg> swap (runtime, tools, kubelet)
<svg xmlns="http://www.w3.org/2000/svg" width="12" height="12"><rect class="s-wait" width="12" height="12"/></svg> drain and waits
<svg xmlns="http://www.w3.org/2000/svg" width="12" height="12"><rect class="s-step" width="12" height="12"/></svg> other steps</p>

<h2>Nodes</h2>
<table id="nodes">
<tr><th>node</th><th>role</th><th>status</th><th>kubelet</th><th>runtime</th><th>parts</th><th>took</th><th>containers before</th><th>kept</th><th>restarted</th><th>static recreated</th></tr>
{{range .Nodes}}<tr data-node="{{.Name}}"><td>{{.Name}}</td><td>{{.Role}}</td><td>{{.Status}}{{if .LastError}}: <span class="bad">{{.LastError}}</span>{{end}}</td>
<td>{{or .Before.Kubelet}} → {{or .After.Kubelet}}</td><td>{{or .Before.Runtime}} → {{or .After.Runtime}}</td>
<td>{{$before := .Before.Components}}{{range $k, $v := .After.Components}}{{$k}} {{or (index $before $k)}} → {{$v}}<br>{{end}}</td>
<td class="n">{{dur .Took}}</td>{{with .Containers}}<td class="n">{{.Before}}</td><td class="n">{{.Kept}}</td><td class="n restarted">{{.Restarted}}</td><td class="n">{{.Recreated}}</td>{{else}}<td colspan="4">not verified</td>{{end}}</tr>
{{end}}</table>

<h2>Findings of the plan</h2>
{{if .Findings}}<table id="findings">
<tr><th>severity</th><th>check</th><th>object</th><th>finding</th><th>how it was dealt with</th></tr>
{{range .Findings}}<tr><td>{{.Severity}}</td><td>{{.Check}}</td><td><code>{{.Object}}</code></td><td>{{.Message}}</td><td>{{.Resolution}}</td></tr>
{{end}}</table>{{if .Omitted}}<p>and {{.Omitted}} more (upgrade plan lists them).</p>{{end}}{{else}}<p>None.</p>{{end}}

{{with .Availability}}<h2>Availability while it ran</h2>
<p>{{t .Started}} to {{t .Ended}}</p>
<table id="availability">
<tr><th>target</th><th>requests</th><th>failed</th><th>streams</th><th>broken</th><th>longest without an answer</th></tr>
{{range .Targets}}<tr><td>{{.Name}}</td><td class="n">{{.Requests}}</td><td class="n">{{.Failed}}</td><td class="n">{{.Streams}}</td><td class="n">{{.Broken}}</td><td class="n">{{dur .LongestGap}}</td></tr>
{{end}}</table>{{end}}

{{with .Bundle}}<h2>Bundle</h2>
<table>
<tr><th>digest</th><td><code>{{.Digest}}</code></td></tr>
<tr><th>signed by</th><td><code>{{or .Signer}}</code></td></tr>
<tr><th>made</th><td>{{t .Created}}</td></tr>
</table>
<table id="artifacts">
<tr><th>image or file</th><th>digest</th></tr>
{{range .Images}}<tr><td>{{.Name}}</td><td><code>{{.Digest}}</code></td></tr>
{{end}}{{range .Files}}<tr><td>{{.Name}}</td><td><code>{{.Digest}}</code></td></tr>
{{end}}</table>{{end}}
</body>
</html>
`
