package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/test/env/kube"
	"github.com/kubelift/kubelift/test/env/prober"
	"github.com/kubelift/kubelift/test/env/sandbox"
)

// benchEngine measures staging and planning on a sandbox of its own (1
// control plane, 3 workers on containerd 1.7, real sshd): kubelift stage
// (fetch from the registry, check, compress once, send compressed, check
// on the node) against scp of the same files to the same nodes, and the
// plan; then the whole upgrade, each node's containerd moved to 2.x by
// the node stack in the bundle before its kubelet.
func benchEngine(ctx context.Context, work, bin, key string) error {
	cfg := sandbox.Config{Dir: filepath.Join(work, "sandbox"), Name: fmt.Sprintf("klb%d", os.Getpid()%1000), Subnet: "10.83.0",
		Workers: 3, Tool: filepath.Join(work, "kubelift-sandbox"), Workloads: true, RuntimeVersion: kube.Containerd17}
	if out, err := exec.Command("go", "build", "-o", cfg.Tool, "./test/env/sandbox/cmd/kubelift-sandbox").CombinedOutput(); err != nil {
		return fmt.Errorf("build kubelift-sandbox: %v\n%s", err, out)
	}
	cfg.Defaults()
	// Up once (building or finding what it needs), down, and up again:
	// the second is sandbox-up warm, as a developer's second make
	// sandbox-up.
	if _, err := sandbox.Up(ctx, cfg); err != nil {
		_ = sandbox.Down(ctx, cfg.Dir, nil)
		return err
	}
	if err := sandbox.Down(ctx, cfg.Dir, nil); err != nil {
		return err
	}
	began := time.Now()
	sb, err := sandbox.Up(ctx, cfg)
	if err != nil {
		_ = sandbox.Down(ctx, cfg.Dir, nil)
		return err
	}
	took := time.Since(began)
	defer sandbox.Down(ctx, cfg.Dir, nil)
	mem, err := sb.Memory()
	if err != nil {
		return err
	}
	fmt.Printf("\nsandbox-up, warm (1 control plane + 3 workers on containerd %s, the shop's workloads running)\n", kube.Containerd17)
	fmt.Printf("%-44s %8.1fs  %.2fx the 60 s budget\n", "up until every shop pod runs", took.Seconds(), took.Seconds()/60)
	fmt.Printf("%-44s %8.0f MiB in %d processes\n", "summed RSS of the sandbox's processes", float64(mem.RSS)/(1<<20), mem.Processes)
	admin := sb.Admin().Net()
	inAdmin := func(name string, args ...string) (string, measure, error) {
		cmd := admin.Command(name, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(sb.Dir, "kubeconfig"), "KUBELIFT_CACHE_DIR="+filepath.Join(work, "cache"))
		pw, _ := os.ReadFile(filepath.Join(sb.Dir, "registry", "password"))
		cmd.Stdin = strings.NewReader(string(pw) + "\n")
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		_ = exec.Command("sync").Run()
		start := time.Now()
		err := cmd.Run()
		m := measure{wall: time.Since(start)}
		if err != nil {
			err = fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, errb.String())
		}
		return out.String(), m, err
	}
	hashSkip, err := exec.Command("hack/build-kubelet.sh", sb.NewVersion).Output()
	if err != nil {
		return fmt.Errorf("hack/build-kubelet.sh: %w", err)
	}
	file := filepath.Join(work, "engine-bundle.tar")
	args := append([]string{"create", "--kubernetes-version", sb.NewVersion, "--sign-key", key + ".key", "-o", file, "--cache-dir", filepath.Join(work, "engine-cache"), "-q",
		"--kubelet-binary", strings.TrimSpace(string(hashSkip)), "--node-stack"}, sb.Internet.BundleFlags...)
	if out, err := (&kube.NetNS{Name: sb.Internet.NetNS}).Command(filepath.Join(bin, "bundle"), args...).CombinedOutput(); err != nil {
		return fmt.Errorf("bundle create: %v\n%s", err, out)
	}
	reg := []string{"--username", sb.Registry.User, "--password-stdin", "--ca-file", sb.Registry.CAFile}
	ssh := []string{"--ssh-key", filepath.Join(sb.Dir, "ssh", "id_ed25519"), "--known-hosts", filepath.Join(sb.Dir, "ssh", "known_hosts")}
	if _, _, err := inAdmin(filepath.Join(bin, "upgrade"), append([]string{"import", file, "--key", key + ".pub", "--domain", sb.Registry.Address, "--namespace", "library", "-q"}, reg...)...); err != nil {
		return err
	}
	// The files each node gets, extracted, for scp.
	files := filepath.Join(work, "engine-extracted")
	if _, err := runCmd(filepath.Join(bin, "bundle"), "extract", "--key", key+".pub", file, files); err != nil {
		return err
	}
	for _, link := range append([]string{""}, strings.Split(*linkRate, ",")...) {
		if link != "" {
			// Each node's link from the admin machine (its bridge port) at
			// a real network's rate, as a switch port would be.
			for _, n := range sb.Nodes() {
				if out, err := admin.Command("tc", "qdisc", "replace", "dev", "v-"+n.Name, "root", "tbf", "rate", link, "burst", "1mb", "latency", "100ms").CombinedOutput(); err != nil {
					return fmt.Errorf("tc on v-%s: %v %s", n.Name, err, out)
				}
			}
		}
		if err := stageRounds(work, bin, key, sb, file, files, link, reg, ssh, inAdmin); err != nil {
			return err
		}
	}
	for _, n := range sb.Nodes() {
		_ = admin.Command("tc", "qdisc", "del", "dev", "v-"+n.Name, "root").Run()
	}
	if err := benchFleetBytes(work, bin, key, sb, reg, ssh, inAdmin); err != nil {
		return err
	}
	return benchApply(bin, key, sb, reg, ssh, inAdmin)
}

