package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/kubelift/kubelift/internal/inplace"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/test/env/simcluster"
	"github.com/kubelift/kubelift/test/stories/scale"
)

var (
	scaleNodes   = flag.String("nodes", "1000", "scale: simulated workers, comma-separated for several runs")
	scaleBatches = flag.String("batches", "50,100", "scale: --max-unavailable values, one upgrade each")
	scaleRestart = flag.Duration("restart", 20*time.Second, "scale: a restarted kubelet is Ready after this long ...")
	scaleJitter  = flag.Duration("jitter", 5*time.Second, "scale: ... plus up to this much more (uniform)")
	scaleSettle  = flag.Duration("settle", time.Second, "scale: apply's --settle")
	scalePods    = flag.Int("pods-per-node", 3, "scale: bare pods per worker (every 4th without tolerations)")
	scaleSample  = flag.Int("stage-sample", 20, "scale: nodes staged for real over SSH (the rest are placed by the fleet)")
	scaleQPS     = flag.Int("kube-qps", 50, "scale: apply's --kube-qps (--kube-burst is twice it)")
	scaleAgentQ  = flag.Int("agent-qps", 100, "scale: apply's --agent-qps through agents (its burst is twice it)")
	scaleLease   = flag.Duration("lease", 40*time.Second, "scale: the simulated nodes' lease duration (longer: less load at rest, for 5000 nodes on 2 cores)")
	scaleVia     = flag.String("via", "ssh,agent", "scale: how apply reaches the nodes, comma-separated for one upgrade each: ssh (the fleet's SSH servers) or agent (kubelift's agent loop per node, answering step requests through the API server)")
)

// benchScale upgrades simulated clusters (KWOK nodes, an SSH fleet, a real
// API server) and compares each run with the ideal schedule for the same
// restart times and window.
func benchScale(ctx context.Context, work string) error {
	ns, err := ints(*scaleNodes)
	if err != nil {
		return err
	}
	bs, err := ints(*scaleBatches)
	if err != nil {
		return err
	}
	if err := benchPlanChecks(ctx); err != nil {
		return err
	}
	fmt.Printf("\n== scale: kubelet restart %s + up to %s, --settle %s, %d pods per worker, client --kube-qps %d (--agent-qps %d through agents), node leases %s ==\n", *scaleRestart, *scaleJitter, *scaleSettle, *scalePods, *scaleQPS, *scaleAgentQ, *scaleLease)
	for _, n := range ns {
		for _, b := range bs {
			for _, via := range strings.Split(*scaleVia, ",") {
				if via != "ssh" && via != "agent" {
					return fmt.Errorf("-via %q: want ssh or agent", via)
				}
				if err := scaleRun(ctx, filepath.Join(work, fmt.Sprintf("scale-%d-%d-%s", n, b, via)), n, b, via == "agent"); err != nil {
					return fmt.Errorf("%d nodes, window %d, via %s: %w", n, b, via, err)
				}
			}
		}
	}
	return nil
}

// cpuSeconds is the CPU time process pid has used so far (its
// /proc/PID/stat's utime and stime, in the kernel's 100 Hz ticks).
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	f := strings.Fields(string(b)[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return (utime + stime) / 100, nil
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q: want positive numbers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// restarts records, per node, how long each kubelet restart kept it
// NotReady, as an informer sees it (what the engine waits on).
type restarts struct {
	mu    sync.Mutex
	down  map[string]time.Time
	took  map[string]time.Duration
	peak  int
	other int
}

func (r *restarts) see(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	ready, restarting := false, false
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = c.Status == corev1.ConditionTrue
			restarting = c.Reason == simcluster.ReasonKubeletRestarting
		}
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.down[n.Name]; ok && ready {
		r.took[n.Name] += now.Sub(t)
		delete(r.down, n.Name)
	} else if !ok && !ready {
		if !restarting {
			// Down for another reason (a lease lapse under load): not a
			// restart, so not part of the ideal; counted and reported.
			r.other++
			return
		}
		r.down[n.Name] = now
	}
	if n.Name != "cp-1" {
		c := 0
		for name := range r.down {
			if name != "cp-1" {
				c++
			}
		}
		r.peak = max(r.peak, c)
	}
}

func scaleRun(ctx context.Context, dir string, nodes, window int, viaAgent bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	upStart := time.Now()
	env, err := scale.Up(ctx, scale.Options{Dir: dir, Workers: nodes, PodsPerNode: *scalePods, NoTolerationsEvery: 4,
		RestartDelay: *scaleRestart, RestartJitter: *scaleJitter, LeaseDuration: *scaleLease, Agent: viaAgent,
		Log: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "  scale: "+format+"\n", args...) }})
	if err != nil {
		return err
	}
	defer env.Close()
	mode := "over SSH"
	if viaAgent {
		mode = "through agents (--via agent)"
	}
	fmt.Printf("\n%d workers + 1 control-plane node, --max-unavailable %d, %s (simulation up in %s)\n", nodes, window, mode, time.Since(upStart).Round(time.Second))
	pw := env.Registry.Password + "\n"
	qps := []string{"--kube-qps", fmt.Sprint(*scaleQPS), "--kube-burst", fmt.Sprint(2 * *scaleQPS), "--parallel", "50"}
	if viaAgent {
		stop, err := env.ServeAgents(ctx)
		if err != nil {
			return err
		}
		defer stop()
		qps = append(qps, "--agent-qps", fmt.Sprint(*scaleAgentQ))
		if err := agentPlan(ctx, env, window, pw, qps); err != nil {
			return err
		}
	} else if err := sshStageAndPlan(ctx, env, window, pw, qps); err != nil {
		return err
	}
	return measureApply(ctx, env, nodes, window, pw, qps, viaAgent)
}

