package coredns

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/kubelift/kubelift/internal/waiter"
)

// Roller moves, and puts back, a cluster's CoreDNS.
type Roller struct {
	Client kubernetes.Interface
	// Upgrade names the upgrade whose move this is ("v1.30.14 to
	// v1.31.4"): Undo puts back only that upgrade's.
	Upgrade string
	// Wait and Timeout bound each wait for a rollout to finish.
	Wait    waiter.Waiter
	Timeout time.Duration
	// Drain is how long old pods answer after they left their Services
	// (0: DrainTime).
	Drain time.Duration
	// Count reads an old pod's count of queries (nil: through the API
	// server's pod proxy; quiet.go).
	Count QueryCounter
	Log   *slog.Logger
	// Dry: Move and PutBack tell Would what they would do (node "",
	// command "") instead of doing it.
	Dry   bool
	Would func(node, what, command string)
}

// Backup is what a move replaced, kept in the ConfigMap BackupName.
type Backup struct {
	// Upgrade is the Roller's that made it.
	Upgrade string
	// Image is the image the Deployment ran, To the one the move gave it.
	Image, To string
	// ConfigMap and Key hold the Corefile; Corefile is what they held.
	ConfigMap, Key, Corefile string
	// Template is the Deployment's pod template before the move.
	Template corev1.PodTemplateSpec
	// Knobs are its strategy, minReadySeconds and the selectors of the
	// Services in front of its pods, which each roll puts back; Draining
	// says a roll changed them and has not put them back yet.
	Knobs    knobs
	Draining bool
}

// Apply moves f to m, in the order that keeps DNS answering: each roll
// starts every new replica before any old one stops, and takes the old
// ones out of their Services DrainTime before they stop (drainRoll);
// where the Corefile changes, the old pods are first moved onto a copy
// of the old one under Corefile-backup, so that no running CoreDNS ever
// reads a Corefile written for another version (kubeadm's order). What
// it replaces is kept first (Backup); a run stopped half-way finds it and
// goes on. On a failed rollout the caller puts it back (Undo).
func (r Roller) Apply(ctx context.Context, f *Found, m *Move) error {
	b, err := r.backup(ctx, f, m)
	if err != nil {
		return err
	}
	d := f.Deployment.DeepCopy()
	if m.CorefileChanges(f) {
		if err := r.setCorefile(ctx, f.ConfigMap, map[string]string{backupKey: b.Corefile}); err != nil {
			return err
		}
		if d, err = r.roll(ctx, d, b, func(t *corev1.PodTemplateSpec) { mountKey(&t.Spec, f.Volume, f.File, backupKey, f.Keys) }); err != nil {
			return err
		}
		if err := r.setCorefile(ctx, f.ConfigMap, map[string]string{b.Key: m.Corefile}); err != nil {
			return err
		}
	}
	_, err = r.roll(ctx, d, b, func(t *corev1.PodTemplateSpec) {
		t.Spec.Containers[f.Container].Image = m.Image
		originalVolume(&t.Spec, f.Volume, b)
	})
	return err
}

// Rolled is the rollout a move left running (a run stopped while it
// rolled) waited for, and the knobs it changed put back: true when f
// runs what this upgrade's Backup says its move gave it.
func (r Roller) Rolled(ctx context.Context, f *Found) (bool, error) {
	b, err := r.Backup(ctx)
	if err == nil {
		err = r.settle(ctx, b) // a roll killed half-way, whichever upgrade's
	}
	if err != nil || b == nil || b.To != f.Image || b.Upgrade != r.Upgrade {
		return false, err
	}
	return true, r.waitRolled(ctx, f.Deployment.Name)
}

