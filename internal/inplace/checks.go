package inplace

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/registry"
	"github.com/kubelift/kubelift/pkg/hashskip"
)

func listOptions() metav1.ListOptions { return metav1.ListOptions{Limit: 500} }

// planCheck runs the checks over what BuildPlan read.
type planCheck struct {
	opts   PlanOptions
	view   *clusterView
	plan   *Plan
	target *Target
	// Indexes of the view, built once: a plan of 5000 nodes and 150,000
	// pods stays linear.
	podNode map[string]string        // "ns/name" -> node
	onNode  map[string][]*corev1.Pod // node -> its pods
	roles   map[string]string        // node -> role
}

// index builds the indexes of the view.
func (pc *planCheck) index() {
	pc.podNode = make(map[string]string, len(pc.view.pods))
	pc.onNode = map[string][]*corev1.Pod{}
	for i := range pc.view.pods {
		p := &pc.view.pods[i]
		pc.podNode[p.Namespace+"/"+p.Name] = p.Spec.NodeName
		if p.Spec.NodeName != "" {
			pc.onNode[p.Spec.NodeName] = append(pc.onNode[p.Spec.NodeName], p)
		}
	}
	pc.roles = make(map[string]string, len(pc.view.tgts))
	for _, t := range pc.view.tgts {
		pc.roles[t.Name] = t.Role
	}
}

func (pc *planCheck) add(sev Severity, check, object, msg, fix string) {
	pc.plan.Findings = append(pc.plan.Findings, Finding{Severity: sev, Check: check, Object: object, Node: pc.nodeOf(object), Message: msg, Fix: fix})
}

// nodeOf is the node a finding's object is on, if any.
func (pc *planCheck) nodeOf(object string) string {
	kind, rest, _ := strings.Cut(object, "/")
	switch kind {
	case "node", "apiserver":
		return rest
	case "pod":
		return pc.podNode[rest]
	}
	return ""
}

func (pc *planCheck) role(node string) string {
	if r, ok := pc.roles[node]; ok {
		return r
	}
	return RoleWorker
}

