// Command kubelift-sandbox brings the sandbox cluster up and down (make
// sandbox-up, make sandbox-down) and is also, inside every sandbox
// machine, its init (node-init), its systemctl (when called by that name)
// and its container runtime stand-in (cri).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kubelift/kubelift/test/env/kube"
	"github.com/kubelift/kubelift/test/env/sandbox"
	"github.com/kubelift/kubelift/test/env/sandbox/systemd"
)

func main() {
	if name := filepath.Base(os.Args[0]); name == "systemctl" || name == "systemd-run" {
		args := os.Args[1:]
		if name == "systemd-run" { // a transient unit: the manager's verb "run"
			args = append([]string{"run"}, args...)
		}
		stdout, stderr, code := systemd.Systemctl(systemd.Socket, args)
		fmt.Fprint(os.Stdout, stdout)
		fmt.Fprint(os.Stderr, stderr)
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if filepath.Base(os.Args[0]) == "crictl" {
		if err := sandbox.Crictl(ctx, sandbox.CRIEndpoint, os.Args[1:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "crictl:", err)
			os.Exit(1)
		}
		return
	}
	if err := newRoot().ExecuteContext(ctx); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "kubelift-sandbox:", err)
		os.Exit(1)
	}
}

func defaultDir() string {
	if d := os.Getenv("SANDBOX_DIR"); d != "" {
		return d
	}
	return ".sandbox"
}

