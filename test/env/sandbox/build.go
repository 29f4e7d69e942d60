package sandbox

// What a sandbox runs, built from the Go module proxy (or found cached):
// Build, and the Binaries it returns.

import (
	"context"
	"fmt"
	"regexp"

	"github.com/kubelift/kubelift/internal/catalog"

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
	// CNI holds the CNI plugins a node's bridge network runs (and the
	// project's LICENSE and README.md), built at the version the
	// catalog pairs with New: the stand-in internet serves them as New's
	// cni-plugins archive, which a bundle with the node stack installs.
	CNI string `json:"cni,omitempty"`
	// Etcd holds etcd, etcdctl and etcdutl at Config.Etcd, what every
	// control plane's member runs; EtcdTo the same at Config.EtcdTo, what
	// the stand-in internet serves as etcd's release archive.
	Etcd   string `json:"etcd,omitempty"`
	EtcdTo string `json:"etcdTo,omitempty"`
}

// Build builds (or finds cached) every binary a sandbox of cfg runs: what
// it boots on (buildBoot), the release it is upgraded to (buildTarget),
// and the add-ons (buildAddons: a kubeadm sandbox's etcd and CoreDNS, a
// binary sandbox's chosen etcd and CoreDNS), in that order:
// `kubelift-sandbox build` does only this, so that make test builds the
// stories' releases while other tests run, and its patch stories' binary
// cluster needs no add-on (with them before the target, FC25's applyha
// waited five minutes longer for v1.31.14). Up builds the add-ons before
// it boots, and boots the nodes while the target builds.
func Build(ctx context.Context, cfg Config) (Binaries, error) {
	cfg.Defaults()
	if err := checkEtcd(cfg); err != nil {
		return Binaries{}, err
	}
	b, err := buildBoot(ctx, cfg)
	if err != nil {
		return b, err
	}
	if b.New, b.Hops, err = buildTarget(ctx, cfg); err != nil {
		return b, err
	}
	return b, buildAddons(ctx, cfg, &b)
}

// buildBoot builds (or finds cached) the container runtime of a sandbox
// of cfg (and the one its node stack moves it to) and the old release
// (with kubeadm for a kubeadm sandbox). It first refuses a kubeadm
// sandbox whose target is more than a minor ahead, before anything is
// built or booted.
func buildBoot(ctx context.Context, cfg Config) (Binaries, error) {
	var b Binaries
	if err := checkHops(cfg); err != nil {
		return b, err
	}
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
	if cfg.Runtime == RuntimeContainerd {
		v, err := cniVersion(cfg.NewVersion)
		if err != nil {
			return b, err
		}
		cfg.Log("building (or finding cached) the CNI plugins %s (%s's)", v, cfg.NewVersion)
		if b.CNI, err = kube.Addon(ctx, "cni", v); err != nil {
			return b, err
		}
	}
	cfg.Log("building (or finding cached) Kubernetes %s", cfg.OldVersion)
	old := oldComponents
	if cfg.Kubeadm {
		old = append(old, "kubeadm")
	}
	var err error
	b.Old, err = buildKubernetes(ctx, cfg.OldVersion, old...)
	return b, err
}

// cniVersion is the version of the CNI plugins the catalog pairs with
// Kubernetes version: the one its cni-plugins file's URL names.
func cniVersion(version string) (string, error) {
	rel, err := catalogRelease(version)
	if err != nil {
		return "", err
	}
	for _, f := range rel.Files {
		if f.Name != "cni-plugins" {
			continue
		}
		if m := releaseTag.FindStringSubmatch(f.URL); m != nil {
			return m[1], nil
		}
		return "", fmt.Errorf("catalog: %s's cni-plugins URL %q names no release (/download/vX.Y.Z/)", version, f.URL)
	}
	return "", fmt.Errorf("catalog: %s has no cni-plugins file", version)
}

// catalogRelease is the embedded catalog's entry for version.
func catalogRelease(version string) (*catalog.Release, error) {
	cat, err := catalog.Default()
	if err != nil {
		return nil, err
	}
	return cat.Lookup(version)
}

// releaseTag is the release a GitHub release download URL names.
var releaseTag = regexp.MustCompile(`/releases/download/(v[0-9]+\.[0-9]+\.[0-9]+)/`)

