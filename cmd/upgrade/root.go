package main

import (
	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/buildinfo"
	"github.com/kubelift/kubelift/internal/cli"
)

func newRootCmd(s *cli.IO) *cobra.Command {
	root := &cobra.Command{
		Use:   "upgrade",
		Short: "Import kubelift bundles and upgrade Kubernetes in place, inside an air gap",
		Long: `upgrade runs inside the air gap, on a node of the cluster (or of a management
cluster). It verifies a bundle made by 'bundle create' against your team's
public key, imports it, and upgrades the cluster in place.

A .run bundle carries this program: './k8s-v1.31.4-linux-amd64.run --help'.`,
		Version: buildinfo.String(),
	}
	root.SetOut(s.Out)
	root.SetErr(s.ErrOut)
	root.AddCommand(newCmdImport(s, nil), newCmdStage(s, nil), newCmdVersions(s), newCmdPlan(s, nil), newCmdApply(s), newCmdStatus(s),
		cli.NewCmdVerify(s), cli.NewCmdExtract(s), cli.NewCmdInspect(s), newCmdCompat(s))
	return root
}
