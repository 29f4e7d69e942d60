// Package engine tests kubelift's upgrade engine end to end on a sandbox of
// its own (1 control plane, 3 workers): the built upgrade program, run on
// the sandbox's admin machine, stages binaries over the nodes' real sshd
// and plans against the real API server, registry and kubelets.
package engine

import (
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/test/env/harness"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

var (
	h      *harness.Harness
	sb     *sandbox.State
	client kubernetes.Interface
	bin    string
	work   string
	// Bundles of the new version: with kubelift's hash-skip kubelet, and
	// with upstream's.
	hashSkipBundle, upstreamBundle string
)

func TestMain(m *testing.M) {
	harness.Main(m, "kle", "10.82.0", 1, 3, func(x *harness.Harness) {
		h = x
		sb, client, bin, work, hashSkipBundle, upstreamBundle = h.SB, h.Client, h.Bin, h.Work, h.HashSkipBundle, h.UpstreamBundle
	})
}

type result = harness.Result

var programOut = harness.ProgramOut

func upgrade(t *testing.T, stdin string, args ...string) result { return h.Upgrade(t, stdin, args...) }
func registryFlags() ([]string, string)                         { return h.RegistryFlags() }
func sshFlags() []string                                        { return h.SSHFlags() }
func importBundle(t *testing.T, file string, extra ...string) result {
	return h.Import(t, file, extra...)
}
func ssh(t *testing.T, node, command string) string { return h.SSH(t, node, command) }
