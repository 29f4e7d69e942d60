package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/bundle"
)

// TrustOptions are the flags that say which bundles to trust.
type TrustOptions struct {
	KeyFile       string
	AllowUnsigned bool
}

// AddFlags registers --key and --allow-unsigned.
func (o *TrustOptions) AddFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.KeyFile, "key", "", "your team's public key (PEM) that bundles must be signed with")
	cmd.Flags().BoolVar(&o.AllowUnsigned, "allow-unsigned", false, "accept a bundle made with --unsigned (entries are still checked; nothing proves who made it)")
}

// Trust loads the key.
func (o *TrustOptions) Trust() (bundle.Trust, error) {
	if o.KeyFile == "" {
		if o.AllowUnsigned {
			return bundle.Trust{AllowUnsigned: true}, nil
		}
		return bundle.Trust{}, Usagef("--key is required: the public key bundles must be signed with (or --allow-unsigned)")
	}
	pub, err := bundle.LoadPublicKey(o.KeyFile)
	if err != nil {
		return bundle.Trust{}, fmt.Errorf("--key: %w", err)
	}
	return bundle.Trust{Key: pub, AllowUnsigned: o.AllowUnsigned}, nil
}

// NewCmdVerify is `verify --key PUB FILE`.
func NewCmdVerify(s *IO) *cobra.Command {
	var trust TrustOptions
	var output string
	cmd := &cobra.Command{
		Use:   "verify --key PUB FILE",
		Short: "Check a bundle's signature and every entry in one pass",
		Long: `Verify reads the bundle (a .tar or .run file) once, from start to end. It
checks the signature of bundle.json against the public key you pass, then
hashes every entry against the signed manifest. It rejects, naming the entry:
a bad signature or different signing key, a modified, missing, extra or
duplicate entry, a size mismatch, truncation, absolute or '..' paths, links
and devices. It writes nothing.

Exit code 3 means the bundle was rejected.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := OutputFlag(output)
			if err != nil {
				return err
			}
			t, err := trust.Trust()
			if err != nil {
				return err
			}
			start := time.Now()
			m, err := bundle.VerifyFile(cmd.Context(), args[0], t)
			if err != nil {
				return err
			}
			if asJSON {
				return PrintJSON(s.Out, verifySummary(args[0], m))
			}
			signer := m.Signer
			if signer == "" {
				signer = "nobody (unsigned)"
			}
			fmt.Fprintf(s.Out, "%s: OK, Kubernetes %s (%v), %d images, %d files, %s, signed by %s (%.1fs)\n",
				args[0], m.KubernetesVersion, m.Arches, len(m.Images), len(m.Files), bundle.HumanBytes(m.TotalSize()), signer, time.Since(start).Seconds())
			return nil
		},
	}
	trust.AddFlags(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: text or json")
	return cmd
}

type summary struct {
	File              string         `json:"file"`
	Verified          bool           `json:"verified"`
	KubernetesVersion string         `json:"kubernetesVersion"`
	Arches            []string       `json:"arches"`
	Signer            string         `json:"signer"`
	Created           time.Time      `json:"created"`
	Tool              bundle.Tool    `json:"tool"`
	Images            []bundle.Image `json:"images"`
	Files             []bundle.File  `json:"files"`
	Hops              []hopSummary   `json:"hops,omitempty"`
	Entries           int            `json:"entries"`
	Bytes             int64          `json:"bytes"`
}

// hopSummary is a release the bundle's control plane passes through.
type hopSummary struct {
	Version string        `json:"version"`
	Files   []bundle.File `json:"files"`
}

func verifySummary(file string, m *bundle.Manifest) summary {
	s := summary{File: file, Verified: true, KubernetesVersion: m.KubernetesVersion, Arches: m.Arches, Signer: m.Signer,
		Created: m.Created, Tool: m.Tool, Images: m.Images, Files: m.Files, Entries: len(m.Entries), Bytes: m.TotalSize()}
	for _, h := range m.Hops {
		s.Hops = append(s.Hops, hopSummary{Version: h.Release.Version, Files: h.Files})
	}
	return s
}

// NewCmdExtract is `extract --key PUB FILE DIR`.
func NewCmdExtract(s *IO) *cobra.Command {
	var trust TrustOptions
	cmd := &cobra.Command{
		Use:   "extract --key PUB FILE DIR",
		Short: "Verify a bundle and unpack it into a new directory",
		Long: `Extract verifies the bundle exactly as 'verify' does while unpacking it into a
temporary directory beside DIR, and renames that to DIR only when everything
verified. On any failure nothing is left behind. DIR must not exist or be
empty. Free disk space is checked before anything is written.

DIR then holds bundle.json and bundle.json.sig (byte for byte as signed), the
OCI image layout in images/ (readable by skopeo, crane, ctr), binaries in
bin/linux/ARCH/ and user files in files/.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := trust.Trust()
			if err != nil {
				return err
			}
			m, err := bundle.Extract(cmd.Context(), args[0], args[1], t)
			if err != nil {
				return err
			}
			fmt.Fprintf(s.Out, "%s: verified and extracted to %s (%d entries, %s)\n", args[0], args[1], len(m.Entries), bundle.HumanBytes(m.TotalSize()))
			return nil
		},
	}
	trust.AddFlags(cmd)
	return cmd
}

