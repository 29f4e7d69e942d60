package driver_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/driver/drivertest"
	"github.com/kubelift/kubelift/internal/inplace/preflight"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/nodeaccess"
	"github.com/kubelift/kubelift/internal/nodescript/fakenode"
	"github.com/kubelift/kubelift/internal/registry"
)

// The snapshot is copied off its node whole, checked against the node's
// file by sha256 before it takes its name; a copy the node's file does not
// match leaves nothing behind; a dry run copies nothing.
func TestKeepOffNode(t *testing.T) {
	const file = "/var/lib/kubelift/backup/v1.31.4/etcd-snapshot-20261202T040821Z.db"
	data := []byte(strings.Repeat("etcd page\n", 1000))
	nodeSum := fmt.Sprintf("%x", sha256.Sum256(data))
	node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
		"read-file": func(args []string) (string, error) {
			if args[0] != file {
				return "", fmt.Errorf("cat: %s: No such file or directory", args[0])
			}
			return string(data), nil
		},
		"check-file": func(args []string) (string, error) {
			if args[0] != file || args[1] != nodeSum {
				return "", fmt.Errorf("%s has sha256 %s, not %s", args[0], nodeSum, args[1])
			}
			return "", nil
		},
	}}
	dir := filepath.Join(t.TempDir(), "snapshots")
	fx := &drivertest.Effects{Nodes: map[string]nodeaccess.Node{"cp-1": node}}
	r := &driver.Run{Log: slog.New(slog.DiscardHandler), Fx: fx, Snapshot: driver.Snapshots{Dir: dir}, Target: &release.Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 14}},
		Plan: &preflight.Plan{From: []string{"v1.31.4"}, Nodes: []preflight.NodeState{{Name: "cp-1", Role: release.RoleControlPlane}}}}
	got, err := driver.KeepOffNode(context.Background(), r, "cp-1", file)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "cp-1-etcd-snapshot-20261202T040821Z.db"); got != want {
		t.Errorf("copy at %s, want %s", got, want)
	}
	if b, err := os.ReadFile(got); err != nil || string(b) != string(data) {
		t.Errorf("the copy: %d bytes, %v", len(b), err)
	}

	// The node's file changed under the copy (a different sum).
	nodeSum = strings.Repeat("0", 64)
	os.RemoveAll(dir)
	if _, err := driver.KeepOffNode(context.Background(), r, "cp-1", file); err == nil || !strings.Contains(err.Error(), "has sha256") {
		t.Fatalf("a copy that does not match: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a failed copy left %d files in %s", len(entries), dir)
	}

	r.Dry = true
	if got, err := driver.KeepOffNode(context.Background(), r, "cp-1", file); got != "" || err != nil {
		t.Errorf("a dry run copied to %q (%v)", got, err)
	}
}

// pushed records what KeepOffNode pushed, and fails when told to.
type pushed struct {
	ref, path, sum string
	art            registry.Artifact
	fail           error
}

func (p *pushed) PushFile(_ context.Context, ref, path, sum string, art registry.Artifact) (string, error) {
	p.ref, p.path, p.sum, p.art = ref, path, sum, art
	return "sha256:" + strings.Repeat("d", 64), p.fail
}

// With a repository, the copy is pushed on as an artifact tagged with its
// name, with the sum the node's file has; a push that fails fails the
// step, naming the copy (which stays).
func TestKeepOffNodePushes(t *testing.T) {
	const file = "/var/lib/kubelift/backup/v1.31.4/etcd-snapshot-20261202T040821Z.db"
	data := []byte("etcd pages\n")
	sum := fmt.Sprintf("%x", sha256.Sum256(data))
	node := &fakenode.Node{Scripts: map[string]fakenode.Handler{
		"read-file":  func([]string) (string, error) { return string(data), nil },
		"check-file": func([]string) (string, error) { return "", nil },
	}}
	dir := filepath.Join(t.TempDir(), "snapshots")
	p := &pushed{}
	r := &driver.Run{Log: slog.New(slog.DiscardHandler), Fx: &drivertest.Effects{Nodes: map[string]nodeaccess.Node{"cp-1": node}},
		Snapshot: driver.Snapshots{Dir: dir, Repository: "registry.corp:5000/backups/etcd", Registry: p},
		Target:   &release.Release{Version: catalog.Version{Major: 1, Minor: 31, Patch: 14}},
		Plan:     &preflight.Plan{From: []string{"v1.31.4"}, Nodes: []preflight.NodeState{{Name: "cp-1", Role: release.RoleControlPlane}}}}
	got, err := driver.KeepOffNode(context.Background(), r, "cp-1", file)
	if err != nil {
		t.Fatal(err)
	}
	if p.ref != "registry.corp:5000/backups/etcd:cp-1-etcd-snapshot-20261202T040821Z.db" || p.path != got || p.sum != sum ||
		p.art.Type != driver.SnapshotArtifact.Type || p.art.Annotations["org.opencontainers.image.title"] != "cp-1-etcd-snapshot-20261202T040821Z.db" {
		t.Errorf("pushed %+v, want the copy %s with sum %s", p, got, sum)
	}
	p.fail = errors.New("UNAUTHORIZED: authentication required")
	_, err = driver.KeepOffNode(context.Background(), r, "cp-1", file)
	if err == nil || !strings.Contains(err.Error(), "UNAUTHORIZED") || !strings.Contains(err.Error(), got) {
		t.Errorf("a push refused: %v", err)
	}
	if _, serr := os.Stat(got); serr != nil {
		t.Errorf("the copy is gone after a refused push: %v", serr)
	}
	p.ref, p.fail, r.Snapshot.Repository = "", nil, ""
	if _, err := driver.KeepOffNode(context.Background(), r, "cp-1", file); err != nil || p.ref != "" {
		t.Errorf("without a repository: pushed %q (%v)", p.ref, err)
	}
}