// agentPlan places the files on every node (agent mode stages from the
// registry, which the simulation's nodes do not play) and plans through
// the agents.
func agentPlan(ctx context.Context, env *scale.Env, window int, pw string, qps []string) error {
	if err := env.PreStage(0); err != nil {
		return err
	}
	r := env.Upgrade(ctx, pw, env.AgentArgs("plan", append([]string{"-o", "json", "--max-unavailable", fmt.Sprint(window)}, qps...)...)...)
	if r.Code != 0 && r.Code != 4 {
		return fmt.Errorf("plan --via agent: %w", r.Err)
	}
	fmt.Printf("  plan: %s wall, %.1f s CPU, %d MB peak RSS\n", r.Wall.Round(100*time.Millisecond), r.CPU.Seconds(), r.MaxRSS>>10)
	return nil
}

// sshStageAndPlan stages a sample of nodes over SSH for real (the fleet
// places the rest) and plans over SSH.
func sshStageAndPlan(ctx context.Context, env *scale.Env, window int, pw string, qps []string) error {

	// Staging: a sample over SSH for real, the rest placed by the fleet.
	if err := env.PreStage(*scaleSample); err != nil {
		return err
	}
	r := env.Upgrade(ctx, pw, append(append(append([]string{"stage", "--to", scale.To, "--key", env.Key, "-o", "json"}, env.RegistryFlags()...), env.NodeFlags()...), qps...)...)
	if r.Err != nil {
		return r.Err
	}
	var st stage.Result
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		return fmt.Errorf("stage -o json: %w", err)
	}
	var sent, size int64
	staged := 0
	for _, n := range st.Nodes {
		if n.BytesSent > 0 {
			staged++
			sent += n.BytesSent
			size += n.Bytes
		}
	}
	if staged > 0 {
		fmt.Printf("  stage: %d nodes sent files, %d already had them; per node %.1f MB sent for %.1f MB of files (%.2fx); %s wall for all %d nodes\n",
			staged, len(st.Nodes)-staged, float64(sent)/float64(staged)/1e6, float64(size)/float64(staged)/1e6, float64(sent)/float64(size), r.Wall.Round(100*time.Millisecond), len(st.Nodes))
	}
	r = env.Upgrade(ctx, pw, append(append(append([]string{"plan", "--to", scale.To, "--key", env.Key, "-o", "json", "--max-unavailable", fmt.Sprint(window)}, env.RegistryFlags()...), env.NodeFlags()...), qps...)...)
	if r.Code != 0 && r.Code != 4 {
		return r.Err
	}
	fmt.Printf("  plan: %s wall, %.1f s CPU, %d MB peak RSS\n", r.Wall.Round(100*time.Millisecond), r.CPU.Seconds(), r.MaxRSS>>10)
	return nil
}

