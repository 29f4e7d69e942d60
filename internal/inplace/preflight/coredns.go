package preflight

import (
	"context"
	"strings"

	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/coredns"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/kubeadm"
)

// CoreDNSMove is the move of a binary cluster's CoreDNS the plan makes.
type CoreDNSMove struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Image string `json:"image"`
	// MigratesCorefile says the Corefile is rewritten for To (Notices say
	// what changes).
	MigratesCorefile bool     `json:"migratesCorefile"`
	Notices          []string `json:"notices,omitempty"`
}

// CoreDNSImage is where import pushed the release's CoreDNS image
// (TARGET@DIGEST), "" when the release carries none.
func CoreDNSImage(rec *cluster.Available) string {
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

// coreDNS plans a binary cluster's CoreDNS move to the release's
// (coredns.Plan), kubeadm's being kubeadm's: blocking where it cannot be
// moved (the fix: move it by hand, or ignore the check to leave it).
// Its Deployment's own strategy does not matter: apply rolls it with
// every new replica up before an old one stops (coredns.DrainTime).
func (pc *planCheck) coreDNS(ctx context.Context) {
	image := CoreDNSImage(pc.target.Record)
	if pc.kind != release.KindBinary || image == "" {
		return
	}
	f, err := coredns.Find(ctx, pc.opts.Client)
	var m *coredns.Move
	if err == nil && f != nil {
		m, err = coredns.Plan(f, image)
	}
	obj := "deployment/" + coredns.Namespace + "/" + coredns.Name
	if err != nil {
		pc.add(Blocking, CheckCoreDNS, obj, err.Error(),
			"move CoreDNS to the release's by hand (its Corefile too), or pass --ignore-preflight "+string(CheckCoreDNS)+" to leave it as it is")
		return
	}
	if m == nil {
		return
	}
	pc.plan.CoreDNS = &CoreDNSMove{From: m.From, To: m.To, Image: m.Image, MigratesCorefile: m.CorefileChanges(f), Notices: m.Notices}
	if a := f.Deployment.Spec.Template.Spec.Affinity; a != nil && a.PodAntiAffinity != nil && len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
		pc.add(Warning, CheckCoreDNS, obj,
			"its pods require anti-affinity: apply starts every new replica beside the old ones before any old one stops, and the new ones fit only where nodes can take them then",
			"make the anti-affinity preferred, or have a node free for each replica; else the roll does not finish within --ready-timeout and CoreDNS is put back")
	}
}
