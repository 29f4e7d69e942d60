package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/buildinfo"
	"github.com/kubelift/kubelift/internal/cli"
)

func newRootCmd(s *cli.IO) *cobra.Command {
	return newRoot(s, os.Getenv, func(cf *configFlags) []*cobra.Command {
		return []*cobra.Command{newCmdImport(s, nil), newCmdStage(s, nil), newCmdVersions(s, nil), newCmdPlan(s, nil), newCmdApply(s, nil), newCmdStatus(s, nil), newCmdRollback(s, nil),
			cli.NewCmdVerify(s), cli.NewCmdExtract(s), cli.NewCmdInspect(s), newCmdCompat(s), newCmdAgent(s, nil), newCmdController(s, nil), newCmdConfig(s, cf), newCmdReport(s, nil)}
	})
}

// newRoot is the root over commands, which take the kubelift context's
// values for the flags they were not given (getenv reads the
// environment).
func newRoot(s *cli.IO, getenv func(string) string, commands func(*configFlags) []*cobra.Command) *cobra.Command {
	root := &cobra.Command{
		Use:   "upgrade",
		Short: "Import kubelift bundles and upgrade Kubernetes in place, inside an air gap",
		Long: `upgrade runs inside the air gap, on a node of the cluster (or of a management
cluster). It verifies a bundle made by 'bundle create' against your team's
public key, imports it, and upgrades the cluster in place:

  upgrade config set-context prod --kubeconfig ... --domain REG ... --key team.pub   # once: flags below come from it
  upgrade import k8s-v1.31.4-linux-amd64.run --key team.pub --domain REG ...   # or ./k8s-...run --upgrade
  upgrade stage   --to v1.31.4 --key team.pub [ssh flags]    # binaries onto every node
  upgrade versions                                           # what the nodes run, what is available
  upgrade plan    --to v1.31.4 --key team.pub [ssh flags]    # what apply would do; changes nothing
  upgrade apply   --to v1.31.4 --key team.pub [ssh flags]    # in place, node by node; again to resume
  upgrade apply   --to v1.31.4 --in-cluster [--detach]       # the cluster's controller runs it
  upgrade status [-w]                                        # the upgrade's state, per node; -w follows it
  upgrade report --file upgrade.html                         # for the change ticket: plan, timeline, restarts, bundle
  upgrade rollback [ssh flags]                               # undo it from the backups, when allowed
  upgrade compat cleanup [ssh flags]                         # hash-skip files no longer needed

A .run bundle carries this program: './k8s-v1.31.4-linux-amd64.run --help'.`,
		Version: buildinfo.String(),
	}
	cf := &configFlags{getenv: getenv}
	cf.addFlags(root)
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error { return cf.apply(cmd) }
	root.SetOut(s.Out)
	root.SetErr(s.ErrOut)
	root.AddCommand(commands(cf)...)
	return root
}