// benchApply upgrades the sandbox once (it changes it: one round) and
// splits the time between waiting for restarted components (the restarts
// themselves), the verification pauses, and the engine's own work.
func benchApply(bin, key string, sb *sandbox.State, reg, ssh []string, inAdmin adminRunner) error {
	targets, err := sb.ProbeTargets(context.Background())
	if err != nil {
		return err
	}
	// The binaries staged beforehand, as import (or stage) leaves them:
	// apply's own work is then the engine's, not the copying.
	if _, _, err := inAdmin(filepath.Join(bin, "upgrade"), append(append([]string{"stage", "--to", sb.NewVersion, "--key", key + ".pub", "-q",
		"--node-credentials", "password"}, reg...), ssh...)...); err != nil {
		return err
	}
	probe, err := prober.Start(context.Background(), prober.Config{Targets: targets, Rate: 10, Streams: 1})
	if err != nil {
		return err
	}
	out, m, err := inAdmin(filepath.Join(bin, "upgrade"), append(append([]string{"apply", "--to", sb.NewVersion, "--key", key + ".pub", "-o", "json", "-q",
		"--restore-labels", "--settle", "5s", "--node-credentials", "password"}, reg...), ssh...)...)
	avail := probe.Stop()
	if err != nil {
		return err
	}
	var res inplace.ApplyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return err
	}
	if res.State == nil || res.State.State != record.StateComplete {
		return fmt.Errorf("apply did not complete: %s", out)
	}
	total := m.wall.Seconds()
	own := total - res.Waiting - res.Settling
	fmt.Printf("\nthe whole upgrade, %s -> %s, 1 control plane + 3 workers, --max-unavailable 1, --settle 5s, the binaries staged beforehand (one round: it changes the sandbox)\n", sb.OldVersion, sb.NewVersion)
	fmt.Printf("%-44s %8.1fs\n", "kubelift apply, wall time", total)
	for _, s := range res.Steps {
		fmt.Printf("  %-42s %8.1fs\n", s.Name, s.Seconds)
	}
	// Each unit's restarts (by the node's clock): containerd's, moved
	// under running containers, beside the kubelet's.
	byUnit := map[string][]float64{}
	var units []string
	for _, rs := range res.Restarts {
		if _, seen := byUnit[rs.Unit]; !seen {
			units = append(units, rs.Unit)
		}
		byUnit[rs.Unit] = append(byUnit[rs.Unit], rs.Seconds)
	}
	for _, u := range units {
		ts := byUnit[u]
		sort.Float64s(ts)
		fmt.Printf("  %-42s %8.2fs median, %.2fs longest, on %d nodes\n", u+"'s restart in its swap", ts[len(ts)/2], ts[len(ts)-1], len(ts))
	}
	fmt.Printf("%-44s %8.1fs %5.0f %%\n", "waiting for restarted components", res.Waiting, 100*res.Waiting/total)
	fmt.Printf("%-44s %8.1fs %5.0f %%\n", "verification pauses (--settle)", res.Settling, 100*res.Settling/total)
	fmt.Printf("%-44s %8.1fs %5.0f %%  (%.2fx the restarts and pauses alone)\n", "the engine's own work (SSH, API, checks)", own, 100*own/total, total/(res.Waiting+res.Settling))
	requests, failed, broken := 0, 0, 0
	for _, t := range avail.Targets {
		requests, failed, broken = requests+t.Requests, failed+t.Failed, broken+t.Broken
	}
	var gap time.Duration
	for _, t := range avail.Targets {
		gap = max(gap, t.LongestGap)
	}
	fmt.Printf("\navailability while it ran: %d requests to %d targets (the Service from every worker, every shop pod), %d failed, %d held connections broken (the allowance: none); the longest time a target went without an answer: %s (one request every %s)\n",
		requests, len(avail.Targets), failed, broken, gap.Round(time.Millisecond), time.Second/10)
	if err := avail.WriteTable(os.Stdout); err != nil {
		return err
	}
	if avail.Disrupted() {
		return fmt.Errorf("the upgrade disrupted the workloads: %d requests failed, %d connections broke (first: %+v)", failed, broken, avail.Failures[0])
	}
	return nil
}