func (pc *planCheck) nodeStates() {
	// Only versions that parsed are kept; each refused value is a
	// blocking finding (values), and none of them reaches a script.
	versions, bad := kubeletVersions(pc.view.nodes)
	for _, n := range pc.view.nodes {
		s := NodeState{Name: n.Name, Role: pc.role(n.Name), Ready: nodeReady(&n), Arch: n.Status.NodeInfo.Architecture,
			Kubelet: versions[n.Name]}
		if f := pc.view.facts[n.Name]; f != nil {
			s.Components = f.Components
			bad = append(bad, f.Bad...)
		}
		pc.plan.Nodes = append(pc.plan.Nodes, s)
	}
	for _, b := range bad {
		pc.plan.Findings = append(pc.plan.Findings, Finding{Severity: Blocking, Check: "values", Object: "node/" + b.Node, Node: b.Node,
			Message: fmt.Sprintf("%s %q is refused: %s; kubelift touches no node while a node reports a value it cannot parse", b.Field, b.Value, b.Reason),
			Fix:     "find out why the node reports it (a forged status or a tampered binary?) and repair the node"})
	}
	from := map[string]bool{}
	for _, s := range pc.plan.Nodes {
		from[s.Kubelet] = true
		for _, v := range s.Components {
			from[v] = true
		}
	}
	for v := range from {
		if v != "" {
			pc.plan.From = append(pc.plan.From, v)
		}
	}
	sort.Slice(pc.plan.From, func(i, j int) bool {
		a, errA := catalog.ParseVersion(pc.plan.From[i])
		b, errB := catalog.ParseVersion(pc.plan.From[j])
		if errA != nil || errB != nil {
			return pc.plan.From[i] < pc.plan.From[j]
		}
		return a.Compare(b) < 0
	})
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// steps orders the upgrade: control-plane nodes one at a time, the pods'
// tolerations, then kubelets: control-plane nodes one at a time and
// workers in batches.
func (pc *planCheck) steps() ([]Step, error) {
	var cps, workers []string
	for _, s := range pc.plan.Nodes {
		if s.Role == RoleControlPlane {
			cps = append(cps, s.Name)
		} else {
			workers = append(workers, s.Name)
		}
	}
	maxU, err := ParseMaxUnavailable(pc.opts.MaxUnavailable, len(workers))
	if err != nil {
		return nil, err
	}
	var steps []Step
	for _, n := range cps {
		steps = append(steps, Step{Phase: PhaseControlPlane, Nodes: []string{n}, Components: controlPlaneFiles})
	}
	steps = append(steps, Step{Phase: PhaseTolerations})
	for _, n := range cps {
		steps = append(steps, Step{Phase: PhaseKubelets, Nodes: []string{n}, Components: []string{"kubelet"}})
	}
	for _, b := range Batches(workers, maxU, pc.opts.Canary) {
		steps = append(steps, Step{Phase: PhaseKubelets, Nodes: b, Components: []string{"kubelet"}})
	}
	return steps, nil
}

// path: the catalog allows the upgrade (or patch downgrade) from every
// version the control plane runs, and no minor is skipped.
func (pc *planCheck) path() {
	to := pc.target.Version
	seen := map[string]bool{}
	for _, s := range pc.plan.Nodes {
		for _, comp := range controlPlaneFiles { // in order: the API server first
			ver := s.Components[comp]
			if ver == "" || seen[ver] {
				continue
			}
			seen[ver] = true
			from, err := catalog.ParseVersion(ver)
			if err != nil {
				continue
			}
			obj := "node/" + s.Name
			switch c := from.Compare(to); {
			case c == 0:
			case c > 0:
				rel, err := pc.opts.Catalog.Lookup(from.String())
				if from.Minor != to.Minor || err != nil || !rel.CanDowngradeTo(to) {
					pc.add(Blocking, "path", obj, fmt.Sprintf("%s runs %s: %s would be a downgrade the catalog does not allow (patch downgrades within a minor only, listed in downgradeTo)", comp, from, to), "choose a version the catalog allows, or upgrade forward")
				}
			case to.Minor-from.Minor > 1 || to.Major != from.Major:
				pc.add(Blocking, "path", obj, fmt.Sprintf("%s runs %s: %s skips a minor version (the API server must not skip one)", comp, from, to), fmt.Sprintf("upgrade to a %d.%d release first", to.Major, from.Minor+1))
			case !pc.target.Release.CanUpgradeFrom(from):
				pc.add(Blocking, "path", obj, fmt.Sprintf("%s runs %s: the catalog does not list it among %s's upgrade sources (%s)", comp, from, to, strings.Join(pc.target.Release.UpgradeFrom, ", ")), "upgrade to an allowed intermediate version first")
			}
		}
	}
	if len(seen) == 0 {
		pc.add(Warning, "path", "version/"+to.String(), "no control-plane component version could be read on any node", "check SSH access to the control-plane nodes")
	}
	// Skew: kubelets never newer than any API server, at most 3 minors older.
	for _, s := range pc.plan.Nodes {
		kv, err := catalog.ParseVersion(s.Kubelet)
		if err != nil {
			continue
		}
		if kv.Compare(to) > 0 {
			pc.add(Blocking, "skew", "node/"+s.Name, fmt.Sprintf("kubelet %s is newer than %s: a kubelet may never be newer than the API server", kv, to), "")
		}
		if to.Minor-kv.Minor > 3 {
			pc.add(Blocking, "skew", "node/"+s.Name, fmt.Sprintf("kubelet %s is more than 3 minors older than %s", kv, to), "upgrade this node's kubelet in steps first")
		}
	}
}

func (pc *planCheck) imported() {
	t := pc.target
	pc.add(Info, "imported", "version/"+t.Version.String(), fmt.Sprintf("imported (record %s), signed bundle.json verified with the given key", t.Record.BundleDigest), "")
}

// images: every image of the record resolves by digest in the registry.
func (pc *planCheck) images(ctx context.Context) {
	p := &registry.Pusher{Access: pc.opts.Access, Jobs: 4}
	for _, im := range pc.target.Record.Images {
		want, err := v1.NewHash(im.Digest)
		if err != nil {
			continue
		}
		tgt, err := name.ParseReference(im.Target, name.WeakValidation)
		if err != nil {
			continue
		}
		ref := tgt.Context().Digest(im.Digest)
		got, err := p.ManifestDigest(ctx, ref)
		switch {
		case err != nil:
			pc.add(Blocking, "images", "image/"+im.Target, fmt.Sprintf("cannot check the private registry: %v", err), "pass the registry flags (--username, --ca-file ...) or re-import the bundle")
		case got != want:
			pc.add(Blocking, "images", "image/"+im.Target, fmt.Sprintf("%s is not in the private registry", ref), "re-import the bundle")
		}
	}
}

func (pc *planCheck) sshReach() {
	for _, t := range pc.view.tgts {
		if err := pc.view.ssh[t.Name]; err != nil {
			pc.add(Blocking, "ssh", "node/"+t.Name, fmt.Sprintf("not reachable over SSH: %v", err), "fix SSH access (--ssh-key, --known-hosts, --inventory) and plan again")
		}
	}
}

// health: every node Ready, every API server ready, controller manager and
// scheduler leading (or running, without leader election). A cluster
// under load answers a probe badly now and then (an API server's
// /readyz says [-]etcd failed for a few seconds): each probe is judged
// over HealthWindow with backoff, as kubeadm's waiter does, and a
// finding says for how long it failed.
func (pc *planCheck) health(ctx context.Context) {
	for _, s := range pc.plan.Nodes {
		if !s.Ready {
			pc.add(Blocking, "health", "node/"+s.Name, "not Ready", "bring the node back, or remove it from the cluster, before upgrading")
		}
	}
	type result struct {
		object, msg, fix string
		sev              Severity
	}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		results = map[string]result{}
	)
	// The probes run side by side: an unhealthy cluster costs one window.
	probe := func(object string, sev Severity, fix string, check func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pc.probe(ctx, check); err != nil {
				mu.Lock()
				results[object] = result{object: object, msg: err.Error(), fix: fix, sev: sev}
				mu.Unlock()
			}
		}()
	}
	if pc.opts.REST != nil {
		for _, t := range pc.view.tgts {
			if t.Role != RoleControlPlane {
				continue
			}
			addr := t.Address
			probe("apiserver/"+t.Name, Blocking, "", func(ctx context.Context) error {
				if err := readyz(ctx, pc.opts.REST, addr); err != nil {
					return fmt.Errorf("/readyz: %w", err)
				}
				return nil
			})
		}
	}
	var mustRun []string
	for _, comp := range []string{"kube-controller-manager", "kube-scheduler"} {
		_, err := pc.opts.Client.CoordinationV1().Leases("kube-system").Get(ctx, comp, metav1.GetOptions{})
		switch {
		case err == nil:
			probe("lease/kube-system/"+comp, Blocking, "check the "+comp+" units on the control-plane nodes", func(ctx context.Context) error {
				l, err := pc.opts.Client.CoordinationV1().Leases("kube-system").Get(ctx, comp, metav1.GetOptions{})
				if err != nil {
					return fmt.Errorf("cannot read the lease: %w", err)
				}
				d := 15 * time.Second
				if l.Spec.LeaseDurationSeconds != nil {
					d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
				}
				if l.Spec.RenewTime == nil || pc.opts.Now().Sub(l.Spec.RenewTime.Time) > 2*d {
					return fmt.Errorf("%s holds no live lease (last renewed %v)", comp, l.Spec.RenewTime)
				}
				return nil
			})
		case apierrors.IsNotFound(err):
			mustRun = append(mustRun, comp)
		default:
			pc.add(Warning, "health", "lease/kube-system/"+comp, fmt.Sprintf("cannot read the lease: %v", err), "")
		}
	}
	wg.Wait()
	objects := make([]string, 0, len(results))
	for o := range results {
		objects = append(objects, o)
	}
	sort.Strings(objects)
	for _, o := range objects {
		r := results[o]
		pc.add(r.sev, "health", r.object, r.msg, r.fix)
	}
	// No leader election: it must run on the control-plane nodes.
	for _, comp := range mustRun {
		for _, s := range pc.plan.Nodes {
			if s.Role == RoleControlPlane && pc.view.facts[s.Name] != nil && s.Components[comp] == "" {
				pc.add(Blocking, "health", "node/"+s.Name, comp+" is not running and holds no lease", "start the "+comp+" unit")
			}
		}
	}
}