// Undo puts back what this upgrade's move replaced (an earlier
// upgrade's is left alone), where the Deployment does not run it
// already, in the mirror of Apply's order: where the Corefile changed,
// the pods first onto a copy of the old one (Corefile-backup), then the
// old one written back; then the old pod template, each roll drained and
// waited for; the copy removed last. It says whether anything was put
// back.
func (r Roller) Undo(ctx context.Context) (bool, error) {
	b, err := r.Backup(ctx)
	if err == nil {
		err = r.settle(ctx, b)
	}
	if err != nil || b == nil || b.Upgrade != r.Upgrade {
		return false, err
	}
	d, err := r.Client.AppsV1().Deployments(Namespace).Get(ctx, Name, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("deployment %s/%s: %w", Namespace, Name, err)
	}
	cm, err := r.Client.CoreV1().ConfigMaps(Namespace).Get(ctx, b.ConfigMap, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("configmap %s/%s: %w", Namespace, b.ConfigMap, err)
	}
	_, extra := cm.Data[backupKey]
	if apiequality.Semantic.DeepEqual(d.Spec.Template, b.Template) && cm.Data[b.Key] == b.Corefile && !extra {
		return false, r.waitRolled(ctx, d.Name) // put back already (by a run that stopped in its roll)
	}
	if cm.Data[b.Key] != b.Corefile {
		f, err := parse(d)
		if err != nil {
			return false, fmt.Errorf("deployment %s/%s: %w", Namespace, Name, err)
		}
		if err := r.setCorefile(ctx, b.ConfigMap, map[string]string{backupKey: b.Corefile}); err != nil {
			return false, err
		}
		keys := slices.Sorted(maps.Keys(cm.Data))
		if d, err = r.roll(ctx, d, b, func(t *corev1.PodTemplateSpec) {
			b.Template.DeepCopyInto(t)
			mountKey(&t.Spec, f.Volume, f.File, backupKey, keys)
		}); err != nil {
			return true, err
		}
		if err := r.setCorefile(ctx, b.ConfigMap, map[string]string{b.Key: b.Corefile}); err != nil {
			return true, err
		}
	}
	if _, err = r.roll(ctx, d, b, func(t *corev1.PodTemplateSpec) { b.Template.DeepCopyInto(t) }); err != nil {
		return true, err
	}
	return true, r.setCorefile(ctx, b.ConfigMap, map[string]string{backupKey: ""})
}

// Backup reads what the last move replaced (nil: no move kept any).
func (r Roller) Backup(ctx context.Context) (*Backup, error) {
	cm, err := r.Client.CoreV1().ConfigMaps(Namespace).Get(ctx, BackupName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("configmap %s/%s: %w", Namespace, BackupName, err)
	}
	b := &Backup{Upgrade: cm.Data["upgrade"], Draining: cm.Data["draining"] == "true", Image: cm.Data["image"], To: cm.Data["to"], ConfigMap: cm.Data["configMap"], Key: cm.Data["key"], Corefile: cm.Data["Corefile"]}
	if err := json.Unmarshal([]byte(cm.Data["template"]), &b.Template); err != nil {
		return nil, fmt.Errorf("configmap %s/%s key template: %w", Namespace, BackupName, err)
	}
	if err := json.Unmarshal([]byte(cm.Data["knobs"]), &b.Knobs); err != nil {
		return nil, fmt.Errorf("configmap %s/%s key knobs: %w", Namespace, BackupName, err)
	}
	if b.Image == "" || b.To == "" || b.ConfigMap == "" || b.Key == "" {
		return nil, fmt.Errorf("configmap %s/%s: image, to, configMap and key must all be set (written by kubelift; edited since?)", Namespace, BackupName)
	}
	return b, nil
}

// backup keeps what m replaces, unless a move to the same image kept it
// already (a run that stopped half-way: the backup holds what ran before
// it; what runs now may be its half-way state). A roll the old backup's
// run left under way is settled first, so that what is kept is not its
// half-way knobs.
func (r Roller) backup(ctx context.Context, f *Found, m *Move) (*Backup, error) {
	old, err := r.Backup(ctx)
	if err == nil {
		err = r.settle(ctx, old)
	}
	if err != nil {
		return nil, err
	}
	if old != nil && old.To == m.Image && old.Upgrade == r.Upgrade {
		return old, nil
	}
	b := &Backup{Upgrade: r.Upgrade, Image: f.Image, To: m.Image, ConfigMap: f.ConfigMap, Key: f.Key, Corefile: f.Corefile, Template: f.Deployment.Spec.Template}
	now, err := r.Client.AppsV1().Deployments(Namespace).Get(ctx, Name, metav1.GetOptions{}) // settled
	if err != nil {
		return nil, fmt.Errorf("deployment %s/%s: %w", Namespace, Name, err)
	}
	if b.Knobs, err = r.knobsOf(ctx, now); err != nil {
		return nil, err
	}
	tpl, err := json.Marshal(b.Template)
	if err != nil {
		return nil, err
	}
	kn, err := json.Marshal(b.Knobs)
	if err != nil {
		return nil, err
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: BackupName, Namespace: Namespace},
		Data: map[string]string{"upgrade": b.Upgrade, "image": b.Image, "to": b.To, "configMap": b.ConfigMap, "key": b.Key, "Corefile": b.Corefile,
			"template": string(tpl), "knobs": string(kn)}}
	if old == nil {
		_, err = r.Client.CoreV1().ConfigMaps(Namespace).Create(ctx, cm, metav1.CreateOptions{})
	} else {
		_, err = r.Client.CoreV1().ConfigMaps(Namespace).Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("configmap %s/%s: %w", Namespace, BackupName, err)
	}
	return b, nil
}