// measureApply runs apply, over SSH or through agents, and prints its
// schedule against the ideal, its API requests, the API server's CPU and
// what reached the nodes.
func measureApply(ctx context.Context, env *scale.Env, nodes, window int, pw string, qps []string, viaAgent bool) error {
	rs := &restarts{down: map[string]time.Time{}, took: map[string]time.Duration{}}
	inf := informers.NewSharedInformerFactory(env.Cluster.Client, 0)
	if _, err := inf.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: rs.see, UpdateFunc: func(_, n any) { rs.see(n) }}); err != nil {
		return err
	}
	stop := make(chan struct{})
	defer close(stop)
	inf.Start(stop)
	inf.WaitForCacheSync(stop)

	flags := append([]string{"--max-unavailable", fmt.Sprint(window), "--settle", scaleSettle.String(), "-o", "json"}, qps...)
	args := env.ApplyArgs(flags...)
	if viaAgent {
		args = env.AgentArgs("apply", flags...)
	}
	apiserver := env.Cluster.Pids()["kube-apiserver"]
	cpuBefore, err := cpuSeconds(apiserver)
	if err != nil {
		return err
	}
	applyStart := time.Now()
	r := env.Upgrade(ctx, pw, args...)
	applyEnd := time.Now()
	if r.Err != nil {
		return r.Err
	}
	cpuAfter, err := cpuSeconds(apiserver)
	if err != nil {
		return err
	}
	var res inplace.ApplyResult
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		return fmt.Errorf("apply -o json: %w", err)
	}
	steps := map[string]float64{}
	for _, s := range res.Steps {
		steps[s.Name] = s.Seconds
	}
	rs.mu.Lock()
	var names []string
	var took []time.Duration
	for name := range rs.took {
		if name != "cp-1" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		took = append(took, rs.took[name]+*scaleSettle)
	}
	cp := rs.took["cp-1"] + *scaleSettle
	peak, other := rs.peak, rs.other
	rs.mu.Unlock()
	if other > 0 {
		fmt.Printf("  note: %d Nodes went NotReady for another reason than a kubelet restart during the run\n", other)
	}
	ideal := idealSchedule(cp, took, window).Seconds()
	kubelets := steps["kubelets"]
	fmt.Printf("  apply: %.1f s wall (%s); %d worker restarts seen, mean %.2f s with the settle, peak %d workers NotReady at once\n",
		r.Wall.Seconds(), stepLine(res.Steps), len(took), meanSeconds(took), peak)
	fmt.Printf("  kubelets step %.1f s vs the ideal schedule %.1f s (cp-1 alone, then the same restart+settle times through %d slots, each refilled at once): %.3fx\n",
		kubelets, ideal, window, kubelets/ideal)
	fmt.Printf("  whole apply %.1f s vs ideal kubelets + the rest of apply as measured (%.1f s): control plane %.1f s, workloads %.1f s\n",
		r.Wall.Seconds(), ideal+r.Wall.Seconds()-kubelets, steps["control plane"], steps["workloads"])
	if *keepWorkDir {
		if err := os.WriteFile(env.Dir+".apply.log", []byte(r.Stderr), 0o644); err == nil {
			fmt.Printf("  (apply's log: %s.apply.log)\n", env.Dir)
		}
	}
	if ph := phases(r.Stderr); ph.n > 0 {
		fmt.Printf("  per worker, as apply saw it (mean of %d): %.2f s in flight = %.2f s before the restart + %.2f s until Ready + %.2f s after (settle %s, verify, mark done)\n",
			ph.n, ph.took/float64(ph.n), ph.before/float64(ph.n), ph.ready/float64(ph.n), ph.after/float64(ph.n), *scaleSettle)
	}
	fmt.Printf("  upgrade apply: %.1f s CPU (%.0f%% of a core), %d MB peak RSS\n", r.CPU.Seconds(), 100*r.CPU.Seconds()/r.Wall.Seconds(), r.MaxRSS>>10)

	events, err := env.Cluster.AuditRequests("kubelift")
	if err != nil {
		return err
	}
	verbs := map[string]int{}
	perSecond := map[int64]int{}
	for _, e := range events {
		if e.Time.Before(applyStart) || e.Time.After(applyEnd) {
			continue
		}
		verbs[e.Verb]++
		perSecond[e.Time.Unix()]++
	}
	total, peakQPS := 0, 0
	var vs []string
	for v, c := range verbs {
		total += c
		vs = append(vs, fmt.Sprintf("%s %.2f", v, float64(c)/float64(nodes+1)))
	}
	sort.Strings(vs)
	for _, c := range perSecond {
		peakQPS = max(peakQPS, c)
	}
	// A token bucket of burst B refilled at Q per second lets at most
	// B + Q requests through in any one second.
	within, allow, budget := "within", 3**scaleQPS, fmt.Sprintf("--kube-qps %d --kube-burst %d", *scaleQPS, 2**scaleQPS)
	if viaAgent { // the step requests have a budget of their own
		allow += 3 * *scaleAgentQ
		budget += fmt.Sprintf(" and --agent-qps %d", *scaleAgentQ)
	}
	if peakQPS > allow {
		within = "MORE than"
	}
	fmt.Printf("  API requests by apply: %d, %.2f per node (%s); peak %d in one second, %s what %s allow in a second (%d); mean %.1f/s; %d watches\n",
		total, float64(total)/float64(nodes+1), strings.Join(vs, ", "), peakQPS, within, budget, allow, float64(total)/applyEnd.Sub(applyStart).Seconds(), verbs["watch"])
	fmt.Printf("  kube-apiserver: %.1f s CPU during apply (%.0f%% of a core)\n", cpuAfter-cpuBefore, 100*(cpuAfter-cpuBefore)/applyEnd.Sub(applyStart).Seconds())
	if viaAgent {
		return printAgents(env, nodes, applyStart, applyEnd)
	}
	fs := env.Fleet.Stats()
	var cmds []string
	var sshTotal int64
	for name, c := range fs.Commands {
		cmds = append(cmds, fmt.Sprintf("%s %d", name, c))
		sshTotal += c
	}
	sort.Strings(cmds)
	fmt.Printf("  SSH: %d connections, %d commands, %.1f per node (%s)\n", fs.Connections, sshTotal, float64(sshTotal)/float64(nodes+1), strings.Join(cmds, ", "))
	return nil
}

