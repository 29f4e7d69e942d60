package main

import (
	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/buildinfo"
	"github.com/kubelift/kubelift/internal/cli"
)

func newRootCmd(s *cli.IO) *cobra.Command {
	root := &cobra.Command{
		Use:   "bundle",
		Short: "Package a Kubernetes version into one signed offline bundle",
		Long: `bundle runs where the internet (or a mirror) is reachable. It packages what
one Kubernetes version needs - control-plane images, pause, coredns, etcd,
kube-proxy, kubeadm/kubelet/kubectl, crictl, CNI plugins, plus your own images
and files - into one signed file to carry into an air gap.

  bundle keygen --out team
  bundle create --kubernetes-version v1.31.4 --sign-key team.key -o k8s-v1.31.4.tar
  bundle verify --key team.pub k8s-v1.31.4.tar

Inside the air gap, the 'upgrade' program imports the bundle.`,
		Version: buildinfo.String(),
	}
	root.SetOut(s.Out)
	root.SetErr(s.ErrOut)
	root.AddCommand(newCmdKeygen(s, nil), newCmdCreate(s, nil), cli.NewCmdVerify(s), cli.NewCmdExtract(s), cli.NewCmdInspect(s), newCmdCatalog(s))
	return root
}
