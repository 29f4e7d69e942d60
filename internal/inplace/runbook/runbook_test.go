package runbook

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// docs/runbook.md lists a node's steps as kubeletSteps names them, in
// their order: the runbook a user reads is the one that runs.
func TestRunbookListsTheNodeSteps(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "Per node, the named steps of `kubeletSteps`")
	end := strings.Index(doc[max(start, 0):], "A failure from **wait Ready** on")
	if start < 0 || end < 0 {
		t.Fatal("docs/runbook.md no longer has the node's steps where this test looks")
	}
	var listed []string
	for _, line := range strings.Split(doc[start:start+end], "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "- **"); ok {
			name, _, _ = strings.Cut(name, "**")
			listed = append(listed, name)
		}
	}
	var names []string
	for _, s := range (&upgradeRun{}).kubeletSteps() {
		names = append(names, s.name)
	}
	if !slices.Equal(listed, names) {
		t.Errorf("docs/runbook.md lists the node's steps\n  %s\nkubeletSteps runs\n  %s", strings.Join(listed, ", "), strings.Join(names, ", "))
	}
}