// NewCmdInspect is `inspect FILE`.
func NewCmdInspect(s *IO) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "inspect FILE",
		Short: "Show what a bundle holds (reads its manifest; verifies nothing)",
		Long: `Inspect prints the bundle's manifest: Kubernetes version, arches, images with
their digests, files with sizes and sha256, and the fingerprint of the key it
claims to be signed by. It reads only the start of the file and verifies
nothing: use 'verify --key' before trusting what it says.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := OutputFlag(output)
			if err != nil {
				return err
			}
			m, signed, err := bundle.ReadManifest(args[0])
			if err != nil {
				return err
			}
			sum := verifySummary(args[0], m)
			sum.Verified = false
			if asJSON {
				return PrintJSON(s.Out, sum)
			}
			return printInspect(s.Out, m, signed)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: text or json")
	return cmd
}

func printInspect(w io.Writer, m *bundle.Manifest, signed bool) error {
	signer := "none (unsigned)"
	if signed {
		signer = m.Signer + " (claimed; not verified, run verify --key)"
	}
	hops := "none (one minor)"
	if len(m.Hops) > 0 {
		var vs []string
		for _, h := range m.Hops {
			vs = append(vs, h.Release.Version)
		}
		hops = strings.Join(vs, ", ") + " (the control plane passes through each; kubelets go straight to " + m.KubernetesVersion + ")"
	}
	fmt.Fprintf(w, "Kubernetes:  %s\nHops:        %s\nArches:      %v\nCreated:     %s by %s %s\nSigner:      %s\nHash era:    %s\nContent:     %d entries, %s\n\n",
		m.KubernetesVersion, hops, m.Arches, m.Created.Format(time.RFC3339), m.Tool.Name, m.Tool.Version, signer, m.Release.KubeletHashEra, len(m.Entries), bundle.HumanBytes(m.TotalSize()))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tDIGEST\tPLATFORMS\tSIZE")
	for _, im := range m.Images {
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", im.Ref, im.Digest, im.Platforms, bundle.HumanBytes(im.Bytes))
	}
	fmt.Fprintln(tw, "\t\t\t")
	fmt.Fprintln(tw, "FILE\tSHA256\tARCH\tSIZE")
	for _, f := range m.Files {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Path, f.SHA256, f.Arch, bundle.HumanBytes(f.Size))
	}
	for _, h := range m.Hops {
		for _, f := range h.Files {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Path, f.SHA256, f.Arch, bundle.HumanBytes(f.Size))
		}
	}
	return tw.Flush()
}