// probe runs check until it passes or HealthWindow has passed, backing
// off between tries (from healthBackoff, doubling, at most 5 s). It
// returns nil, or the last failure with how long and how many probes it
// failed for.
func (pc *planCheck) probe(ctx context.Context, check func(context.Context) error) error {
	began := time.Now()
	windowCtx, cancel := context.WithTimeout(ctx, pc.opts.HealthWindow)
	defer cancel()
	tries := 0
	var last error
	b := wait.Backoff{Duration: max(pc.opts.healthBackoff, time.Millisecond), Factor: 2, Cap: 5 * time.Second, Steps: math.MaxInt32}
	_ = wait.ExponentialBackoffWithContext(windowCtx, b, func(context.Context) (bool, error) {
		tries++
		last = check(ctx) // the probe itself is not cut short by the window's end
		return last == nil, nil
	})
	if tries == 0 { // no window at all: one probe
		tries, last = 1, check(ctx)
	}
	if last == nil {
		return nil
	}
	return fmt.Errorf("%w (failing for %s, %d probes)", last, time.Since(began).Round(100*time.Millisecond), tries)
}

func readyz(ctx context.Context, cfg *rest.Config, addr string) error {
	c := rest.CopyConfig(cfg)
	host := c.Host
	if i := strings.LastIndex(host, ":"); i > strings.Index(host, "://")+2 {
		c.Host = "https://" + addr + host[i:]
	} else {
		c.Host = "https://" + addr
	}
	if c.TLSClientConfig.ServerName == "" {
		// Verify the certificate against the name the kubeconfig uses.
		if u, err := url.Parse(host); err == nil {
			c.TLSClientConfig.ServerName = u.Hostname()
		}
	}
	c.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return err
	}
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", c.Host, err)
	}
	if strings.TrimSpace(string(body)) != "ok" {
		return fmt.Errorf("%s: %s", c.Host, body)
	}
	return nil
}

