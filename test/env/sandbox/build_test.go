package sandbox

import (
	"context"
	"strings"
	"testing"
)

// A kubeadm sandbox two minors ahead is refused before anything is
// built or booted. The context is cancelled already: a build started
// before the check would fail with that instead.
func TestKubeadmSandboxTwoMinorsAheadRefusedBeforeAnyBuild(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cfg := Config{Kubeadm: true, OldVersion: "v1.30.14", NewVersion: "v1.32.13", Log: t.Logf}
	cfg.Defaults()
	for name, build := range map[string]func() error{
		"Build": func() error { _, err := Build(ctx, cfg); return err },
		"up":    func() error { return (&State{Dir: t.TempDir()}).up(ctx, cfg) },
	} {
		err := build()
		if err == nil || !strings.Contains(err.Error(), "passes through v1.31") {
			t.Errorf("%s: %v, want the refusal of a kubeadm control plane moved two minors", name, err)
		}
	}
}
