package kubeadm

import (
	"context"
	"fmt"
	"path"

	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/record"
	kadm "github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/nodescript"
)

// Undo puts node's control plane back at the version the run started
// from with the manifests kubeadm kept (manifests.go), and waits
// for it there; a control plane that never moved (kubeadm put it back, or
// was never run) is left as it is. After the first control-plane node,
// what `kubeadm upgrade apply` changed in the cluster goes back too.
func (d Driver) Undo(ctx context.Context, r *driver.Run, node string) error {
	from, to := r.From(), r.Target.Version.String()
	keep := path.Join(kadm.TmpDir, fmt.Sprintf("kubelift-rollback-manifests-%d", r.Started))
	err := r.Fx.OnNode(ctx, node, from, r.Target.Version.String(), func(ctx context.Context, o *nodeops.Ops) error {
		current, backups, err := readManifests(ctx, o)
		if err != nil {
			return err
		}
		restores, err := manifestRestores(node, from, to, current, backups)
		if err != nil || len(restores) == 0 {
			return err
		}
		r.Fx.SetNode(ctx, node, record.NodeUpgrading, "kubeadm", nil)
		r.Fx.MarkMoved(node, "")
		for _, m := range restores {
			r.Log.Info("rolling back", "node", node, "component", m.Component, "to", from, "manifest", m.Backup)
			if _, err := o.Run(ctx, "restore "+m.Component+"'s manifest", nodescript.KubeadmRestoreManifest, m.Backup, m.Current, keep); err != nil {
				return err
			}
		}
		if r.Dry {
			r.Fx.Would(node, "wait for the control plane's static pods to run "+from+" and be Ready", "")
			return nil
		}
		if err := d.waitStaticAt(ctx, r, o, from); err != nil {
			return err
		}
		r.Fx.SetNode(ctx, node, record.NodeRolledBack, "kubeadm", nil)
		return nil
	})
	if err != nil {
		r.Fx.SetNode(ctx, node, record.NodeFailed, "kubeadm", err)
		return err
	}
	if node != r.Plan.FirstControlPlane() {
		return nil
	}
	return d.undoCluster(ctx, r, from, to)
}

// undoCluster puts back what `kubeadm upgrade apply` changed beyond the
// node: kubeadm-config's kubernetesVersion and the kube-proxy DaemonSet's
// image (then waits for its rollout). CoreDNS is left: kubeadm names one
// CoreDNS per minor, and only patch downgrades are rolled back.
func (Driver) undoCluster(ctx context.Context, r *driver.Run, from, to string) error {
	if r.Dry {
		r.Fx.Would("", "set kubeadm-config's kubernetesVersion and the kube-proxy DaemonSet's image back to "+from+" (where they say "+to+")", "")
		return waitAddons(ctx, r)
	}
	changed, err := kadm.SetVersion(ctx, r.Client, to, from)
	if err != nil {
		return err
	}
	if changed {
		r.Log.Info("rolled back", "configmap", kadm.ConfigNamespace+"/"+kadm.ConfigMapName, "kubernetesVersion", from)
	}
	if changed, err = kadm.SetProxyTag(ctx, r.Client, to, from); err != nil {
		return err
	}
	if changed {
		r.Log.Info("rolled back", "daemonset", "kube-system/kube-proxy", "tag", from)
	}
	return waitAddons(ctx, r)
}