// staged: the files each node needs are staged with the right sha256, and
// there is room for the rest and for the backups.
func (pc *planCheck) staged() {
	version := pc.target.Version.String()
	for i := range pc.plan.Nodes {
		s := &pc.plan.Nodes[i]
		f := pc.view.facts[s.Name]
		if f == nil {
			continue
		}
		arch := s.Arch
		if arch == "" {
			arch = "amd64"
		}
		var missing []string
		var need int64
		for _, name := range FilesFor(s.Role) {
			bf, _, ok := pc.target.File(name, arch)
			if !ok {
				continue
			}
			need += bf.Size // the backup of what it replaces is about as large
			if f.Staged[name] != bf.SHA256 {
				missing = append(missing, name)
				need += bf.Size
			}
		}
		s.Staged = len(missing) == 0
		if len(missing) > 0 {
			pc.add(Info, "staged", "node/"+s.Name, fmt.Sprintf("%s not staged in %s yet: apply stages them", strings.Join(missing, ", "), StagePath(pc.opts.StageDir, version, "")), "upgrade stage --to "+version)
		}
		if f.FreeBytes > 0 && f.FreeBytes < need {
			pc.add(Blocking, "disk", "node/"+s.Name, fmt.Sprintf("%d MiB free below %s, staging and backups need %d MiB", f.FreeBytes>>20, pc.opts.StageDir, need>>20), "free disk space on the node")
		}
	}
}

// removedFlags: no component is started with a flag the target removed.
func (pc *planCheck) removedFlags() {
	rel := pc.target.Release
	removed := map[string][]string{"kubelet": rel.RemovedKubeletFlags}
	for c, fl := range rel.RemovedFlags {
		removed[c] = fl
	}
	for _, s := range pc.plan.Nodes {
		f := pc.view.facts[s.Name]
		if f == nil {
			continue
		}
		for comp, flags := range removed {
			for _, fl := range flags {
				for _, have := range f.Flags[comp] {
					if have == fl {
						pc.add(Blocking, "removed-flags", "node/"+s.Name, fmt.Sprintf("%s is started with %s (in %s), which %s removed: it would not start", comp, fl, f.FlagSources[comp+" "+fl], rel.Version),
							"remove "+fl+" from "+f.FlagSources[comp+" "+fl])
					}
				}
			}
		}
	}
}

