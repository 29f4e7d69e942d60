// Package reporttest reads back what an HTML report shows, as a browser
// would parse it: the timeline's bars, each node's restarts, the
// phases, and anything the page would load from elsewhere. The report's
// own tests and the sandbox's stories check a page with it.
package reporttest

import (
	"encoding/xml"
	"fmt"
	"io"
	"strings"

	"golang.org/x/net/html"
)

// Page is what a report page shows.
type Page struct {
	// Bars are the timeline's, in order: "NODE STEP START_MS+MS".
	Bars []string
	// Restarted is each node's restarted containers, as the nodes table
	// shows them.
	Restarted map[string]string
	// Phases are the chart's bands, in order.
	Phases []string
	// AvailabilityRows counts the availability table's targets.
	AvailabilityRows int
	// Loads are what the page would fetch (src, href, url(), @import,
	// script, link, img, iframe); a self-contained page has none.
	Loads []string
}

// Parse reads a report page. Its HTML is parsed as a browser parses it;
// its timeline, an SVG, must also be well-formed XML.
func Parse(page string) (*Page, error) {
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		return nil, err
	}
	p := &Page{Restarted: map[string]string{}}
	var walk func(n *html.Node, row, table string)
	walk = func(n *html.Node, row, table string) {
		if n.Type == html.ElementNode {
			attrs := map[string]string{}
			for _, a := range n.Attr {
				attrs[a.Key] = a.Val
				if a.Key == "src" || a.Key == "href" || a.Key == "srcset" || strings.Contains(a.Val, "url(") {
					p.Loads = append(p.Loads, fmt.Sprintf("<%s %s=%q>", n.Data, a.Key, a.Val))
				}
			}
			switch {
			case n.Data == "link" || n.Data == "script" || n.Data == "img" || n.Data == "iframe" || n.Data == "object" || n.Data == "embed":
				p.Loads = append(p.Loads, "<"+n.Data+">")
			case n.Data == "style" && n.FirstChild != nil && (strings.Contains(n.FirstChild.Data, "url(") || strings.Contains(n.FirstChild.Data, "@import")):
				p.Loads = append(p.Loads, "a style that imports or fetches")
			case n.Data == "table":
				table = attrs["id"]
			case n.Data == "rect" && strings.HasPrefix(attrs["class"], "step "):
				p.Bars = append(p.Bars, fmt.Sprintf("%s %s %s+%s", attrs["data-node"], attrs["data-step"], attrs["data-start-ms"], attrs["data-ms"]))
			case n.Data == "g" && attrs["data-phase"] != "":
				p.Phases = append(p.Phases, attrs["data-phase"])
			case n.Data == "tr" && attrs["data-node"] != "":
				row = attrs["data-node"]
			case n.Data == "tr" && table == "availability" && n.Parent != nil:
				if c := n.FirstChild; c != nil && c.Type == html.ElementNode && c.Data == "td" {
					p.AvailabilityRows++
				}
			case n.Data == "td" && strings.Contains(attrs["class"], "restarted") && n.FirstChild != nil:
				p.Restarted[row] = n.FirstChild.Data
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c, row, table)
		}
	}
	walk(doc, "", "")
	i, j := strings.Index(page, `<svg xmlns="http://www.w3.org/2000/svg" id="timeline"`), strings.Index(page, "</svg>")
	if i < 0 || j < i {
		return nil, fmt.Errorf("no timeline (svg#timeline)")
	}
	d := xml.NewDecoder(strings.NewReader(page[i : j+len("</svg>")]))
	for {
		_, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("the timeline is not well-formed SVG: %w", err)
		}
	}
	return p, nil
}