type adminRunner func(name string, args ...string) (string, measure, error)

// benchFleetBytes measures what this machine sends for 40 nodes pulling:
// ten stages of the 4 nodes, each into a directory of its own (removed
// at once, so that the nodes' disks, the host's, do not write 10 GB back
// under the next measurement), against 4 nodes, and against SSH's bytes.
func benchFleetBytes(work, bin, key string, sb *sandbox.State, reg, ssh []string, inAdmin adminRunner) error {
	admin := sb.Admin().Net()
	stage := func(dir string, extra ...string) (*stage.Result, error) {
		args := append(append(append([]string{"stage", "--to", sb.NewVersion, "--key", key + ".pub", "-o", "json", "-q", "--stage-dir", dir,
			"--cache-dir", filepath.Join(work, "stage-cache-fleet"), "--node-credentials", "password"}, reg...), ssh...), extra...)
		out, _, err := inAdmin(filepath.Join(bin, "upgrade"), args...)
		if err != nil {
			return nil, err
		}
		var res stage.Result
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			return nil, err
		}
		for _, n := range sb.Nodes() {
			_ = admin.Command("ssh", "-i", filepath.Join(sb.Dir, "ssh", "id_ed25519"), "-o", "UserKnownHostsFile="+filepath.Join(sb.Dir, "ssh", "known_hosts"),
				"-o", "BatchMode=yes", "root@"+n.Address, "rm -rf "+dir).Run()
		}
		return &res, nil
	}
	var wire4, wire40 int64
	for j := 0; j < 10; j++ {
		res, err := stage(fmt.Sprintf("/var/lib/kubelift/bench-fleet-%d", j))
		if err != nil {
			return err
		}
		if j == 0 {
			wire4 = res.WireBytes
		}
		wire40 += res.WireBytes
	}
	push, err := stage("/var/lib/kubelift/bench-fleet-ssh", "--via", "ssh")
	if err != nil {
		return err
	}
	fmt.Printf("\nwhat this machine sends (on the wire) as the fleet grows, the nodes pulling from the registry\n")
	fmt.Printf("%-44s %9.2f MB  %.1f KB per node\n", "4 nodes pulling", float64(wire4)/1e6, float64(wire4)/4/1e3)
	fmt.Printf("%-44s %9.2f MB  %.1f KB per node\n", "40 nodes pulling (ten stages of 4)", float64(wire40)/1e6, float64(wire40)/40/1e3)
	fmt.Printf("%-44s %9.2f MB  (40 nodes: %.0f MB)\n", "4 nodes sent their files over SSH (zstd)", float64(push.WireBytes)/1e6, float64(push.WireBytes)*10/1e6)
	return nil
}