// removedAPIs: objects served under a group-version the target removes.
func (pc *planCheck) removedAPIs(ctx context.Context) {
	for _, gvs := range pc.target.Release.RemovedAPIs {
		gv, err := schema.ParseGroupVersion(gvs)
		if err != nil {
			continue
		}
		rl, err := pc.opts.Client.Discovery().ServerResourcesForGroupVersion(gvs)
		if err != nil {
			continue // not served: nothing uses it
		}
		for _, r := range rl.APIResources {
			if strings.Contains(r.Name, "/") || !hasVerb(r.Verbs, "list") {
				continue
			}
			n := -1
			if pc.opts.Dynamic != nil {
				l, err := pc.opts.Dynamic.Resource(gv.WithResource(r.Name)).List(ctx, metav1.ListOptions{Limit: 1})
				if err == nil {
					n = len(l.Items)
					if l.GetRemainingItemCount() != nil {
						n += int(*l.GetRemainingItemCount())
					}
				}
			}
			switch {
			case n == 0:
			case n > 0:
				pc.add(Warning, "removed-apis", "api/"+gvs+"/"+r.Name, fmt.Sprintf("%d %s are served under %s, which %s no longer serves: clients and manifests using it will fail", n, r.Name, gvs, pc.target.Version),
					"move manifests and clients to a served version of "+gv.Group)
			default:
				pc.add(Warning, "removed-apis", "api/"+gvs+"/"+r.Name, fmt.Sprintf("%s is served now and removed in %s", gvs, pc.target.Version), "check that no client uses it")
			}
		}
	}
}

func hasVerb(verbs []string, v string) bool {
	for _, x := range verbs {
		if x == v {
			return true
		}
	}
	return false
}

// readmission: the kubelet re-admits every pod when it restarts; a pod
// whose nodeSelector or required node affinity no longer matches its
// node's labels fails with NodeAffinity.
func (pc *planCheck) readmission() {
	nodes := map[string]*corev1.Node{}
	for i := range pc.view.nodes {
		nodes[pc.view.nodes[i].Name] = &pc.view.nodes[i]
	}
	for i := range pc.view.pods {
		pod := &pc.view.pods[i]
		node := nodes[pod.Spec.NodeName]
		if node == nil {
			continue
		}
		ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node)
		if ok && err == nil {
			continue
		}
		var missing []string
		for k, v := range pod.Spec.NodeSelector {
			if have, ok := node.Labels[k]; !ok || have != v {
				missing = append(missing, k+"="+v)
			}
		}
		sort.Strings(missing)
		why := "its required node affinity no longer matches node " + node.Name + "'s labels"
		fix := "restore the labels the pod requires on node " + node.Name + " (apply --restore-labels does), or delete the pod"
		if len(missing) > 0 {
			why = fmt.Sprintf("node %s lacks the label %s its nodeSelector requires", node.Name, strings.Join(missing, ", "))
		}
		pc.add(Blocking, "readmission", "pod/"+pod.Namespace+"/"+pod.Name,
			"the restarted kubelet would reject it (reason NodeAffinity, the pod fails): "+why, fix)
	}
}

// eviction: pods without not-ready/unreachable NoExecute tolerations are
// evicted at once if their node is NotReady while its kubelet restarts.
func (pc *planCheck) eviction() {
	for i := range pc.view.pods {
		pod := &pc.view.pods[i]
		if pod.Spec.NodeName == "" || isDaemonSetPod(pod) {
			continue
		}
		var lack []string
		for _, key := range []string{"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"} {
			if !tolerates(pod.Spec.Tolerations, key) {
				lack = append(lack, key)
			}
		}
		if len(lack) > 0 {
			pc.add(Warning, "eviction", "pod/"+pod.Namespace+"/"+pod.Name,
				fmt.Sprintf("no NoExecute toleration for %s: evicted at once if node %s turns NotReady while its kubelet restarts", strings.Join(lack, ", "), pod.Spec.NodeName),
				"apply adds them (tolerationSeconds 300) before any kubelet restarts")
		}
	}
	// DefaultTolerationSeconds adds them to new pods; if it is off, they
	// will keep arriving without.
	for _, s := range pc.plan.Nodes {
		f := pc.view.facts[s.Name]
		if f == nil || s.Components["kube-apiserver"] == "" {
			continue
		}
		for _, p := range strings.Split(f.Values["kube-apiserver --disable-admission-plugins"], ",") {
			if p == "DefaultTolerationSeconds" {
				pc.add(Warning, "eviction", "apiserver/"+s.Name, "the DefaultTolerationSeconds admission plugin is disabled: new pods lack the not-ready/unreachable tolerations too", "enable it (remove it from --disable-admission-plugins)")
			}
		}
	}
}

