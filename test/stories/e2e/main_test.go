// Package e2e runs kubelift's programs, built from this tree, against real
// servers on loopback: Debian's docker-registry, openssl and skopeo.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/test/env/programs"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kubelift-e2e-bin-")
	if err != nil {
		panic(err)
	}
	if binDir, err = programs.Dir(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The programs' cache (import's zstd copies, say) in the run's
	// directory, never ~/.cache/kubelift; a test that shares a cache
	// gives its own --cache-dir.
	os.Setenv(cli.CacheDirEnv, filepath.Join(dir, "cache"))
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	stdout, stderr string
	code           int
}

// run runs a program with a time limit and returns its output and exit code.
func run(t *testing.T, name string, args ...string) result {
	t.Helper()
	return runIn(t, "", name, args...)
}

// runIn is run with stdin.
func runIn(t *testing.T, stdin, name string, args ...string) result {
	t.Helper()
	if filepath.Base(name) == name {
		if p := filepath.Join(binDir, name); fileExists(p) {
			name = p
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Stdin = strings.NewReader(stdin)
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return result{out.String(), errb.String(), code}
}

func mustRun(t *testing.T, name string, args ...string) result {
	t.Helper()
	r := run(t, name, args...)
	if r.code != 0 {
		t.Fatalf("%s %v: exit %d\nstdout: %s\nstderr: %s", filepath.Base(name), args, r.code, r.stdout, r.stderr)
	}
	return r
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
