package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/config"
	"github.com/kubelift/kubelift/internal/controller"
	"github.com/kubelift/kubelift/internal/importer"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/registry"
)

type importOptions struct {
	IO           *cli.IO
	Bundle       string
	Trust        cli.TrustOptions
	Registry     cli.RegistryFlags
	Namespace    string
	KeepPath     bool
	Jobs         int
	DryRun       bool
	Output       string
	Quiet        bool
	Kubeconfig   string
	KubeContext  string
	SkipBinaries bool
	// Stage: SSH flags were given, so the binaries are staged on the nodes.
	Nodes    cli.NodeFlags
	Stage    bool
	StageDir string
	CacheDir string
	Path     stagePath
	// InstallController: install (or update) the in-cluster controller
	// from the imported bundle's agent image.
	InstallController bool
}

func newCmdImport(s *cli.IO, runF func(context.Context, *importOptions) error) *cobra.Command {
	opts := &importOptions{IO: s}
	cmd := &cobra.Command{
		Use:   "import FILE --key PUB --domain HOST[:PORT] [flags]",
		Short: "Verify a bundle and push its images into the private registry",
		Long: `Import checks the bundle's signature, its signed manifest and every entry's
place and size before pushing anything, and each entry's sha256 as it
pushes it (an entry that is not the signed one is never completed in the
registry, no manifest is pushed after it, and import exits 3; --dry-run
reads the whole bundle first, as 'verify' does). It pushes every image to
DOMAIN/NAMESPACE/NAME:TAG, where NAME is the last element of the upstream
repository:

  registry.k8s.io/coredns/coredns:v1.11.3 -> registry.corp:5000/library/coredns:v1.11.3

(--keep-path keeps the whole upstream path: .../library/coredns/coredns).
Manifests are pushed byte for byte, so digests equal upstream's. A registry
refuses a multi-arch index whose children it lacks: for a bundle made for
some arches only, import tags the bundled platform's upstream manifest (or
pushes an index of just those platforms) and says so; bundle with
--all-platforms to keep index digests too.

Only what the registry lacks is sent: blobs it has are skipped, blobs in
another repository of it are mounted, and a re-run after an interruption
sends only what is missing. Afterwards every image must resolve by digest,
or import fails.

The password comes from --password-stdin, --password or
KUBELIFT_REGISTRY_PASSWORD, and is never printed. Without --username the
docker config (~/.docker/config.json) supplies credentials.

The binaries (kubelet, the control plane, kubectl ...) are pushed too, as
OCI artifacts (one per file, its layer digest the signed sha256, and a
second layer with its zstd copy, made once in --cache-dir, for nodes to
pull), so that 'upgrade stage' and 'apply' fetch them from the registry; --skip-binaries
leaves them out for registries that refuse artifacts. With a kubeconfig the
version is recorded in the cluster. With SSH flags (--inventory, --ssh-key,
--known-hosts or --ssh-jump) the binaries are then staged on every node, as
'upgrade stage' does, from this file.

On a .run bundle: ./k8s-v1.31.4-linux-amd64.run --upgrade --key PUB --domain ...`,
		Example: `  echo "$PASS" | upgrade import k8s-v1.31.4-linux-amd64.tar --key team.pub \
      --domain registry.corp:5000 --namespace library --username admin --password-stdin
  upgrade import k8s-v1.31.4-linux-amd64.tar --key team.pub --domain registry.corp:5000 --dry-run`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Bundle = args[0]
			for _, f := range []string{"inventory", "ssh-key", "known-hosts", "ssh-jump"} {
				opts.Stage = opts.Stage || cmd.Flags().Changed(f) || config.FromContext(cmd.Flags(), f)
			}
			// Through agents, the nodes need no SSH flag to be staged.
			opts.Stage = opts.Stage || opts.Path.Via == viaAgent
			if opts.Stage && opts.SkipBinaries && opts.Path.Via == viaAgent {
				return cli.Usagef("--via agent with --skip-binaries: through agents, nodes pull their files from the registry, where --skip-binaries does not push them")
			}
			if err := opts.Registry.Validate(); err != nil {
				return err
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return importRun(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	opts.Trust.AddFlags(cmd)
	opts.Registry.AddFlags(cmd)
	opts.Nodes.AddFlags(cmd)
	addStageFlags(cmd, &opts.StageDir, &opts.CacheDir)
	opts.Path.addFlags(cmd)
	f.StringVar(&opts.Namespace, "namespace", "", "path below the domain, e.g. library")
	f.BoolVar(&opts.KeepPath, "keep-path", false, "keep the upstream repository path (coredns/coredns) instead of its last element")
	f.IntVar(&opts.Jobs, "jobs", 4, "parallel transfers")
	f.BoolVar(&opts.DryRun, "dry-run", false, "check credentials and say what would be pushed; change nothing")
	f.StringVarP(&opts.Output, "output", "o", "", "output format: text or json")
	f.BoolVarP(&opts.Quiet, "quiet", "q", false, "no progress or status on stderr")
	f.BoolVar(&opts.SkipBinaries, "skip-binaries", false, "do not push the binaries as OCI artifacts (for registries that refuse them; stage from the bundle file instead)")
	f.StringVar(&opts.Kubeconfig, "kubeconfig", "", "record the version as available in this cluster (default: KUBECONFIG, or in-cluster; none: not recorded)")
	kubeContextFlag(cmd, &opts.KubeContext)
	f.BoolVar(&opts.InstallController, "install-controller", false, "then install (or update) the in-cluster controller from the bundle's agent image, as 'upgrade controller install --to VERSION' does, with these registry credentials and --key (docs/controller.md)")
	return cmd
}

func importRun(ctx context.Context, opts *importOptions) error {
	asJSON, err := cli.OutputFlag(opts.Output)
	if err != nil {
		return err
	}
	if err := opts.Path.check(); err != nil {
		return err
	}
	trust, err := opts.Trust.Trust()
	if err != nil {
		return err
	}
	creds, err := opts.Registry.Credentials(opts.IO.In)
	if err != nil {
		return err
	}
	access, err := creds.Access()
	if err != nil {
		return err
	}
	var recorder importer.Recorder
	client, err := cluster.Client(opts.Kubeconfig, opts.KubeContext)
	switch {
	case errors.Is(err, cluster.ErrNoKubeconfig) && opts.InstallController:
		return cli.Usagef("--install-controller: %v", err)
	case errors.Is(err, cluster.ErrNoKubeconfig) && !opts.Stage:
		// Not recorded: said in the summary.
	case err != nil:
		return err
	default:
		recorder = cluster.Recorder{Client: client}
	}
	sink, finish := opts.IO.Progress(opts.Quiet, "pushing")
	start := time.Now()
	res, err := importer.Import(ctx, importer.Options{
		Bundle: opts.Bundle, Trust: trust, Domain: opts.Registry.Domain, Namespace: opts.Namespace, KeepPath: opts.KeepPath,
		Access: access, Jobs: opts.Jobs, DryRun: opts.DryRun, Progress: sink, Log: opts.IO.Logger(opts.Quiet),
		Recorder: recorder, SkipFiles: opts.SkipBinaries, CacheDir: opts.CacheDir,
	})
	finish()
	if res != nil {
		if asJSON {
			if perr := cli.PrintJSON(opts.IO.Out, res); perr != nil {
				return perr
			}
		} else {
			printImport(opts.IO.Out, res, time.Since(start))
		}
	}
	if err == nil && opts.InstallController && !opts.DryRun {
		err = opts.installController(ctx, client, res.KubernetesVersion, trust, access, creds)
	}
	if err != nil || !opts.Stage || opts.DryRun {
		return err
	}
	// SSH flags given: stage the binaries on every node, from this file.
	v, err := bundle.Open(ctx, opts.Bundle, trust)
	if err != nil {
		return err
	}
	defer v.Close()
	// The nodes may pull what was just pushed; what this machine sends
	// comes from the file.
	target, source, err := stage.Imported(v, res.KubernetesVersion, res.Files, access)
	if err != nil {
		return err
	}
	if opts.Path.Via == viaAgent {
		// The agents' image is the record's, just written.
		if target, err = release.Load(ctx, client, res.KubernetesVersion, trust); err != nil {
			return err
		}
		source = stage.RegistrySource{Access: access}
	}
	steps, err := (&kubeFlags{Kubeconfig: opts.Kubeconfig, KubeContext: opts.KubeContext}).stepClient(opts.Path.AgentQPS)
	if err != nil {
		return err
	}
	sres, err := stageNodes(ctx, opts.IO, client, steps, &opts.Nodes, target, source, opts.StageDir, opts.CacheDir, opts.Path, access, opts.Registry.Domain, opts.Quiet)
	if sres != nil && !asJSON {
		printStage(opts.IO.Out, sres)
	}
	return err
}

func archSuffix(arch string) string {
	if arch == "" {
		return ""
	}
	return " (" + arch + ")"
}

func printImport(w io.Writer, res *importer.Result, took time.Duration) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tTARGET\tDIGEST\tACTION\tBLOBS (up/mount/present)\tSENT")
	// Images in the same situation share one footnote.
	var notes []string
	mark := map[string]string{}
	for _, r := range res.Images {
		digest := r.Digest
		if !r.DigestKept {
			if _, ok := mark[r.Note]; !ok {
				mark[r.Note] = strings.Repeat("*", len(mark)+1)
				notes = append(notes, r.Note)
			}
			digest += " " + mark[r.Note]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d/%d\t%s\n", r.Ref, r.Target, digest, r.Action, r.Uploaded, r.Mounted, r.Present, bundle.HumanBytes(r.UploadBytes))
	}
	for _, f := range res.Files {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\t%s\n", f.Name+archSuffix(f.Arch), f.Target, "sha256:"+f.SHA256[:12]+"…", f.Action, bundle.HumanBytes(f.UploadBytes))
	}
	tw.Flush()
	for _, n := range notes {
		fmt.Fprintf(w, "%s %s (upstream index digests: -o json)\n", mark[n], n)
	}
	verb := "pushed"
	if res.DryRun {
		verb = "would push"
	}
	for _, r := range res.Images {
		if r.Action == importer.ActionStopped {
			verb = "stopped before it had pushed all of"
		}
	}
	fmt.Fprintf(w, "Kubernetes %s: %d images, %d binaries, %s %s to %s (%.1fs)\n", res.KubernetesVersion, len(res.Images), len(res.Files), verb, bundle.HumanBytes(res.UploadBytes), res.Registry, took.Seconds())
	switch {
	case res.Recorded != "":
		fmt.Fprintf(w, "recorded as available in the cluster: configmap %s/%s\n", cluster.Namespace, res.Recorded)
	case !res.DryRun:
		fmt.Fprintln(w, "not recorded in a cluster (no --kubeconfig, KUBECONFIG or in-cluster config)")
	}
}

// installController installs the controller from the version just
// imported (its record's agent image).
func (opts *importOptions) installController(ctx context.Context, client kubernetes.Interface, version string, trust bundle.Trust,
	access registry.Access, creds registry.Credentials) error {
	cfg, err := cluster.Config(opts.Kubeconfig, opts.KubeContext)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	target, err := release.Load(ctx, client, version, trust)
	if err != nil {
		return err
	}
	return installController(ctx, opts.IO.Out, client, dyn, target, access, creds, opts.Trust,
		controller.Install{Replicas: 2, AgentQPS: opts.Path.AgentQPS, NodeCredentials: opts.Path.NodeCredentials}, false)
}