// setCorefile sets keys of the Corefile's ConfigMap ("" deletes one).
func (r Roller) setCorefile(ctx context.Context, name string, set map[string]string) error {
	cms := r.Client.CoreV1().ConfigMaps(Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		for k, v := range set {
			if v == "" {
				delete(cm.Data, k)
			} else {
				cm.Data[k] = v
			}
		}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("configmap %s/%s: %w", Namespace, name, err)
	}
	return nil
}

// mountKey makes the Corefile volume give key as file, every other item
// as it was; a volume that gave every key of the ConfigMap (keys) as its
// own file gives them still, but for the Corefile's copy.
func mountKey(s *corev1.PodSpec, volume int, file, key string, keys []string) {
	src := s.Volumes[volume].ConfigMap
	if len(src.Items) == 0 {
		for _, k := range keys {
			if k != file && k != backupKey {
				src.Items = append(src.Items, corev1.KeyToPath{Key: k, Path: k})
			}
		}
		src.Items = append(src.Items, corev1.KeyToPath{Key: key, Path: file})
		return
	}
	for i := range src.Items {
		if src.Items[i].Path == file {
			src.Items[i].Key = key
		}
	}
}

// originalVolume gives the Corefile volume (at index volume of s) back as
// the template b kept had it.
func originalVolume(s *corev1.PodSpec, volume int, b *Backup) {
	name := s.Volumes[volume].Name
	for _, v := range b.Template.Spec.Volumes {
		if v.Name == name {
			s.Volumes[volume] = *v.DeepCopy()
		}
	}
}

// roll changes d's pod template and, when that changed something, rolls
// it out draining the old pods (drainRoll); either way it waits until
// every pod runs it.
func (r Roller) roll(ctx context.Context, d *appsv1.Deployment, b *Backup, change func(*corev1.PodTemplateSpec)) (*appsv1.Deployment, error) {
	next := d.DeepCopy()
	change(&next.Spec.Template)
	if apiequality.Semantic.DeepEqual(next.Spec.Template, d.Spec.Template) {
		return next, r.waitRolled(ctx, d.Name)
	}
	if err := r.drainRoll(ctx, next, b); err != nil {
		return nil, err
	}
	// The next roll starts from what the API holds now.
	now, err := r.Client.AppsV1().Deployments(Namespace).Get(ctx, d.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("deployment %s/%s: %w", Namespace, d.Name, err)
	}
	return now, nil
}

// waitRolled is waitRolledWithin the Roller's Timeout.
func (r Roller) waitRolled(ctx context.Context, name string) error {
	return r.waitRolledWithin(ctx, name, r.Timeout)
}

// waitRolledWithin waits until the Deployment's controller has seen its spec
// and every replica runs it and is available, and no old pod is still
// terminating: the Deployment's status no longer counts one that is, but
// its containers run on (CoreDNS's lameduck) until its kubelet has
// stopped them, and a node step that recorded them as running would
// then find them gone.
func (r Roller) waitRolledWithin(ctx context.Context, name string, timeout time.Duration) error {
	err := r.Wait.Poll(ctx, time.Second, timeout, func(ctx context.Context) error {
		d, err := r.Client.AppsV1().Deployments(Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		want := replicas(d)
		st := d.Status
		if st.ObservedGeneration < d.Generation || st.UpdatedReplicas != want || st.Replicas != want || st.AvailableReplicas != want {
			return fmt.Errorf("%d of %d replicas updated, %d available, %d in all", st.UpdatedReplicas, want, st.AvailableReplicas, st.Replicas)
		}
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil {
			return waiter.Stop(fmt.Errorf("spec.selector: %w", err))
		}
		pods, err := r.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				return fmt.Errorf("every replica updated and available, but pod %s still terminating", p.Name)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("deployment %s/%s rollout: %w", Namespace, name, err)
	}
	return nil
}
