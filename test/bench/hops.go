package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kubelift/kubelift/test/env/kube"
	"github.com/kubelift/kubelift/test/env/prober"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

var (
	hopsFrom   = flag.String("hops-from", "v1.30.14", "hops: the version the sandbox starts at")
	hopsTarget = flag.String("hops-target", "v1.33.13", "hops: the version it is upgraded to, several minors ahead")
)

// benchHops measures one multi-hop apply against hop-by-hop applies of
// the same sandbox (1 control plane, 2 workers on containerd, the shop
// running), brought up anew for each: wall time, and kubelet starts per
// node counted from each kubelet's own log over SSH (its "Kubelet
// version" line, written once per start).
func benchHops(ctx context.Context, work, bin, key string) error {
	cfg := sandbox.Config{Dir: filepath.Join(work, "hops-sandbox"), Name: fmt.Sprintf("kbh%d", os.Getpid()%1000), Subnet: "10.91.0",
		Workers: 2, Tool: filepath.Join(work, "kubelift-sandbox"), Workloads: true, OldVersion: *hopsFrom, NewVersion: *hopsTarget, FullHops: true}
	if out, err := exec.Command("go", "build", "-o", cfg.Tool, "./test/env/sandbox/cmd/kubelift-sandbox").CombinedOutput(); err != nil {
		return fmt.Errorf("build kubelift-sandbox: %v\n%s", err, out)
	}
	cfg.Defaults()
	type run struct {
		name    string
		wall    time.Duration
		starts  map[string]int
		applies int
	}
	var runs []run
	for _, multi := range []bool{true, false} {
		sb, err := sandbox.Up(ctx, cfg)
		if err != nil {
			_ = sandbox.Down(ctx, cfg.Dir, nil)
			return err
		}
		hops, err := sb.Hops()
		if err != nil {
			_ = sandbox.Down(ctx, cfg.Dir, nil)
			return err
		}
		var steps []string // each apply's target
		if multi {
			steps = []string{sb.NewVersion}
		} else {
			for _, h := range hops {
				steps = append(steps, h.Version)
			}
			steps = append(steps, sb.NewVersion)
		}
		r := run{name: "one apply through the hops", applies: len(steps)}
		if !multi {
			r.name = fmt.Sprintf("%d applies, one minor each", len(steps))
		}
		wall, starts, err := hopRun(ctx, work, bin, key, sb, steps, multi)
		_ = sandbox.Down(ctx, cfg.Dir, nil)
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		r.wall, r.starts = wall, starts
		runs = append(runs, r)
	}
	fmt.Printf("\n%s -> %s, 1 control plane + 2 workers on containerd, --settle 5s; the same sandbox, up anew for each\n", *hopsFrom, *hopsTarget)
	fmt.Printf("%-36s %8s %10s  %s\n", "", "applies", "wall", "kubelet starts per node")
	for _, r := range runs {
		var per []string
		nodes := make([]string, 0, len(r.starts))
		for n := range r.starts {
			nodes = append(nodes, n)
		}
		slices.Sort(nodes)
		for _, n := range nodes {
			per = append(per, fmt.Sprintf("%s %d", n, r.starts[n]))
		}
		fmt.Printf("%-36s %8d %9.1fs  %s\n", r.name, r.applies, r.wall.Seconds(), strings.Join(per, ", "))
	}
	total := func(m map[string]int) int {
		t := 0
		for _, v := range m {
			t += v
		}
		return t
	}
	if total(runs[1].starts) == 0 {
		return fmt.Errorf("hop by hop: no kubelet start counted (no 'Kubelet version' line in the kubelets' logs)")
	}
	fmt.Printf("one multi-hop apply: %.2fx the time and %.2fx the kubelet restarts of hop-by-hop\n",
		runs[0].wall.Seconds()/runs[1].wall.Seconds(), float64(total(runs[0].starts))/float64(total(runs[1].starts)))
	return nil
}

