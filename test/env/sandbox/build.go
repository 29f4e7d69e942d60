package sandbox

// What a sandbox runs, built from the Go module proxy (or found cached):
// Build, and the Binaries it returns.

import (
	"context"
	"fmt"

	"github.com/kubelift/kubelift/test/env/kube"
)

// Binaries are the directories of the built Kubernetes components.
type Binaries struct {
	Old string `json:"old"`
	New string `json:"new"`
	// Hops holds, by version, the control-plane programs of every release
	// a control plane passes through from Old's minor to New's (none for
	// one minor): what `bundle create --from` carries for each hop.
	Hops map[string]string `json:"hops,omitempty"`
	// Runtime holds containerd, its shim, ctr, runc and crictl.
	Runtime string `json:"runtime,omitempty"`
	// Stack holds the runtime the catalog pairs with New (containerd
	// kube.ContainerdVersion and its runc): the stand-in internet serves
	// it as the node stack's containerd and runc (bundle create
	// --node-stack). The same as Runtime unless the nodes run another.
	Stack string `json:"stack,omitempty"`
}

// Build builds (or finds cached) every binary a sandbox of cfg runs: the
// container runtime, the old and new releases (with kubeadm for a kubeadm sandbox), the control
// plane of every hop between them, and a kubeadm sandbox's etcd and
// CoreDNS. Up does it first; `kubelift-sandbox build`
// does only this, so that make test builds the stories' releases while
// other tests run.
func Build(ctx context.Context, cfg Config) (Binaries, error) {
	cfg.Defaults()
	var b Binaries
	// The runtime first: every sandbox runs it, and it builds in a
	// fraction of a release's time.
	if cfg.Runtime == RuntimeContainerd {
		rv, err := kube.RuntimeFor(cfg.RuntimeVersion)
		if err != nil {
			return b, err
		}
		cfg.Log("building (or finding cached) containerd %s, runc %s and crictl %s", rv.Containerd, rv.Runc, rv.Crictl)
		if b.Runtime, err = kube.RuntimeBinaries(ctx, rv); err != nil {
			return b, err
		}
		b.Stack = b.Runtime
		if rv.Containerd != kube.ContainerdVersion {
			stack, err := kube.RuntimeFor("")
			if err != nil {
				return b, err
			}
			cfg.Log("building (or finding cached) containerd %s and runc %s, the node stack that moves the nodes off %s", stack.Containerd, stack.Runc, rv.Containerd)
			if b.Stack, err = kube.RuntimeBinaries(ctx, stack); err != nil {
				return b, err
			}
		}
	}
	cfg.Log("building (or finding cached) Kubernetes %s and %s", cfg.OldVersion, cfg.NewVersion)
	var err error
	old, upgrade := oldComponents, newComponents
	if cfg.Kubeadm {
		old, upgrade = append(old, "kubeadm"), append(upgrade, "kubeadm")
	}
	if b.Old, err = buildKubernetes(ctx, cfg.OldVersion, old...); err != nil {
		return b, err
	}
	if b.New, err = buildKubernetes(ctx, cfg.NewVersion, upgrade...); err != nil {
		return b, err
	}
	hops, err := hopsBetween(cfg.OldVersion, cfg.NewVersion)
	if err != nil {
		return b, err
	}
	for _, h := range hops {
		if cfg.Kubeadm {
			return b, fmt.Errorf("%s to %s passes through %s: kubelift moves a kubeadm control plane one minor per run, so a kubeadm sandbox is built for one minor", cfg.OldVersion, cfg.NewVersion, h.Version)
		}
		cfg.Log("building (or finding cached) the control plane of %s, a hop on the way to %s", h.Version, cfg.NewVersion)
		comps := hopComponents
		if cfg.FullHops {
			comps = newComponents
		}
		dir, err := buildKubernetes(ctx, h.Version, comps...)
		if err != nil {
			return b, err
		}
		if b.Hops == nil {
			b.Hops = map[string]string{}
		}
		b.Hops[h.Version] = dir
	}
	if cfg.Kubeadm {
		cfg.Log("building (or finding cached) etcd %s and CoreDNS %s", EtcdVersion, CoreDNSVersion)
		if _, err := kube.Addon(ctx, "etcd", EtcdVersion); err != nil {
			return b, err
		}
		if _, err := kube.Addon(ctx, "coredns", CoreDNSVersion); err != nil {
			return b, err
		}
	}
	return b, nil
}
