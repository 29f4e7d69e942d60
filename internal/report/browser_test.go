package report

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kubelift/kubelift/internal/report/reporttest"
)

// browser is the headless Chromium Debian packages (make deps installs
// it).
const browser = "chromium-headless-shell"

// open loads page in a headless browser with no network (every name
// resolves to nothing) and returns the DOM it built and every URL it
// asked for (its net log).
func open(t *testing.T, page string) (dom string, urls []string) {
	t.Helper()
	bin, err := exec.LookPath(browser)
	if err != nil {
		bin = "/usr/lib/chromium/" + browser // Debian's, beside its wrapper
		if _, serr := os.Stat(bin); serr != nil {
			t.Fatalf("%s: %v: install it (make deps: apt-get install %s)", browser, err, browser)
		}
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "report.html")
	if err := os.WriteFile(file, []byte(page), 0o600); err != nil {
		t.Fatal(err)
	}
	netlog := filepath.Join(dir, "net.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--user-data-dir="+filepath.Join(dir, "profile"),
		"--host-resolver-rules=MAP * ~NOTFOUND", "--log-net-log="+netlog, "--virtual-time-budget=2000", "--dump-dom", "file://"+file)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, stderr.String())
	}
	log, err := os.ReadFile(netlog)
	if err != nil {
		t.Fatalf("the browser's net log: %v", err)
	}
	for _, m := range regexp.MustCompile(`"url":"([^"]*)"`).FindAllStringSubmatch(string(log), -1) {
		urls = append(urls, m[1])
	}
	return out.String(), urls
}

// In a real browser the page builds the DOM the report meant (a bar per
// node and step at the record's times) and asks for nothing but itself;
// a page that loads an image is caught asking.
func TestPageInABrowser(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	u := upgradeOf(t0)
	var b bytes.Buffer
	if err := Build(u, nodesOf(), relOf(t0), nil, t0).HTML(&b); err != nil {
		t.Fatal(err)
	}
	dom, urls := open(t, b.String())
	got, err := reporttest.Parse(dom)
	if err != nil {
		t.Fatalf("the DOM the browser built: %v\n%s", err, dom)
	}
	var want []string
	for i := range u.Nodes {
		n := &u.Nodes[i]
		for _, s := range u.Timeline(n) {
			want = append(want, fmt.Sprintf("%s %s %d+%d", n.Name, s.Name, s.Start.Sub(t0).Milliseconds(), s.End.Sub(s.Start).Milliseconds()))
		}
	}
	if strings.Join(got.Bars, "\n") != strings.Join(want, "\n") {
		t.Errorf("the browser's bars\n%s\nthe record's\n%s", strings.Join(got.Bars, "\n"), strings.Join(want, "\n"))
	}
	for _, u := range urls {
		if !strings.HasPrefix(u, "file://") {
			t.Errorf("the page asked for %s", u)
		}
	}
	// The check sees a page that loads something (a file:// page itself
	// is no network request: the net log shows none for it).
	_, urls = open(t, strings.Replace(b.String(), "<body>", `<body><img src="https://cdn.example/logo.png">`, 1))
	seen := false
	for _, u := range urls {
		seen = seen || strings.HasPrefix(u, "https://cdn.example/")
	}
	if !seen {
		t.Errorf("a page with an image from a CDN: the net log shows %v", urls)
	}
}