// buildAddons builds (or finds cached) a kubeadm sandbox's etcd and
// CoreDNS, which its control plane runs from images; for a binary
// sandbox, the CoreDNS it runs (Config.CoreDNS) and the one the stand-in
// internet serves for the target (coreDNSTag), and the etcd it runs
// (Config.Etcd, into b.Etcd) and the one the stand-in internet serves
// (Config.EtcdTo, into b.EtcdTo). The served ones are built here too,
// before the nodes boot, as CoreDNS's tag is: cached, they cost nothing,
// and a failed build stops Up before anything is made.
func buildAddons(ctx context.Context, cfg Config, b *Binaries) error {
	for _, e := range []struct {
		version string
		dir     *string
	}{{cfg.Etcd, &b.Etcd}, {cfg.EtcdTo, &b.EtcdTo}} {
		if e.version == "" {
			continue
		}
		cfg.Log("building (or finding cached) etcd %s (etcd, etcdctl, etcdutl)", e.version)
		dir, err := kube.Addon(ctx, "etcd", e.version)
		if err != nil {
			return err
		}
		*e.dir = dir
	}
	if cfg.CoreDNS != "" {
		tag, err := coreDNSTag(cfg.NewVersion)
		if err != nil {
			return err
		}
		cfg.Log("building (or finding cached) CoreDNS %s and %s", cfg.CoreDNS, tag)
		for _, v := range []string{cfg.CoreDNS, tag} {
			if _, err := kube.Addon(ctx, "coredns", v); err != nil {
				return err
			}
		}
	}
	if !cfg.Kubeadm {
		return nil
	}
	cfg.Log("building (or finding cached) etcd %s and CoreDNS %s", EtcdVersion, CoreDNSVersion)
	if _, err := kube.Addon(ctx, "etcd", EtcdVersion); err != nil {
		return err
	}
	_, err := kube.Addon(ctx, "coredns", CoreDNSVersion)
	return err
}

// checkHops refuses a kubeadm sandbox whose target is more than a minor
// ahead of its old release.
func checkHops(cfg Config) error {
	if !cfg.Kubeadm {
		return nil
	}
	hops, err := hopsBetween(cfg.OldVersion, cfg.NewVersion)
	if err != nil {
		return err
	}
	if len(hops) > 0 {
		return fmt.Errorf("%s to %s passes through %s: kubelift moves a kubeadm control plane one minor per run, so a kubeadm sandbox is built for one minor", cfg.OldVersion, cfg.NewVersion, hops[0].Version)
	}
	return nil
}

// buildTarget builds (or finds cached) the release a sandbox of cfg is
// upgraded to, and the control plane of every hop on the way: the
// directory of each.
func buildTarget(ctx context.Context, cfg Config) (string, map[string]string, error) {
	cfg.Log("building (or finding cached) Kubernetes %s", cfg.NewVersion)
	upgrade := newComponents
	if cfg.Kubeadm {
		upgrade = append(upgrade, "kubeadm")
	}
	dir, err := buildKubernetes(ctx, cfg.NewVersion, upgrade...)
	if err != nil {
		return "", nil, err
	}
	hops, err := hopsBetween(cfg.OldVersion, cfg.NewVersion)
	if err != nil {
		return "", nil, err
	}
	var byVersion map[string]string
	for _, h := range hops {
		cfg.Log("building (or finding cached) the control plane of %s, a hop on the way to %s", h.Version, cfg.NewVersion)
		comps := hopComponents
		if cfg.FullHops {
			comps = newComponents
		}
		hop, err := buildKubernetes(ctx, h.Version, comps...)
		if err != nil {
			return "", nil, err
		}
		if byVersion == nil {
			byVersion = map[string]string{}
		}
		byVersion[h.Version] = hop
	}
	return dir, byVersion, nil
}

// startTarget starts buildTarget and returns what waits for its result
// (called again, it returns the same). Up boots the nodes meanwhile: on
// a cold machine make test's last story (test/stories/multihop) waited
// for v1.32.13's build and only then booted its nodes, at the end of the
// run with the CPU half idle.
func startTarget(ctx context.Context, cfg Config) func() (string, map[string]string, error) {
	var (
		dir  string
		hops map[string]string
		err  error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		dir, hops, err = buildTarget(ctx, cfg)
	}()
	return func() (string, map[string]string, error) {
		<-done
		return dir, hops, err
	}
}