// printAgents prints what the agents asked of the API server during
// apply, and the steps they played.
func printAgents(env *scale.Env, nodes int, from, to time.Time) error {
	events, err := env.Cluster.AuditRequests(scale.AgentUserAgent)
	if err != nil {
		return err
	}
	verbs := map[string]int{}
	total := 0
	for _, e := range events {
		if e.Time.Before(from) || e.Time.After(to) {
			continue
		}
		verbs[e.Verb]++
		total++
	}
	var vs []string
	for v, c := range verbs {
		vs = append(vs, fmt.Sprintf("%s %.2f", v, float64(c)/float64(nodes+1)))
	}
	sort.Strings(vs)
	fs := env.Fleet.Stats()
	var steps int64
	for _, c := range fs.Commands {
		steps += c
	}
	fmt.Printf("  agents: %d API requests during apply, %.2f per node (%s); %d steps played, %.1f per node\n",
		total, float64(total)/float64(nodes+1), strings.Join(vs, ", "), steps, float64(steps)/float64(nodes+1))
	return nil
}

type phaseSums struct {
	n                          int
	took, before, ready, after float64
}

var phaseRE = regexp.MustCompile(`msg=upgraded node=(\S+) version=\S+ took=(\S+) before-restart=(\S+) until-ready=(\S+) after-ready=(\S+)`)

// phases sums the per-node lines apply logs for the workers.
func phases(log string) phaseSums {
	var p phaseSums
	for _, m := range phaseRE.FindAllStringSubmatch(log, -1) {
		if m[1] == "cp-1" {
			continue
		}
		var d [4]time.Duration
		ok := true
		for i := range d {
			var err error
			if d[i], err = time.ParseDuration(m[i+2]); err != nil {
				ok = false
			}
		}
		if ok {
			p.n++
			p.took += d[0].Seconds()
			p.before += d[1].Seconds()
			p.ready += d[2].Seconds()
			p.after += d[3].Seconds()
		}
	}
	return p
}

// idealSchedule is the makespan of the ideal schedule for the same
// nodes: the control-plane node's kubelet alone, then the workers in order
// through window slots, a slot taken again the moment it frees, each node
// taking exactly its measured restart and settle, no more.
func idealSchedule(cp time.Duration, workers []time.Duration, window int) time.Duration {
	slots := make([]time.Duration, window)
	for _, d := range workers {
		i := 0
		for j := range slots {
			if slots[j] < slots[i] {
				i = j
			}
		}
		slots[i] += d
	}
	var end time.Duration
	for _, s := range slots {
		end = max(end, s)
	}
	return cp + end
}

func stepLine(steps []inplace.StepTime) string {
	var parts []string
	for _, s := range steps {
		parts = append(parts, fmt.Sprintf("%s %.1f", s.Name, s.Seconds))
	}
	return strings.Join(parts, ", ")
}

func meanSeconds(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s.Seconds() / float64(len(ds))
}

// benchPlanChecks times the plan's checks over 500 and 5000 workers with
// 30 pods each (internal/inplace/preflight's BenchmarkPlan: every check, restart
// prediction included, over what the SSH reads returned) and prints the
// 5000-node time and its ratio to linear growth from 500 (1.00x: linear).
func benchPlanChecks(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", "^BenchmarkPlan$", "-benchtime", "3x", "./internal/inplace/preflight").CombinedOutput()
	if err != nil {
		return fmt.Errorf("go test -bench BenchmarkPlan: %v\n%s", err, out)
	}
	secs := map[int]float64{}
	for _, line := range strings.Split(string(out), "\n") {
		var n, iters int
		var ns float64
		if _, err := fmt.Sscanf(strings.Join(strings.Fields(line), " "), "BenchmarkPlan/nodes=%d-%d %d %g ns/op", &n, new(int), &iters, &ns); err == nil {
			secs[n] = ns / 1e9
		}
	}
	small, big := secs[500], secs[5000]
	if small == 0 || big == 0 {
		return fmt.Errorf("BenchmarkPlan printed no times:\n%s", out)
	}
	fmt.Printf("\n== plan checks (500 and 5000 workers, 30 pods each, restart prediction included) ==\n")
	fmt.Printf("500 nodes %.3f s, 5000 nodes (150,000 pods) %.3f s: %.2fx linear growth\n", small, big, big/(10*small))
	return nil
}