func isDaemonSetPod(p *corev1.Pod) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}

// tolerates reports whether tolerations cover key:NoExecute for good (or
// for a while: tolerationSeconds is what DefaultTolerationSeconds gives).
func tolerates(ts []corev1.Toleration, key string) bool {
	for _, t := range ts {
		if t.Effect != "" && t.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if t.Key == key || (t.Key == "" && t.Operator == corev1.TolerationOpExists) {
			return true
		}
	}
	return false
}

// restarts predicts, from each node's runtime, which running containers
// the bundled kubelet would restart, and which the hash-skip file keeps.
func (pc *planCheck) restarts() {
	t := pc.target
	hasher := &kubeletcompat.Hasher{Version: t.Version, Era: t.Release.KubeletHashEra}
	start := pc.opts.Now().Add(time.Hour) // the upgraded kubelet starts after every running container
	for i := range pc.plan.Nodes {
		s := &pc.plan.Nodes[i]
		f := pc.view.facts[s.Name]
		if f == nil || s.Kubelet == t.Version.String() {
			continue // a kubelet already at the target is not restarted
		}
		if f.ContainersErr != "" {
			pc.add(Warning, "restarts", "node/"+s.Name, "cannot read the runtime's containers (crictl ps -o json): "+f.ContainersErr, "install crictl on the node")
			continue
		}
		var cache *hashskip.File
		era := "unknown"
		if kv, err := catalog.ParseVersion(s.Kubelet); err == nil {
			if e, err := pc.opts.Catalog.HashEraFor(kv); err == nil {
				era = e
			}
		}
		if t.Manifest.KubeletHashSkip(archOr(s.Arch)) && era != t.Release.KubeletHashEra {
			cache = &hashskip.File{SchemaVersion: hashskip.SchemaVersion, OldKubeletVersion: s.Kubelet, NewKubeletVersion: t.Version.String(), UpgradedAt: pc.opts.Now()}
		}
		preds, err := kubeletcompat.PredictPods(pc.onNode[s.Name], map[string][]kubeletcompat.RuntimeContainer{s.Name: f.Containers},
			kubeletcompat.PredictOptions{Target: hasher, Cache: cache, KubeletStart: start})
		if err != nil {
			pc.add(Warning, "restarts", "node/"+s.Name, "cannot predict restarts: "+err.Error(), "")
			continue
		}
		for _, p := range preds {
			s.Containers++
			if p.Restart {
				s.Restarts++
			}
			if p.Protected {
				s.Protected++
			}
		}
		why := fmt.Sprintf("the kubelet's container hash changes (era %s to %s)", era, t.Release.KubeletHashEra)
		if era == t.Release.KubeletHashEra {
			why = "their spec hashes differ under " + t.Version.String()
		}
		if s.Restarts > 0 {
			sev := Blocking
			if pc.opts.AllowRestarts {
				sev = Warning
			}
			fix := "bundle kubelift's hash-skip kubelet (make kubelet; bundle create --kubelet-binary), or pass --allow-restarts, or --drain"
			pc.add(sev, "restarts", "node/"+s.Name, fmt.Sprintf("%d of %d running containers would restart: %s and the bundled kubelet does not keep them", s.Restarts, s.Containers, why), fix)
		}
		if s.Protected > 0 {
			pc.add(Info, "restarts", "node/"+s.Name, fmt.Sprintf("%d of %d running containers kept running by the hash-skip file (%s)", s.Protected, s.Containers, why), "")
		}
	}
}

func archOr(a string) string {
	if a == "" {
		return "amd64"
	}
	return a
}
