package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/cli"
)

type keygenOptions struct {
	IO  *cli.IO
	Out string
}

func newCmdKeygen(s *cli.IO, runF func(context.Context, *keygenOptions) error) *cobra.Command {
	opts := &keygenOptions{IO: s}
	cmd := &cobra.Command{
		Use:   "keygen --out PREFIX",
		Short: "Create a signing key pair: PREFIX.key (private) and PREFIX.pub",
		Long: `Keygen writes an ECDSA P-256 key pair in standard PEM: PREFIX.key (PKCS#8,
mode 0600) and PREFIX.pub (PKIX). It never overwrites an existing file.

Keep PREFIX.key where bundles are made; hand PREFIX.pub to the operators in
the air gap through a channel other than the bundle. openssl can check a
bundle's signature with it too (see the README).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.Out == "" {
				return cli.Usagef("--out PREFIX is required")
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return keygenRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.Out, "out", "", "path prefix of the key files")
	return cmd
}

func keygenRun(_ context.Context, opts *keygenOptions) error {
	fp, err := bundle.GenerateKey(opts.Out)
	if err != nil {
		return err
	}
	fmt.Fprintf(opts.IO.Out, "wrote %s.key (keep it secret) and %s.pub\nfingerprint %s\n", opts.Out, opts.Out, fp)
	return nil
}
