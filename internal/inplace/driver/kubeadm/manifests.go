package kubeadm

import (
	"context"
	"encoding/base64"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	kadm "github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// Rolling a kubeadm control plane back (Driver.Undo) uses what
// kubeadm kept: each `kubeadm upgrade` moves the static pod manifests it
// replaces into /etc/kubernetes/tmp/kubeadm-backup-manifests-TIME/ on the
// node. Undo puts the newest of those at the version the run started from
// back in place of each manifest at the target, newest part first
// (scheduler, controller manager, API server, then etcd when its image
// changed), keeping the replaced manifests beside kubeadm's backups, and
// waits for the static pods at the old version. On the first control
// plane it then puts back what `kubeadm upgrade apply` changed in the
// cluster: kubeadm-config's kubernetesVersion and the kube-proxy
// DaemonSet's image. etcd's data is not restored: the cluster wrote to it
// at the target, and a patch of etcd reads the same data (kubeadm itself
// restores etcd's data only when its own etcd upgrade fails).

// manifestRestore is one manifest to put back: kubeadm's backup over the
// current file.
type manifestRestore struct {
	Component string
	Backup    string
	Current   string
}

// readManifests reads the node's static pod manifests and kubeadm's
// backups of them (newest first), each parsed; a file that does not
// parse, or a path outside kubeadm's, is refused naming the node.
func readManifests(ctx context.Context, o *nodeops.Ops) (map[string]kadm.Manifest, []map[string]kadm.Manifest, error) {
	out, err := o.Run(ctx, "read the static pod manifests", nodescript.KubeadmManifests, append([]string{kadm.ManifestDir, kadm.TmpDir}, kadm.StaticPods...)...)
	if err != nil {
		return nil, nil, err
	}
	return parseManifests(o.Name, out)
}

// parseManifests reads what the node script kubeadm-manifests printed.
func parseManifests(node, out string) (map[string]kadm.Manifest, []map[string]kadm.Manifest, error) {
	current := map[string]kadm.Manifest{}
	var backups []map[string]kadm.Manifest
	lastDir := ""
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if l == "" {
			continue
		}
		if p, ok := strings.CutPrefix(l, "toolarge "); ok {
			return nil, nil, fmt.Errorf("node %s: static pod manifest %q is over 1 MiB: not read", node, p)
		}
		p, ok := strings.CutPrefix(l, "file ")
		if !ok || i+1 >= len(lines) {
			return nil, nil, fmt.Errorf("node %s: reading static pod manifests: unexpected line %q", node, l)
		}
		i++
		data, err := base64.StdEncoding.DecodeString(lines[i])
		if err != nil {
			return nil, nil, fmt.Errorf("node %s: static pod manifest %q: %w", node, p, err)
		}
		dir, file := path.Split(p)
		dir = path.Clean(dir)
		if comp := strings.TrimSuffix(file, ".yaml"); !strings.HasSuffix(file, ".yaml") || !slices.Contains(kadm.StaticPods, comp) ||
			(dir != kadm.ManifestDir && !kadm.IsBackupDir(dir)) {
			return nil, nil, fmt.Errorf("node %s: static pod manifest %q: not one of kubeadm's", node, p)
		}
		m, err := kadm.ParseManifest(p, data)
		if err != nil {
			return nil, nil, fmt.Errorf("node %s: %w", node, err)
		}
		if dir == kadm.ManifestDir {
			current[m.Component] = m
			continue
		}
		if dir != lastDir { // the script prints each backup's files together
			backups, lastDir = append(backups, map[string]kadm.Manifest{}), dir
		}
		backups[len(backups)-1][m.Component] = m
	}
	return current, backups, nil
}

// manifestRestores says which manifests put node's control plane back at
// from: for each of kube-scheduler, kube-controller-manager and
// kube-apiserver whose manifest runs to, the newest backup of it at from;
// then etcd's manifest from the backup that holds the API server's, when
// its image differs from the running one within the same etcd minor.
// Nothing when no part runs to. A part at to with no backup at from, or
// an etcd of another minor, is refused with what to do.
func manifestRestores(node, from, to string, current map[string]kadm.Manifest, backups []map[string]kadm.Manifest) ([]manifestRestore, error) {
	var out []manifestRestore
	apiserverDir := ""
	for _, comp := range []string{"kube-scheduler", "kube-controller-manager", "kube-apiserver"} {
		cur, ok := current[comp]
		if !ok {
			continue
		}
		v, err := cur.Version()
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", node, err)
		}
		if v.String() != to {
			continue
		}
		found := false
		for _, set := range backups {
			b, ok := set[comp]
			if !ok {
				continue
			}
			if bv, err := b.Version(); err != nil || bv.String() != from {
				continue
			}
			out = append(out, manifestRestore{Component: comp, Backup: b.Path, Current: cur.Path})
			if comp == "kube-apiserver" {
				apiserverDir = path.Dir(b.Path)
			}
			found = true
			break
		}
		if !found {
			return nil, fmt.Errorf("node %s: %s runs %s and no manifest kubeadm kept in %s/%s*/ runs %s: put the one it ran before back into %s by hand", node, comp, to, kadm.TmpDir, kadm.BackupManifestsPrefix, from, kadm.ManifestDir)
		}
	}
	if len(out) == 0 || apiserverDir == "" {
		return out, nil
	}
	cur, ok := current["etcd"]
	if !ok {
		return out, nil
	}
	for _, set := range backups {
		b, ok := set["etcd"]
		if !ok || path.Dir(b.Path) != apiserverDir || b.Image == cur.Image {
			continue
		}
		was, err := kadm.EtcdMinor(b.Tag())
		if err != nil {
			return nil, fmt.Errorf("node %s: %s: %w", node, b.Path, err)
		}
		now, err := kadm.EtcdMinor(cur.Tag())
		if err != nil {
			return nil, fmt.Errorf("node %s: %s: %w", node, cur.Path, err)
		}
		if was != now {
			return nil, fmt.Errorf("node %s: kubeadm moved etcd from %s to %s, another minor of etcd, whose data cannot go back by a manifest: restore etcd from the run's snapshot by hand (etcd's documentation), or go forward", node, b.Image, cur.Image)
		}
		out = append(out, manifestRestore{Component: "etcd", Backup: b.Path, Current: cur.Path})
	}
	return out, nil
}
