package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/registry"
)

type createOptions struct {
	IO                *cli.IO
	KubernetesVersion string
	From              string
	Arches            []string
	SignKey           string
	Unsigned          bool
	Output            string
	Format            string
	CatalogFile       string
	RegistryMirrors   []string
	URLMirrors        []string
	Images            []string
	Files             []string
	InsecureRegistry  []string
	Jobs              int
	CacheDir          string
	DryRun            bool
	Quiet             bool
	Installer         string
	AgentProgram      string
	AllPlatforms      bool
	KubeletBinary     string
	NodeStack         bool
	Etcd              string
}

func newCmdCreate(s *cli.IO, runF func(context.Context, *createOptions) error) *cobra.Command {
	opts := &createOptions{IO: s}
	cmd := &cobra.Command{
		Use:   "create --kubernetes-version V --sign-key KEY [-o FILE] [flags]",
		Short: "Fetch a Kubernetes version's images and binaries into one signed bundle",
		Long: `Create looks the version up in the catalog, pulls its images (and any --image)
into an OCI layout keeping upstream digests and multi-arch indexes, downloads
its binaries (and any --file) checking each against a pinned sha256 or the
.sha256 file published beside it, and writes one signed bundle.

Downloads go through a content-addressed cache (--cache-dir), so a re-run
after a dropped connection fetches only what is missing. The bundle is
written to a temporary file and renamed into place when complete.

--from MINOR (or VERSION) also bundles, for every minor between it and the
target, the control-plane binaries, kubeadm and all the images of that
minor's newest catalog release: the control plane passes through each minor,
while kubelets and kube-proxy go straight to the target (at most 3 minors
on, the kubelet skew the API server allows). 'bundle inspect' lists the hops.

--format run makes a self-extracting installer: './FILE.run --help'. It
embeds the 'upgrade' program (by default the one next to this program).

--dry-run contacts nothing and prints what would be fetched, after mirror
rewriting; with '-o json' as JSON, for your proxy's allow-list:
  {"images":[{"ref":..., "pullFrom":...}], "files":[{"name":..., "url":..., "sha256":...}]}`,
		Example: `  bundle create --kubernetes-version v1.31.4 --sign-key team.key -o k8s-v1.31.4.tar
  bundle create --kubernetes-version v1.31.4 --sign-key team.key --format run \
      --registry-mirror registry.k8s.io=mirror.corp:5000/k8s --image nginx:1.27
  bundle create --kubernetes-version v1.33.13 --from v1.30 --sign-key team.key
  bundle create --kubernetes-version v1.31.4 --dry-run -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.KubernetesVersion == "" {
				return cli.Usagef("--kubernetes-version is required (see 'bundle catalog' for the versions)")
			}
			if !opts.DryRun && opts.SignKey == "" && !opts.Unsigned {
				return cli.Usagef("--sign-key KEY is required (or --unsigned, which operators must then accept explicitly)")
			}
			if opts.SignKey != "" && opts.Unsigned {
				return cli.Usagef("--sign-key and --unsigned exclude each other")
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return createRun(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.KubernetesVersion, "kubernetes-version", "", "Kubernetes version to bundle, e.g. v1.31.4")
	f.StringVar(&opts.From, "from", "", "also bundle the control plane of every minor between this one (v1.30) and the target")
	f.StringSliceVar(&opts.Arches, "arch", []string{"amd64"}, "architectures: amd64, arm64 (comma-separated)")
	f.StringVar(&opts.SignKey, "sign-key", "", "private key (PEM) to sign the bundle with (bundle keygen)")
	f.BoolVar(&opts.Unsigned, "unsigned", false, "make an unsigned bundle (operators must pass --allow-unsigned)")
	f.StringVarP(&opts.Output, "output", "o", "", "bundle file to write (default k8s-VERSION-linux-ARCH.tar|.run); with --dry-run: json or text")
	f.StringVar(&opts.Format, "format", "tar", "tar, or run for a self-extracting installer")
	f.StringVar(&opts.CatalogFile, "catalog", "", "version catalog file (default: built in)")
	f.StringArrayVar(&opts.RegistryMirrors, "registry-mirror", nil, "pull images of registry FROM from TO instead (FROM=TO, repeatable)")
	f.StringArrayVar(&opts.URLMirrors, "url-mirror", nil, "download URLs starting with FROM from TO instead (FROM=TO, repeatable)")
	f.StringArrayVar(&opts.Images, "image", nil, "also bundle this image (repeatable)")
	f.StringArrayVar(&opts.Files, "file", nil, "also bundle this file: NAME=URL[#sha256:HEX] (repeatable)")
	f.StringArrayVar(&opts.InsecureRegistry, "insecure-registry", nil, "reach this registry host over plain HTTP or unverified TLS (repeatable)")
	f.IntVar(&opts.Jobs, "jobs", 4, "parallel downloads")
	f.StringVar(&opts.CacheDir, "cache-dir", cli.DefaultCacheDir(), "download cache")
	f.BoolVar(&opts.DryRun, "dry-run", false, "print what would be fetched and fetch nothing")
	f.BoolVarP(&opts.Quiet, "quiet", "q", false, "no progress or status on stderr")
	f.StringVar(&opts.KubeletBinary, "kubelet-binary", "", "bundle this kubelet instead of upstream's (the hash-skip kubelet from 'make kubelet'; one --arch)")
	f.BoolVar(&opts.NodeStack, "node-stack", false, "also bundle the runtime the catalog pairs with the version (containerd and runc: bundle catalog lists them), for upgrade to install where a node runs an older one")
	f.StringVar(&opts.Etcd, "etcd", "", "also bundle etcd for a binary cluster's members, for upgrade to move them one at a time: 'paired' (the version the catalog pairs with the release) or a version such as v3.6.16, optionally pinned VERSION#sha256:HEX")
	f.BoolVar(&opts.AllPlatforms, "all-platforms", false, "bundle every platform of multi-arch images, so import keeps their index digests (larger)")
	f.StringVar(&opts.Installer, "installer", "", "upgrade program to embed in a .run file (default: 'upgrade' next to this program)")
	f.StringVar(&opts.AgentProgram, "agent", "", "also carry the agent's image for agent mode (upgrade --via agent), made of this upgrade program: built static (CGO_ENABLED=0, as make build does) for the bundle's one --arch")
	return cmd
}

func createRun(ctx context.Context, opts *createOptions) error {
	cat, err := catalog.Load(opts.CatalogFile)
	if err != nil {
		return err
	}
	co := &bundle.CreateOptions{
		Catalog:           cat,
		KubernetesVersion: opts.KubernetesVersion,
		From:              opts.From,
		Arches:            opts.Arches,
		ExtraImages:       opts.Images,
		AllPlatforms:      opts.AllPlatforms,
		KubeletBinary:     opts.KubeletBinary,
		NodeStack:         opts.NodeStack,
		Etcd:              opts.Etcd,
		Access:            registry.Access{Insecure: opts.InsecureRegistry},
		HTTPClient:        httpClient(),
		Jobs:              opts.Jobs,
		CacheDir:          opts.CacheDir,
		Format:            bundle.Format(opts.Format),
		Log:               opts.IO.Logger(opts.Quiet),
	}
	for _, m := range opts.RegistryMirrors {
		mm, err := bundle.ParseMirror(m)
		if err != nil {
			return cli.Usagef("--registry-mirror: %v", err)
		}
		co.RegistryMirrors = append(co.RegistryMirrors, mm)
	}
	for _, m := range opts.URLMirrors {
		mm, err := bundle.ParseMirror(m)
		if err != nil {
			return cli.Usagef("--url-mirror: %v", err)
		}
		co.URLMirrors = append(co.URLMirrors, mm)
	}
	for _, f := range opts.Files {
		ef, err := bundle.ParseExtraFile(f)
		if err != nil {
			return cli.Usagef("--file: %v", err)
		}
		co.ExtraFiles = append(co.ExtraFiles, ef)
	}

	if opts.DryRun {
		asJSON, err := cli.OutputFlag(opts.Output)
		if err != nil {
			return cli.Usagef("with --dry-run, -o selects the format: %v", err)
		}
		plan, err := bundle.MakePlan(co)
		if err != nil {
			return err
		}
		if asJSON {
			return cli.PrintJSON(opts.IO.Out, plan)
		}
		fmt.Fprintf(opts.IO.Out, "Kubernetes %s for %s would fetch:\n", plan.KubernetesVersion, strings.Join(plan.Arches, ", "))
		for _, im := range plan.Images {
			fmt.Fprintf(opts.IO.Out, "  image %s from %s\n", im.Ref, im.PullFrom)
		}
		for _, f := range plan.Files {
			sum := f.SHA256
			if sum == "" {
				sum = "checked against " + f.URL + ".sha256"
			}
			fmt.Fprintf(opts.IO.Out, "  file  %s %s (%s)\n", f.Name, f.URL, sum)
		}
		for _, h := range plan.Hops {
			fmt.Fprintf(opts.IO.Out, "and, for the control plane to pass through %s:\n", h.Version)
			for _, f := range h.Files {
				fmt.Fprintf(opts.IO.Out, "  file  %s %s\n", f.Name, f.URL)
			}
		}
		return nil
	}

	switch co.Format {
	case bundle.FormatTar, bundle.FormatRun:
	default:
		return cli.Usagef("--format %q: want tar or run", opts.Format)
	}
	if opts.Output == "" {
		opts.Output = fmt.Sprintf("k8s-%s-linux-%s.%s", opts.KubernetesVersion, strings.Join(opts.Arches, "+"), opts.Format)
	}
	if opts.Output == "json" || opts.Output == "text" {
		return cli.Usagef("-o %s names the bundle file; did you mean --dry-run -o %s?", opts.Output, opts.Output)
	}
	co.Output = opts.Output
	if opts.SignKey != "" {
		if co.SignKey, err = bundle.LoadPrivateKey(opts.SignKey); err != nil {
			return fmt.Errorf("--sign-key: %w", err)
		}
	}
	if co.Format == bundle.FormatRun {
		if co.Installer, err = installerPath(opts); err != nil {
			return err
		}
	}
	co.AgentProgram = opts.AgentProgram
	sink, finish := opts.IO.Progress(opts.Quiet, "fetching")
	co.Progress = sink
	start := time.Now()
	m, err := bundle.Create(ctx, co)
	finish()
	if err != nil {
		return err
	}
	signer := m.Signer
	if signer == "" {
		signer = "nobody (unsigned)"
	}
	hops := ""
	for i, h := range m.Hops {
		if i == 0 {
			hops = ", control plane through"
		}
		hops += " " + h.Release.Version
	}
	fmt.Fprintf(opts.IO.Out, "wrote %s: Kubernetes %s %v%s, %d images, %d files, %d entries, %s, signed by %s (%.1fs)\n",
		opts.Output, m.KubernetesVersion, m.Arches, hops, len(m.Images), len(m.Files), len(m.Entries), bundle.HumanBytes(m.TotalSize()), signer, time.Since(start).Seconds())
	if _, err := os.Stat(opts.Output + bundle.DetachedSigSuffix); err == nil {
		fmt.Fprintf(opts.IO.Out, "wrote %s and %s: check the bundle with openssl and sha256sum before running anything of it\n", opts.Output+bundle.DetachedSumSuffix, opts.Output+bundle.DetachedSigSuffix)
	}
	return nil
}

func installerPath(opts *createOptions) (string, error) {
	if opts.Installer != "" {
		return opts.Installer, nil
	}
	if len(opts.Arches) != 1 || opts.Arches[0] != runtime.GOARCH {
		return "", cli.Usagef("--format run for linux/%s needs --installer: the upgrade program built for that arch", strings.Join(opts.Arches, ","))
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(self), "upgrade")
	if _, err := os.Stat(p); err != nil {
		return "", cli.Usagef("--format run embeds the upgrade program, and %s does not exist: pass --installer", p)
	}
	return p, nil
}

func httpClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	tr.ResponseHeaderTimeout = 60 * time.Second
	return &http.Client{Transport: tr}
}