// stageRounds measures stage against scp, and the plan, over links of one
// kind: stage as it chooses (every node reaches the registry: they pull),
// stage --via ssh (this machine sends the registry's zstd copies), and
// stage --via ssh from the bundle file (this machine encodes, or not, as
// it measures), each with a cold cache.
func stageRounds(work, bin, key string, sb *sandbox.State, bundleFile, files, link string, reg, ssh []string, inAdmin adminRunner) error {
	admin := sb.Admin().Net()
	tag := link
	if tag == "" {
		tag = "loopback"
	}
	var st, push, fromFile, again, sc, pl []measure
	forced := map[string][]measure{}
	var size, scpBytes int64
	var pulled, pushed, encoded *stage.Result
	stageOnce := func(dir, cache string, extra ...string) (*stage.Result, measure, error) {
		args := append(append(append([]string{"stage", "--to", sb.NewVersion, "--key", key + ".pub", "-o", "json", "-q", "--stage-dir", dir,
			"--cache-dir", cache, "--node-credentials", "password"}, reg...), ssh...), extra...)
		out, m, err := inAdmin(filepath.Join(bin, "upgrade"), args...)
		if err != nil {
			return nil, m, err
		}
		var res stage.Result
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			return nil, m, err
		}
		return &res, m, nil
	}
	for i := 0; i < *rounds; i++ {
		dir := fmt.Sprintf("/var/lib/kubelift/bench-%s-%d", tag, i)
		res, m, err := stageOnce(dir, filepath.Join(work, fmt.Sprintf("stage-cache-%s-%d", tag, i)))
		if err != nil {
			return err
		}
		st, pulled = append(st, m), res
		_, size = res.BytesSent()
		for _, n := range res.Nodes {
			if n.Path != stage.ViaRegistry {
				return fmt.Errorf("%s was staged %s (%s), not by a pull from the registry", n.Node, n.Path, n.PathReason)
			}
		}
		if _, m, err = stageOnce(dir, filepath.Join(work, fmt.Sprintf("stage-cache-%s-%d", tag, i))); err != nil {
			return err
		}
		again = append(again, m)
		res, m, err = stageOnce(dir+"-ssh", filepath.Join(work, fmt.Sprintf("stage-cache-ssh-%s-%d", tag, i)), "--via", "ssh")
		if err != nil {
			return err
		}
		push, pushed = append(push, m), res
		res, m, err = stageOnce(dir+"-file", filepath.Join(work, fmt.Sprintf("stage-cache-file-%s-%d", tag, i)), "--via", "ssh", bundleFile)
		if err != nil {
			return err
		}
		fromFile, encoded = append(fromFile, m), res
		// What auto chose between, forced.
		for _, c := range []string{stage.CodecZstd, stage.CodecNone} {
			_, m, err = stageOnce(dir+"-file-"+c, filepath.Join(work, fmt.Sprintf("stage-cache-file-%s-%s-%d", c, tag, i)), "--via", "ssh", "--codec", c, bundleFile)
			if err != nil {
				return err
			}
			forced[c] = append(forced[c], m)
		}
		// scp: the same files to the same nodes, every node at once.
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, len(sb.Nodes()))
		scpBytes = 0
		for _, n := range sb.Nodes() {
			role := release.RoleWorker
			if n.Role == "control-plane" {
				role = release.RoleControlPlane
			}
			var paths []string
			for _, f := range release.FilesFor(role) {
				p := filepath.Join(files, "bin", "linux", "amd64", f)
				if fi, err := os.Stat(p); err == nil {
					paths = append(paths, p)
					scpBytes += fi.Size()
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				target := fmt.Sprintf("root@%s:/var/lib/kubelift/scp-%s-%d/", n.Address, tag, i)
				sshOpts := []string{"-i", filepath.Join(sb.Dir, "ssh", "id_ed25519"), "-o", "UserKnownHostsFile=" + filepath.Join(sb.Dir, "ssh", "known_hosts"), "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"}
				if out, err := admin.Command("ssh", append(sshOpts, "root@"+n.Address, fmt.Sprintf("mkdir -p /var/lib/kubelift/scp-%s-%d", tag, i))...).CombinedOutput(); err != nil {
					errs <- fmt.Errorf("ssh %s: %v %s", n.Name, err, out)
					return
				}
				if out, err := admin.Command("scp", append(append(sshOpts, "-q"), append(paths, target)...)...).CombinedOutput(); err != nil {
					errs <- fmt.Errorf("scp %s: %v %s", n.Name, err, out)
				}
			}()
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
		sc = append(sc, measure{wall: time.Since(start)})
		plan := append(append([]string{"plan", "--to", sb.NewVersion, "--key", key + ".pub", "-o", "json", "-q"}, reg...), ssh...)
		_, m, err = inAdmin(filepath.Join(bin, "upgrade"), plan...)
		if err != nil && !strings.Contains(err.Error(), "exit status 4") {
			return err
		}
		pl = append(pl, m)
		// The round's copies go: a node's disk is the host's.
		for _, n := range sb.Nodes() {
			_ = admin.Command("ssh", "-i", filepath.Join(sb.Dir, "ssh", "id_ed25519"), "-o", "UserKnownHostsFile="+filepath.Join(sb.Dir, "ssh", "known_hosts"),
				"-o", "BatchMode=yes", "root@"+n.Address, fmt.Sprintf("rm -rf %[1]s %[1]s-ssh %[1]s-file %[1]s-file-zstd %[1]s-file-none /var/lib/kubelift/scp-%[2]s-%[3]d", dir, tag, i)).Run()
		}
	}
	mb := float64(size) / 1e6
	fmt.Printf("\nthe engine on a sandbox (1 control plane + 3 workers, real sshd; links: %s), %s binaries: %.1f MB to stage in all, %d rounds (medians)\n",
		tag, sb.NewVersion, mb, *rounds)
	fmt.Printf("%-44s %9s %9s %12s %12s %s\n", "staging (every node)", "time", "MB/s", "admin sent", "node pulled", "kubelift / scp")
	s, p, a, c := median(st), median(push), median(again), median(sc)
	var pulledBytes, pushedBytes int64
	for _, n := range pulled.Nodes {
		pulledBytes += n.BytesPulled
	}
	for _, n := range pushed.Nodes {
		pushedBytes += n.BytesSent
	}
	fmt.Printf("%-44s %8.2fs %9.0f %9.1f MB %9.1f MB %.2fx time, %.3fx admin bytes\n", "kubelift stage: the nodes pull (registry)", s.wall.Seconds(), mb/s.wall.Seconds(),
		float64(pulled.WireBytes)/1e6, float64(pulledBytes)/1e6, s.wall.Seconds()/c.wall.Seconds(), float64(pulled.WireBytes)/float64(scpBytes))
	fmt.Printf("%-44s %8.2fs %9.0f %9.1f MB %9.1f MB %.2fx time, %.2fx admin bytes\n", "kubelift stage --via ssh (relayed, cold)", p.wall.Seconds(), mb/p.wall.Seconds(),
		float64(pushed.WireBytes)/1e6, 0.0, p.wall.Seconds()/c.wall.Seconds(), float64(pushed.WireBytes)/float64(scpBytes))
	codecs := map[string]bool{}
	for _, n := range encoded.Nodes {
		codecs[n.Codec+": "+n.CodecReason] = true
	}
	f := median(fromFile)
	fmt.Printf("%-44s %8.2fs %9.0f %9.1f MB %9.1f MB %.2fx time, %.2fx admin bytes\n", "kubelift stage --via ssh FILE (codec auto)", f.wall.Seconds(), mb/f.wall.Seconds(),
		float64(encoded.WireBytes)/1e6, 0.0, f.wall.Seconds()/c.wall.Seconds(), float64(encoded.WireBytes)/float64(scpBytes))
	for c := range codecs {
		fmt.Printf("  %s\n", c)
	}
	for _, enc := range []string{stage.CodecZstd, stage.CodecNone} {
		m := median(forced[enc])
		fmt.Printf("%-44s %8.2fs %9.0f %24s %.2fx time\n", "  the same, --codec "+enc, m.wall.Seconds(), mb/m.wall.Seconds(), "", m.wall.Seconds()/c.wall.Seconds())
	}
	fmt.Printf("%-44s %8.2fs %9.0f %9.1f MB\n", "scp of the same files (all nodes at once)", c.wall.Seconds(), float64(scpBytes)/1e6/c.wall.Seconds(), float64(scpBytes)/1e6)
	fmt.Printf("%-44s %8.2fs %9s %9.1f MB\n", "kubelift stage again (everything staged)", a.wall.Seconds(), "-", 0.0)
	fmt.Printf("%-44s %8.2fs\n", "kubelift plan (API + every node over SSH)", median(pl).wall.Seconds())
	return nil
}
