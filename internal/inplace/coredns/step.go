package coredns

import (
	"context"
	"fmt"
)

// Move is the runbook's "coredns" step: the cluster's CoreDNS moved to
// image where it runs an older version (Plan, then Apply once fence says
// the run still holds its lock). A failed move is put back (Undo) and
// returned; one stopped by the run's end (an interrupt, a lost lock) is
// left for the next run, which goes on from the backup, and waits for a
// rollout a stopped run left going. Nothing when image is "" (the release
// carries no CoreDNS) or the cluster runs no CoreDNS Deployment.
func (r Roller) Move(ctx context.Context, image string, fence func(context.Context) error) error {
	if image == "" {
		return nil
	}
	f, err := Find(ctx, r.Client)
	if err != nil || f == nil {
		return err
	}
	m, err := Plan(f, image)
	if err != nil {
		return err
	}
	if m == nil {
		_, err := r.Rolled(ctx, f)
		return err
	}
	migrates := ""
	if m.CorefileChanges(f) {
		migrates = ", its Corefile migrated (the old pods first moved onto a copy of the old one, " + backupKey + ")"
	}
	if r.Dry {
		r.Would("", fmt.Sprintf("roll CoreDNS from %s to %s (%s)%s, keeping what it replaces in configmap %s/%s", m.From, m.To, m.Image, migrates, Namespace, BackupName), "")
		return nil
	}
	if err := fence(ctx); err != nil {
		return fmt.Errorf("CoreDNS not moved: %w", err)
	}
	r.Log.Info("CoreDNS", "from", m.From, "to", m.To, "image", m.Image, "migratesCorefile", migrates != "")
	if err := r.Apply(ctx, f, m); err != nil {
		if ctx.Err() != nil {
			return err
		}
		if _, uerr := r.Undo(context.WithoutCancel(ctx)); uerr != nil {
			return fmt.Errorf("%w; putting CoreDNS back: %w", err, uerr)
		}
		return fmt.Errorf("%w (CoreDNS put back at %s)", err, m.From)
	}
	r.Log.Info("CoreDNS upgraded", "from", m.From, "to", m.To)
	return nil
}

// PutBack is the "coredns" step's undo: what this upgrade's move
// replaced put back (Undo), or, for a dry run, said.
func (r Roller) PutBack(ctx context.Context) error {
	if r.Dry {
		b, err := r.Backup(ctx)
		if err == nil && b != nil && b.Upgrade == r.Upgrade {
			r.Would("", fmt.Sprintf("put CoreDNS back: its Corefile and pod template (%s) from configmap %s/%s", b.Image, Namespace, BackupName), "")
		}
		return err
	}
	undone, err := r.Undo(ctx)
	if undone {
		r.Log.Info("CoreDNS put back", "from", Namespace+"/"+BackupName)
	}
	return err
}
