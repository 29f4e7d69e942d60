// Package upstream runs upstream Kubernetes' own tests on the code kubelift
// changes in it: pkg/kubelet/kuberuntime of the kubelet the sandboxes run
// with kubelift's hash-skip patch (hack/kubelet/), and kubelift's tests of
// the patch beside them. The patched kubelet's behaviour on a real node is
// the stories' concern; this is the patch held to upstream's unit tests.
// The built-in catalog is held here to upstream's source as well: what it
// says of each release that the release's own code says.
package upstream

import (
	"context"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestPatchedKuberuntime builds (or finds cached) the real v1.31.4 kubelet
// with kubelift's hash-skip patch from the module proxy and runs upstream's
// pkg/kubelet/kuberuntime tests, and kubelift's, on the patched copy.
func TestPatchedKuberuntime(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(root, "hack", "build-kubelet.sh"), "v1.31.4", "--test").CombinedOutput()
	log := string(out)
	if err != nil {
		t.Fatalf("build-kubelet.sh: %v\n%s", err, log)
	}
	for _, want := range []string{
		"ok  \tk8s.io/kubernetes/pkg/kubelet/kuberuntime", // upstream's whole package
		"--- PASS: TestKubeliftHashSkip",
		"--- PASS: TestComputePodActions ",
		"--- PASS: TestComputePodActionsWithRestartableInitContainers",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("missing %q in:\n%s", want, log)
		}
	}
	if strings.Contains(log, "FAIL") {
		t.Errorf("a test failed:\n%s", log)
	}
	lines := strings.Split(strings.TrimSpace(log), "\n")
	kubelet := lines[len(lines)-1]
	v, err := exec.CommandContext(ctx, kubelet, "--version").Output()
	if err != nil || strings.TrimSpace(string(v)) != "Kubernetes v1.31.4" {
		t.Errorf("%s --version: %q (%v)", kubelet, v, err)
	}
}
