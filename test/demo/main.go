// Command demo is `make demo`: it plays the whole kubelift story as far as
// it exists, on this machine, with the progress a user sees, on the
// sandbox (make sandbox-up): the real bundle program makes a signed .run
// bundle from the sandbox's stand-in internet (Debian's docker-registry and
// a file server, in a namespace with no link to the air gap); the bundle
// is inspected, verified and unpacked; then, on the sandbox's admin
// machine, it is imported into the air gap's private registry and recorded
// in the cluster, and a running pod's kubelet hashes are explained.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kubelift/kubelift/test/env/kube"
	"github.com/kubelift/kubelift/test/env/prober"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

const version = "v1.31.4"

func main() {
	sandboxDir := flag.String("sandbox", ".sandbox", "state directory of the sandbox cluster (make sandbox-up)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sb, err := sandbox.Load(*sandboxDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err, "(run 'make sandbox-up' first; 'make demo' does)")
		os.Exit(1)
	}
	if err := run(ctx, sb); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

func sh(name string, args ...string) error {
	shown := append([]string{filepath.Base(name)}, args...)
	fmt.Printf("$ %s\n", strings.Join(shown, " "))
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

func run(ctx context.Context, sb *sandbox.State) error {
	work, err := filepath.Abs(".demo")
	if err != nil {
		return err
	}
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	bin, _ := filepath.Abs("bin")

	step("Outside the air gap: the stand-in internet (make sandbox-up; a namespace with no link to the air gap)")
	fmt.Printf("%s plays registry.k8s.io (docker-registry, seeded with %s's images); %s plays dl.k8s.io and github.com (kubelet and kubectl are real builds)\n",
		sb.Internet.Registry, version, sb.Internet.Files)
	fmt.Println("(commands below marked [internet] run there)")

	step("Making the team's signing key")
	key := filepath.Join(work, "team")
	if err := sh(filepath.Join(bin, "bundle"), "keygen", "--out", key); err != nil {
		return err
	}

	step("What would be fetched (hand this to the proxy allow-list)")
	flags := append([]string{}, sb.Internet.BundleFlags...)
	for _, img := range sb.Internet.UserImages {
		flags = append(flags, "--image", img) // the team's own images travel in the bundle too
	}
	if err := shIn(sb, sb.Internet.NetNS, "", filepath.Join(bin, "bundle"), append([]string{"create", "--kubernetes-version", version, "--dry-run"}, flags...)...); err != nil {
		return err
	}

	step("Building kubelift's hash-skip kubelet %s (upstream's, plus the hash-skip file; make kubelet)", version)
	kubelet, err := kube.HashSkipKubelet(ctx, version)
	if err != nil {
		return err
	}
	fmt.Println(kubelet)

	step("Bundling Kubernetes %s into a signed, self-extracting installer (every platform, so index digests survive the import)", version)
	out := filepath.Join(work, "k8s-"+version+"-linux-amd64.run")
	args := append([]string{"create", "--kubernetes-version", version, "--sign-key", key + ".key", "--format", "run", "-o", out,
		"--all-platforms", "--kubelet-binary", kubelet, "--cache-dir", filepath.Join(work, "cache")}, flags...)
	if err := shIn(sb, sb.Internet.NetNS, "", filepath.Join(bin, "bundle"), args...); err != nil {
		return err
	}

	step("Inside the air gap: what the bundle holds")
	if err := sh(out, "--help"); err != nil {
		return err
	}
	if err := sh(filepath.Join(bin, "bundle"), "inspect", out); err != nil {
		return err
	}

	step("Verifying with the team's public key, then unpacking")
	if err := sh(out, "--verify", "--key", key+".pub"); err != nil {
		return err
	}
	if err := sh(out, "--extract", filepath.Join(work, "extracted"), "--key", key+".pub"); err != nil {
		return err
	}
	if err := sh("openssl", "dgst", "-sha256", "-verify", key+".pub", "-signature",
		filepath.Join(work, "extracted", "bundle.json.sig"), filepath.Join(work, "extracted", "bundle.json")); err != nil {
		return err
	}

	step("A tampered copy is refused, naming the entry")
	data, err := os.ReadFile(out)
	if err != nil {
		return err
	}
	data[len(data)/3] ^= 1
	bad := filepath.Join(work, "tampered.run")
	if err := os.WriteFile(bad, data, 0o755); err != nil {
		return err
	}
	if err := sh(bad, "--verify", "--key", key+".pub"); err == nil {
		return fmt.Errorf("the tampered bundle verified")
	}
	fmt.Println("(refused, as it should be)")

	kubectl := filepath.Join(sb.Binaries.Old, "kubectl")
	kc := filepath.Join(sb.Dir, "kubeconfig")
	step("Inside the air gap: the cluster to upgrade (make sandbox-up: real etcd, control plane and kubelets %s)", sb.OldVersion)
	fmt.Println("(commands below marked [admin] run on the sandbox's admin machine, the bastion inside the air gap)")
	if err := shAdmin(sb, "", kubectl, "--kubeconfig", kc, "get", "nodes", "-o", "wide"); err != nil {
		return err
	}
	if err := shAdmin(sb, "", kubectl, "--kubeconfig", kc, "-n", sandbox.WorkloadNamespace, "get", "pods", "-o", "wide"); err != nil {
		return err
	}
	priv := sb.Registry
	fmt.Printf("private registry %s (docker-registry, TLS from the sandbox CA %s, htpasswd user %s)\n", priv.Address, priv.CAFile, priv.User)

	step("Importing: ./%s --upgrade ... (pushes images, binaries and their zstd copies, records the version, and the nodes pull their binaries from the registry)", filepath.Base(out))
	importArgs := []string{"--upgrade", "--key", key + ".pub", "--domain", priv.Address, "--namespace", "library",
		"--username", priv.User, "--password-stdin", "--ca-file", priv.CAFile, "--kubeconfig", kc}
	// The sandbox's registry takes a password (htpasswd), which nodes are
	// handed only when asked: without it they are sent their files over SSH.
	sshArgs := []string{"--inventory", filepath.Join(sb.Dir, "inventory.yaml"), "--cache-dir", filepath.Join(work, "stage-cache"), "--node-credentials", "password"}
	if err := shAdmin(sb, priv.Password+"\n", out, append(importArgs, sshArgs...)...); err != nil {
		return err
	}
	step("Importing again: everything is there, nothing is sent")
	if err := shAdmin(sb, priv.Password+"\n", out, append(importArgs, "-q")...); err != nil {
		return err
	}
	step("A wrong password is a clear error")
	if err := shAdmin(sb, "not-the-password\n", out, append(importArgs, "-q")...); err == nil {
		return fmt.Errorf("a wrong password was accepted")
	}
	step("The cluster now knows %s is available", version)
	if err := shAdmin(sb, "", kubectl, "--kubeconfig", kc, "-n", "kube-system", "get", "configmaps", "-l", "app.kubernetes.io/managed-by=kubelift", "-L", "kubelift.dev/kubernetes-version"); err != nil {
		return err
	}

	step("Why in-place kubelet upgrades restart containers: a running pod, hashed as two kubelets hash it")
	pod := filepath.Join(work, "pod.yaml")
	fmt.Printf("[admin]$ kubectl -n %s get pod batch-legacy -o yaml > pod.yaml\n", sandbox.WorkloadNamespace)
	podYAML, err := sb.NetNS().Command(kubectl, "--kubeconfig", kc, "-n", sandbox.WorkloadNamespace, "get", "pod", "batch-legacy", "-o", "yaml").Output()
	if err != nil {
		return fmt.Errorf("kubectl get pod: %w", err)
	}
	if err := os.WriteFile(pod, podYAML, 0o644); err != nil {
		return err
	}
	for _, v := range []string{sb.OldVersion, sb.NewVersion} {
		if err := sh(filepath.Join(bin, "upgrade"), "compat", "hash", "--kubelet-version", v, "-f", pod); err != nil {
			return err
		}
	}
	if err := showRecordedHashes(ctx, sb, podYAML); err != nil {
		return err
	}
	fmt.Printf("(the runtime holds the %s kubelet's hashes; a %s kubelet computes others and restarts every container;\n", sb.OldVersion, sb.NewVersion)
	fmt.Println(" kubelift's hash-skip kubelet keeps them running: see README, \"Kubelet upgrades without container restarts\")")

	step("Naming the cluster once: a kubelift context (its kubeconfig, registry, key and nodes; never the password)")
	// The demo's own config file, not the user's.
	if err := os.Setenv("KUBELIFT_CONFIG", filepath.Join(work, "kubelift-config.yaml")); err != nil {
		return err
	}
	// The context names the cluster: a KUBECONFIG of the user's would win.
	if err := os.Unsetenv("KUBECONFIG"); err != nil {
		return err
	}
	fmt.Printf("[admin]$ export KUBELIFT_CONFIG=%s\n", filepath.Join(work, "kubelift-config.yaml"))
	if err := shAdmin(sb, "", filepath.Join(bin, "upgrade"), "config", "set-context", "sandbox", "--kubeconfig", kc, "--domain", priv.Address, "--namespace", "library",
		"--username", priv.User, "--password-stdin", "--ca-file", priv.CAFile, "--key", key+".pub", "--inventory", filepath.Join(sb.Dir, "inventory.yaml")); err != nil {
		return err
	}
	if err := shAdmin(sb, "", filepath.Join(bin, "upgrade"), "config", "get-contexts"); err != nil {
		return err
	}
	step("Versions, as the nodes run them now")
	if err := shAdmin(sb, "", filepath.Join(bin, "upgrade"), "versions"); err != nil {
		return err
	}
	step("Staging again (upgrade stage, from the registry): every file is there, nothing is sent")
	if err := shAdmin(sb, priv.Password+"\n", filepath.Join(bin, "upgrade"), "stage", "--to", version, "-q", "--cache-dir", filepath.Join(work, "stage-cache"), "--node-credentials", "password"); err != nil {
		return err
	}
	step("The plan: what upgrading to %s would do, read from the API and every node; nothing is changed", version)
	switch err := shAdmin(sb, priv.Password+"\n", filepath.Join(bin, "upgrade"), "plan", "--to", version, "-q"); {
	case err == nil:
		fmt.Println("(nothing blocks: this sandbox was upgraded before; make sandbox-down, then make demo, for a fresh one)")
	default:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 4 {
			return fmt.Errorf("plan: %w", err)
		}
		fmt.Println("(exit 4: blocked, as it should be: pinned-ssd would be rejected by its restarted kubelet; apply --restore-labels will fix it)")
	}

	before, err := runningContainers(ctx, sb)
	if err != nil {
		return err
	}
	targets, err := sb.ProbeTargets(ctx)
	if err != nil {
		return err
	}
	probe, err := prober.Start(ctx, prober.Config{Targets: targets, Rate: 10, Streams: 1})
	if err != nil {
		return err
	}
	fmt.Printf("probing %d targets (the Service shop/api from every worker, every shop pod by its address), 10 requests a second each and a held /stream connection, while the cluster is upgraded\n", len(targets))
	step("Applying: tolerations and labels first, then the control plane, then every kubelet and kube-proxy, each verified")
	if err := shAdmin(sb, priv.Password+"\n", filepath.Join(bin, "upgrade"), "apply", "--to", version, "--restore-labels", "--settle", "5s", "--cache-dir", filepath.Join(work, "stage-cache")); err != nil {
		probe.Stop()
		return err
	}
	avail := probe.Stop()
	step("Availability while the cluster was upgraded (%s)", avail.Ended.Sub(avail.Started).Round(time.Second))
	if err := avail.WriteTable(os.Stdout); err != nil {
		return err
	}
	for _, f := range avail.Failures {
		fmt.Printf("  %s %s at %s: %s\n", f.Target, f.Kind, f.At.Format("15:04:05.000"), f.Error)
	}
	if avail.Disrupted() {
		return fmt.Errorf("%d requests failed or connections broke while the cluster was upgraded", len(avail.Failures))
	}
	step("Status, and the cluster after the upgrade")
	if err := shAdmin(sb, "", filepath.Join(bin, "upgrade"), "status"); err != nil {
		return err
	}
	if err := shAdmin(sb, "", kubectl, "--kubeconfig", kc, "get", "nodes"); err != nil {
		return err
	}
	if err := shAdmin(sb, "", kubectl, "--kubeconfig", kc, "-n", sandbox.WorkloadNamespace, "get", "pods", "-o", "wide"); err != nil {
		return err
	}
	after, err := runningContainers(ctx, sb)
	if err != nil {
		return err
	}
	// Workloads must all be kept; in kube-system, kubeadm replaces the
	// static control-plane pods and kube-proxy's by design (the plan said
	// so), and a kubelet of another minor recreates static pods.
	kept, system, systemKept := 0, 0, 0
	for id, ns := range before {
		switch {
		case ns == "kube-system":
			system++
			if after[id] != "" {
				systemKept++
			}
		case after[id] != "":
			kept++
		}
	}
	workloads := len(before) - system
	fmt.Printf("workload containers on every node (crictl ps over SSH): %d before, %d of them still running after, with the same IDs: %d restarted\n",
		workloads, kept, workloads-kept)
	if system > 0 {
		fmt.Printf("kube-system: %d of %d containers replaced, as the plan said (static pods recreated; on a kubeadm cluster its control plane and kube-proxy's rollout)\n", system-systemKept, system)
	}
	if kept != workloads {
		return fmt.Errorf("%d workload containers restarted", workloads-kept)
	}
	step("Applying again: every node runs %s, nothing to do", version)
	if err := shAdmin(sb, priv.Password+"\n", filepath.Join(bin, "upgrade"), "apply", "--to", version, "-q"); err != nil {
		return err
	}

	step("Done. Files are in %s; the sandbox runs on (make sandbox-down removes it).", work)
	return nil
}

// runningContainers reads every node's running containers over SSH, as
// kubelift does: ID -> the pod's namespace.
func runningContainers(ctx context.Context, sb *sandbox.State) (map[string]string, error) {
	ids := map[string]string{}
	for _, m := range sb.Nodes() {
		cs, err := sb.Containers(ctx, m.Name)
		if err != nil {
			return nil, err
		}
		for _, rc := range cs {
			if rc.Running {
				ids[rc.ID] = rc.Namespace
			}
		}
	}
	return ids, nil
}

// shAdmin is sh on the sandbox's admin machine, with standard input.
func shAdmin(sb *sandbox.State, stdin, name string, args ...string) error {
	return shIn(sb, sb.Admin().NetNS, stdin, name, args...)
}

// shIn is sh in one of the sandbox's network namespaces (the admin
// machine inside the air gap, or the stand-in internet outside it).
func shIn(sb *sandbox.State, netns, stdin, name string, args ...string) error {
	shown := append([]string{filepath.Base(name)}, args...)
	for i, a := range shown {
		if strings.HasPrefix(a, sb.Dir+"/") {
			shown[i] = "$SANDBOX" + strings.TrimPrefix(a, sb.Dir)
		}
	}
	where := "admin"
	if netns == sb.Internet.NetNS {
		where = "internet"
	}
	if stdin != "" {
		fmt.Printf("[%s]$ echo ... | %s\n", where, strings.Join(shown, " "))
	} else {
		fmt.Printf("[%s]$ %s\n", where, strings.Join(shown, " "))
	}
	cmd := (&kube.NetNS{Name: netns}).Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// showRecordedHashes prints the hashes the running kubelet recorded for
// the pod's containers, read from its node's container runtime.
func showRecordedHashes(ctx context.Context, sb *sandbox.State, podYAML []byte) error {
	var p struct {
		Metadata struct{ Name string }
		Spec     struct {
			NodeName string `json:"nodeName"`
		}
	}
	if err := yaml.Unmarshal(podYAML, &p); err != nil {
		return err
	}
	m, err := sb.Machine(p.Spec.NodeName)
	if err != nil {
		return err
	}
	rcs, err := sb.Containers(ctx, m.Name)
	if err != nil {
		return err
	}
	for _, rc := range rcs {
		if rc.Pod == p.Metadata.Name && rc.Running {
			fmt.Printf("recorded by the running kubelet on %s: %s/%s hash %s\n", m.Name, rc.Pod, rc.Name, rc.Hash)
		}
	}
	return nil
}
