package coredns

import (
	"context"
	"strings"

	"k8s.io/client-go/kubernetes"

	clusterrec "github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/kubeadm"
)

// Planned is the move of a binary cluster's CoreDNS as a plan shows it
// (upgrade plan -o json: coreDNS).
type Planned struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Image string `json:"image"`
	// MigratesCorefile says the Corefile is rewritten for To (Notices say
	// what changes).
	MigratesCorefile bool     `json:"migratesCorefile"`
	Notices          []string `json:"notices,omitempty"`
}

// ImageIn is where import pushed the release's CoreDNS image
// (TARGET@DIGEST), "" when the release carries none.
func ImageIn(rec *clusterrec.Available) string {
	if rec == nil {
		return ""
	}
	for _, im := range rec.Images {
		repo := im.Ref
		if t := kubeadm.ImageTag(repo); t != "" {
			repo = strings.TrimSuffix(repo, ":"+t) // the tag; a registry's port stays
		}
		if strings.HasSuffix(repo, "/coredns") && im.Target != "" {
			if im.Digest != "" {
				return im.Target + "@" + im.Digest
			}
			return im.Target
		}
	}
	return ""
}

// PlanFor plans the move of the cluster's CoreDNS to image (Find, Plan):
// nil where there is none to move; warn says what may keep the roll
// from finishing (pods that require anti-affinity: the new ones start
// beside the old). Its Deployment's own strategy does not matter: apply
// rolls it with every new replica up before an old one stops (DrainTime).
func PlanFor(ctx context.Context, c kubernetes.Interface, image string) (p *Planned, warn string, err error) {
	f, err := Find(ctx, c)
	if err != nil || f == nil {
		return nil, "", err
	}
	m, err := Plan(f, image)
	if err != nil || m == nil {
		return nil, "", err
	}
	if a := f.Deployment.Spec.Template.Spec.Affinity; a != nil && a.PodAntiAffinity != nil && len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
		warn = "its pods require anti-affinity: apply starts every new replica beside the old ones before any old one stops, and the new ones fit only where nodes can take them then"
	}
	return &Planned{From: m.From, To: m.To, Image: m.Image, MigratesCorefile: m.CorefileChanges(f), Notices: m.Notices}, warn, nil
}