// hopRun bundles, imports and applies each step in turn on sb, with the
// prober running throughout; it returns the applies' summed wall time and
// the kubelet starts each node saw meanwhile.
func hopRun(ctx context.Context, work, bin, key string, sb *sandbox.State, steps []string, multi bool) (time.Duration, map[string]int, error) {
	admin := sb.Admin().Net()
	pw, _ := os.ReadFile(filepath.Join(sb.Dir, "registry", "password"))
	inAdmin := func(name string, args ...string) (time.Duration, error) {
		cmd := admin.Command(name, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(sb.Dir, "kubeconfig"), "KUBELIFT_CACHE_DIR="+filepath.Join(work, "cache"))
		cmd.Stdin = strings.NewReader(string(pw) + "\n")
		var errb strings.Builder
		cmd.Stderr = &errb
		start := time.Now()
		err := cmd.Run()
		if err != nil {
			err = fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, errb.String())
		}
		return time.Since(start), err
	}
	reg := []string{"--username", sb.Registry.User, "--password-stdin", "--ca-file", sb.Registry.CAFile}
	ssh := []string{"--ssh-key", filepath.Join(sb.Dir, "ssh", "id_ed25519"), "--known-hosts", filepath.Join(sb.Dir, "ssh", "known_hosts")}
	starts := func() (map[string]int, error) {
		out := map[string]int{}
		for _, m := range sb.Nodes() {
			c, err := sb.SSH(ctx, m.Name)
			if err != nil {
				return nil, err
			}
			sess, err := c.NewSession()
			if err != nil {
				c.Close()
				return nil, fmt.Errorf("%s: %w", m.Name, err)
			}
			b, err := sess.Output("grep -c 'Kubelet version' /var/log/units/kubelet.log || true")
			c.Close()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", m.Name, err)
			}
			s := string(b)
			if out[m.Name], err = strconv.Atoi(strings.TrimSpace(s)); err != nil {
				return nil, fmt.Errorf("%s: kubelet starts %q: %w", m.Name, s, err)
			}
		}
		return out, nil
	}
	before, err := starts()
	if err != nil {
		return 0, nil, err
	}
	targets, err := sb.ProbeTargets(ctx)
	if err != nil {
		return 0, nil, err
	}
	probe, err := prober.Start(ctx, prober.Config{Targets: targets, Rate: 10, Streams: 1})
	if err != nil {
		return 0, nil, err
	}
	defer probe.Stop()
	var wall time.Duration
	for i, to := range steps {
		hashSkip, err := exec.Command("hack/build-kubelet.sh", to).Output()
		if err != nil {
			return 0, nil, fmt.Errorf("hack/build-kubelet.sh %s: %w", to, err)
		}
		file := filepath.Join(work, fmt.Sprintf("hops-%s.tar", to))
		args := append([]string{"create", "--kubernetes-version", to, "--sign-key", key + ".key", "-o", file, "--cache-dir", filepath.Join(work, "hops-cache"), "-q",
			"--kubelet-binary", strings.TrimSpace(string(hashSkip))}, sb.Internet.BundleFlags...)
		if multi {
			args = append(args, "--from", sb.OldVersion)
		}
		if out, err := (&kube.NetNS{Name: sb.Internet.NetNS}).Command(filepath.Join(bin, "bundle"), args...).CombinedOutput(); err != nil {
			return 0, nil, fmt.Errorf("bundle create %s: %v\n%s", to, err, out)
		}
		if _, err := inAdmin(filepath.Join(bin, "upgrade"), append([]string{"import", file, "--key", key + ".pub", "--domain", sb.Registry.Address, "--namespace", "library", "-q"}, reg...)...); err != nil {
			return 0, nil, err
		}
		took, err := inAdmin(filepath.Join(bin, "upgrade"), append(append([]string{"apply", "--to", to, "--key", key + ".pub", "-q", "--restore-labels", "--settle", "5s"}, reg...), ssh...)...)
		if err != nil {
			return 0, nil, err
		}
		fmt.Fprintf(os.Stderr, "bench: apply %d of %d (to %s): %.1fs\n", i+1, len(steps), to, took.Seconds())
		wall += took
	}
	after, err := starts()
	if err != nil {
		return 0, nil, err
	}
	if avail := probe.Stop(); avail.Disrupted() {
		_ = avail.WriteTable(os.Stderr)
		return 0, nil, fmt.Errorf("the upgrade disrupted the workloads (first: %+v)", avail.Failures[0])
	}
	for n := range after {
		after[n] -= before[n]
	}
	return wall, after, nil
}
