package cli

import (
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubelift/kubelift/internal/nodeaccess"
)

// InventoryEnv may name the inventory file (the sandbox's env.sh sets it).
const InventoryEnv = "KUBELIFT_INVENTORY"

// NodeFlags say how to reach the cluster's nodes over SSH.
type NodeFlags struct {
	Inventory      string
	IdentityFile   string
	KnownHosts     string
	User           string
	Port           int
	Jump           string
	Parallel       int
	ConnectTimeout time.Duration
}

// AddFlags registers the SSH flags.
func (f *NodeFlags) AddFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.Inventory, "inventory", os.Getenv(InventoryEnv), "inventory file: per node or role address, port, user (default $"+InventoryEnv+"); nodes come from the API either way")
	fs.StringVar(&f.IdentityFile, "ssh-key", "", "private key file for SSH (also: ssh-agent at $SSH_AUTH_SOCK)")
	fs.StringVar(&f.KnownHosts, "known-hosts", "", "known_hosts file every node's host key is checked against (default ~/.ssh/known_hosts)")
	fs.StringVar(&f.User, "ssh-user", "", "SSH user (default root; others run commands with sudo -n)")
	fs.IntVar(&f.Port, "ssh-port", 0, "SSH port (default 22)")
	fs.StringVar(&f.Jump, "ssh-jump", "", "jump host, [user@]host[:port] (its host key is checked too)")
	fs.IntVar(&f.Parallel, "parallel", 10, "nodes worked on at once over SSH")
	fs.DurationVar(&f.ConnectTimeout, "ssh-timeout", 20*time.Second, "time to connect and log in to a node")
}

// Access returns the inventory (the file's, with the flags over its ssh
// section) and a connector that reaches the nodes.
func (f *NodeFlags) Access() (*nodeaccess.Inventory, *nodeaccess.Dialer, error) {
	inv := &nodeaccess.Inventory{}
	if f.Inventory != "" {
		var err error
		if inv, err = nodeaccess.LoadInventory(f.Inventory); err != nil {
			return nil, nil, err
		}
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&inv.SSH.IdentityFile, f.IdentityFile)
	set(&inv.SSH.KnownHostsFile, f.KnownHosts)
	set(&inv.SSH.User, f.User)
	set(&inv.SSH.Jump, f.Jump)
	if f.Port != 0 {
		inv.SSH.Port = f.Port
	}
	if inv.SSH.KnownHostsFile == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, nil, Usagef("--known-hosts is required: no home directory for ~/.ssh/known_hosts")
		}
		inv.SSH.KnownHostsFile = filepath.Join(home, ".ssh", "known_hosts")
	}
	d, err := nodeaccess.NewDialer(inv.SSH.KnownHostsFile, append(inv.DialerOptions(), nodeaccess.WithConnectTimeout(f.ConnectTimeout))...)
	if err != nil {
		return nil, nil, err
	}
	return inv, d, nil
}