// binaryFlags are the flags that decide what a sandbox runs, and so what
// up and build build: the releases, kubeadm, the container runtime and
// the add-ons (CoreDNS, etcd).
func binaryFlags(f *pflag.FlagSet, cfg *sandbox.Config) {
	f.StringVar(&cfg.OldVersion, "old-version", "v1.30.14", "Kubernetes version the cluster runs")
	f.StringVar(&cfg.NewVersion, "target", "v1.31.4", "Kubernetes version to upgrade to (KUBELIFT_NEW_VERSION in env.sh); more than one minor ahead, the control plane of every minor in between is built too and the stand-in internet serves what 'bundle create --from' needs")
	f.BoolVar(&cfg.Kubeadm, "kubeadm", false, "build the cluster with kubeadm (init and join; static control-plane pods from images in the private registry, kube-proxy as a DaemonSet, CoreDNS) instead of binary-deployed units")
	f.StringVar(&cfg.Runtime, "runtime", sandbox.RuntimeContainerd, "the nodes' container runtime: containerd (containerd, runc, CNI: real processes) or stand-in (a CRI server that keeps records)")
	f.StringVar(&cfg.CoreDNS, "coredns", "", "on a binary sandbox, run CoreDNS at this version (\"v1.11.1\", built from the Go module proxy) as a binary installer deploys it, the kube-dns Service at "+sandbox.ClusterDNS+" (default: no CoreDNS)")
	f.StringVar(&cfg.Etcd, "etcd", "", "on a binary sandbox, run an etcd cluster at this version (\"v3.5.35\", built from the Go module proxy) with a member on every control plane, etcd, etcdctl and etcdutl in /usr/local/bin and an etcd.service, as binary installers leave it (default: Debian's etcd on cp-1 alone)")
	f.StringVar(&cfg.EtcdTo, "etcd-to", "", "on a binary sandbox, build etcd at this version (\"v3.6.16\") and have the stand-in internet serve its release archive where upstream publishes it, for 'bundle create --etcd' (default: none)")
	f.StringVar(&cfg.RuntimeVersion, "runtime-version", "", "containerd's version on every node, built from the Go module proxy: "+kube.ContainerdVersion+" (the default) or "+kube.Containerd17+" (containerd 1.7, which Kubernetes after v1.35 no longer supports)")
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "kubelift-sandbox",
		Short:         "A real local Kubernetes cluster to upgrade (namespaces, real binaries, a CRI stand-in)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	var dir string
	root.PersistentFlags().StringVar(&dir, "dir", defaultDir(), "state directory ($SANDBOX_DIR)")

	cfg := sandbox.Config{}
	up := &cobra.Command{
		Use:   "up",
		Short: "Bring the sandbox up (idempotent) and wait until every node is Ready",
		Long: `Builds (or finds cached) Kubernetes binaries for both versions, makes the
network (a bridge in the admin namespace, one namespace per node), the
certificates, ssh keys and unit files, boots every machine (service
manager, sshd, CRI stand-in, kubelet; etcd and the control plane on
control-plane nodes; the private registry on the admin machine) and
creates the workloads. Source env.sh in the state directory afterwards.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Dir, cfg.Tool = dir, exe
			cfg.Log = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "sandbox: "+format+"\n", args...) }
			s, err := sandbox.Up(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			fmt.Printf("Ready. Use it with:\n  . %s/env.sh\n  sandbox kubectl get nodes -o wide\n  sandbox-ssh worker-1 systemctl status kubelet\n", s.Dir)
			return nil
		},
	}
	up.Flags().IntVar(&cfg.ControlPlanes, "control-planes", 1, "control-plane nodes (1, or 3 for HA)")
	up.Flags().IntVar(&cfg.Workers, "workers", 3, "worker nodes")
	binaryFlags(up.Flags(), &cfg)
	up.Flags().StringVar(&cfg.NewVersion, "new-version", "v1.31.4", "the same as --target")
	_ = up.Flags().MarkDeprecated("new-version", "use --target")
	up.Flags().StringVar(&cfg.Name, "name", "kl", "prefix of the sandbox's namespaces")
	up.Flags().StringVar(&cfg.Subnet, "subnet", "10.77.0", "first three octets of the sandbox's /24")
	up.Flags().BoolVar(&cfg.Workloads, "workloads", true, "create the demo workloads")
	up.Flags().StringVar(&cfg.APIServerFeatureGates, "apiserver-feature-gates", "", "on a binary sandbox, the API servers' --feature-gates (\"APIServerTracing=false\": through v1.33 the API server's etcd tracing replaces its etcd client's retries, docs/etcd.md) (default: none given)")

	var bcfg sandbox.Config
	var hashSkip bool
	build := &cobra.Command{
		Use:   "build",
		Short: "Build (or find cached) every binary a sandbox of these flags runs, and bring nothing up",
		Long: `Builds from the Go module proxy, or finds in ~/.cache/kubelift, what up
would build for the same flags (up boots the nodes on the old release
while it builds the target): both releases, the control plane
of every hop between them, the container runtime, and with --kubeadm
kubeadm, etcd and CoreDNS; --hash-skip adds the target's kubelet with
kubelift's hash-skip patch. Each build holds a lock per version, so
that a sandbox brought up meanwhile waits for it and takes its result.
make test runs it in the background while the unit tests run, so that
the stories find their releases built.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bcfg.Log = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "sandbox: "+format+"\n", args...) }
			if _, err := sandbox.Build(cmd.Context(), bcfg); err != nil {
				return err
			}
			if hashSkip {
				bcfg.Log("building (or finding cached) kubelet %s with kubelift's hash-skip patch", bcfg.NewVersion)
				if _, err := kube.HashSkipKubelet(cmd.Context(), bcfg.NewVersion); err != nil {
					return err
				}
			}
			return nil
		},
	}
	binaryFlags(build.Flags(), &bcfg)
	build.Flags().BoolVar(&hashSkip, "hash-skip", false, "also build the target's kubelet with kubelift's hash-skip patch (what the tests' bundles carry)")

	down := &cobra.Command{
		Use:   "down",
		Short: "Stop every sandbox process (by pid), delete its namespaces and remove the state directory",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return sandbox.Down(cmd.Context(), dir, func(format string, args ...any) {
				fmt.Fprintf(os.Stderr, "sandbox: "+format+"\n", args...)
			})
		},
	}

	var output string
	status := &cobra.Command{
		Use:   "status",
		Short: "List the sandbox's machines and whether they run",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := sandbox.Load(dir)
			if err != nil {
				return err
			}
			type row struct {
				sandbox.Machine
				State string `json:"state"`
			}
			var rows []row
			for _, m := range s.Machines {
				state := "stopped"
				if m.Pid > 0 && sandbox.Running(m.Pid) {
					state = "running"
				}
				rows = append(rows, row{m, state})
			}
			switch output {
			case "json":
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"dir": s.Dir, "complete": s.Complete, "apiServer": s.APIServer, "machines": rows})
			case "", "text":
			default:
				return fmt.Errorf("--output %q: want text or json", output)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "MACHINE\tROLE\tADDRESS\tNETNS\tINIT PID\tSTATE")
			for _, r := range rows {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", r.Name, r.Role, r.Address, r.NetNS, r.Pid, r.State)
			}
			return w.Flush()
		},
	}
	status.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")

	execCmd := &cobra.Command{
		Use:   "exec MACHINE -- COMMAND [ARG...]",
		Short: "Run a command on a machine (its network, mount and UTS namespaces)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := sandbox.Load(dir)
			if err != nil {
				return err
			}
			m, err := s.Machine(args[0])
			if err != nil {
				return err
			}
			c := s.Command(*m, args[1], args[2:]...)
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
			return c.Run()
		},
	}

	var root_, hostname string
	nodeInit := &cobra.Command{
		Use:    "node-init",
		Short:  "A sandbox machine's init (started by up inside the machine's namespaces)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(os.Stderr, "init: %s, tree %s\n", hostname, root_)
			return sandbox.RunInit(cmd.Context(), root_, hostname, func(format string, args ...any) {
				fmt.Fprintf(os.Stderr, "systemd: "+format+"\n", args...)
			})
		},
	}
	nodeInit.Flags().StringVar(&root_, "root", "", "the machine's file tree")
	nodeInit.Flags().StringVar(&hostname, "hostname", "", "the machine's name")

	var endpoint string
	var imageSize uint64
	cri := &cobra.Command{
		Use:   "cri",
		Short: "Serve the CRI stand-in (k8s.io/cri-client/pkg/fake) on a unix socket",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return sandbox.ServeCRI(cmd.Context(), endpoint, imageSize)
		},
	}
	cri.Flags().StringVar(&endpoint, "endpoint", "unix:///run/fake-cri/cri.sock", "CRI endpoint")
	cri.Flags().Uint64Var(&imageSize, "image-size", 1<<20, "size reported for every image (the kubelet rejects 0)")

	var filesDir, listen string
	serveFiles := &cobra.Command{
		Use:    "serve-files",
		Short:  "Serve a directory over HTTP (the stand-in internet's file server)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return sandbox.ServeFiles(cmd.Context(), filesDir, listen)
		},
	}
	serveFiles.Flags().StringVar(&filesDir, "dir", "/srv/files", "directory to serve")
	serveFiles.Flags().StringVar(&listen, "listen", "127.0.0.1:8080", "address to listen on")

	var lbListen string
	var lbBackends []string
	lb := &cobra.Command{
		Use:    "lb",
		Short:  "Forward TCP to the ready API servers (the HA kubeadm sandbox's load balancer)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logf := func(format string, args ...any) {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s %s\n", time.Now().UTC().Format(time.RFC3339), fmt.Sprintf(format, args...))
			}
			return sandbox.ServeLB(cmd.Context(), lbListen, lbBackends, logf)
		},
	}
	lb.Flags().StringVar(&lbListen, "listen", "", "address to listen on")
	lb.Flags().StringArrayVar(&lbBackends, "backend", nil, "an API server's host:port (repeated)")

	root.AddCommand(up, build, down, status, execCmd, nodeInit, cri, serveFiles, lb)
	return root
}
