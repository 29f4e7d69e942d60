// Package programs gives the tests kubelift's own programs (bundle,
// upgrade, kubelift-sandbox) built from this tree: the ones make test
// built once for its run ($KUBELIFT_TEST_BIN), or, for a test run by
// hand, a build into the test's own directory.
package programs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Env names the directory make test builds the programs into, once for
// every test package of its run (each would otherwise link its own).
const Env = "KUBELIFT_TEST_BIN"

// packages are the programs by name, as `go build` takes them.
var packages = map[string]string{
	"bundle":           "github.com/kubelift/kubelift/cmd/bundle",
	"upgrade":          "github.com/kubelift/kubelift/cmd/upgrade",
	"kubelift-sandbox": "github.com/kubelift/kubelift/test/env/sandbox/cmd/kubelift-sandbox",
}

// Dir returns a directory holding bundle, upgrade and kubelift-sandbox
// (linked static):
// $KUBELIFT_TEST_BIN if it is set (each program must be there), else dir,
// built into with one `go build`.
func Dir(dir string) (string, error) {
	if shared := os.Getenv(Env); shared != "" {
		for name := range packages {
			if _, err := os.Stat(filepath.Join(shared, name)); err != nil {
				return "", fmt.Errorf("$%s: %w", Env, err)
			}
		}
		return shared, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, p := range packages {
		args = append(args, p)
	}
	// Static, as make builds them: upgrade is also the agent's image's
	// program (bundle create --agent).
	build := exec.Command("go", args...)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build kubelift's programs: %v\n%s", err, out)
	}
	return dir, nil
}
