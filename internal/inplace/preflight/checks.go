package preflight

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/stage"
	"github.com/kubelift/kubelift/internal/inplace/window"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/internal/registry"
)

// planCheck runs the checks over what BuildPlan read.
type planCheck struct {
	opts   PlanOptions
	view   *View
	plan   *Plan
	target *release.Release
	// kind is the cluster's kind (release.KindBinary, KindKubeadm).
	kind string
	// Indexes of the view, built once: a plan of 5000 nodes and 150,000
	// pods stays linear.
	podNode map[string]string        // "ns/name" -> node
	onNode  map[string][]*corev1.Pod // node -> its pods
	roles   map[string]string        // node -> role
	// runtimes are the container runtimes the Nodes report, parsed.
	runtimes map[string]nodefacts.Runtime
}

// index builds the indexes of the view.
func (pc *planCheck) index() {
	pc.podNode = make(map[string]string, len(pc.view.Pods))
	pc.onNode = map[string][]*corev1.Pod{}
	pc.runtimes = map[string]nodefacts.Runtime{}
	for i := range pc.view.Pods {
		p := &pc.view.Pods[i]
		pc.podNode[p.Namespace+"/"+p.Name] = p.Spec.NodeName
		if p.Spec.NodeName != "" {
			pc.onNode[p.Spec.NodeName] = append(pc.onNode[p.Spec.NodeName], p)
		}
	}
	pc.roles = make(map[string]string, len(pc.view.Addresses))
	for _, t := range pc.view.Addresses {
		pc.roles[t.Name] = t.Role
	}
}

func (pc *planCheck) add(sev Severity, check Check, object, msg, fix string) *Finding {
	pc.plan.Findings = append(pc.plan.Findings, Finding{Severity: sev, Check: check, Object: object, Node: pc.nodeOf(object), Message: msg, Fix: fix})
	return &pc.plan.Findings[len(pc.plan.Findings)-1]
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
	return release.RoleWorker
}

func (pc *planCheck) nodeStates() {
	// Only versions that parsed are kept; each refused value is a
	// blocking finding (values), and none of them reaches a script.
	versions, bad := nodefacts.KubeletVersions(pc.view.Nodes)
	for _, n := range pc.view.Nodes {
		s := NodeState{Name: n.Name, Role: pc.role(n.Name), Ready: cluster.NodeReady(&n), Arch: n.Status.NodeInfo.Architecture,
			Kubelet: versions[n.Name]}
		if rt, b := nodefacts.ParseRuntime(n.Name, n.Status.NodeInfo.ContainerRuntimeVersion); b != nil {
			bad = append(bad, *b)
		} else if rt.Name != "" {
			s.Runtime, pc.runtimes[n.Name] = rt.String(), rt
		}
		if f := pc.view.Facts[n.Name]; f != nil {
			s.Components = f.Components
			if f.CRI != nil {
				s.CRI = fmt.Sprintf("%s, CRI %s", f.CRI.Runtime, f.CRI.APIVersion)
			}
			bad = append(bad, f.Bad...)
		}
		if pc.view.Kubeadm != nil && s.Role == release.RoleControlPlane {
			s.Components, bad = pc.staticComponents(n.Name, s.Components, bad)
		}
		pc.plan.Nodes = append(pc.plan.Nodes, s)
	}
	for _, b := range bad {
		pc.plan.Findings = append(pc.plan.Findings, Finding{Severity: Blocking, Check: CheckValues, Object: "node/" + b.Node, Node: b.Node,
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

// steps orders the upgrade: the pods' tolerations, control-plane nodes
// one at a time, then kubelets: control-plane nodes one at a time and
// workers in the waves of their Window.
func (pc *planCheck) steps() ([]Step, window.Window, error) {
	var cps, workers []string
	for _, s := range pc.plan.Nodes {
		if s.Role == release.RoleControlPlane {
			cps = append(cps, s.Name)
		} else {
			workers = append(workers, s.Name)
		}
	}
	win, err := window.New(pc.opts.MaxUnavailable, pc.opts.Canary, len(workers))
	if err != nil {
		return nil, window.Window{}, err
	}
	// In apply's order: tolerations before any component restarts.
	steps := []Step{{Phase: PhaseTolerations}}
	for _, t := range pc.target.Chain() {
		for i := range pc.plan.Nodes {
			if n := &pc.plan.Nodes[i]; n.Role == release.RoleControlPlane {
				steps = append(steps, Step{Phase: PhaseControlPlane, Version: t.Version.String(), Nodes: []string{n.Name}, Components: Components(pc.kind, n)})
			}
		}
	}
	proxies := map[string]bool{}
	for i := range pc.plan.Nodes {
		n := &pc.plan.Nodes[i]
		if _, runs := n.Components[release.KubeProxy]; runs {
			_, _, proxies[n.Name] = pc.target.File(release.KubeProxy, release.ArchOr(n.Arch))
		}
	}
	for _, n := range cps {
		steps = append(steps, Step{Phase: PhaseKubelets, Nodes: []string{n}, Components: nodeComponents([]string{n}, proxies)})
	}
	for _, b := range win.Waves(workers) {
		steps = append(steps, Step{Phase: PhaseKubelets, Nodes: b, Components: nodeComponents(b, proxies)})
	}
	return steps, win, nil
}

// nodeComponents are what moves on nodes after the control plane: the
// kubelet, then kube-proxy where one of them runs it as a unit and the
// bundle carries it (proxies holds those nodes).
func nodeComponents(nodes []string, proxies map[string]bool) []string {
	for _, n := range nodes {
		if proxies[n] {
			return []string{"kubelet", release.KubeProxy}
		}
	}
	return []string{"kubelet"}
}

// path: the catalog allows the upgrade (or patch downgrade) from every
// version the control plane runs, and no minor is skipped.
func (pc *planCheck) path() {
	to := pc.target.Version
	seen := map[string]bool{}
	for _, s := range pc.plan.Nodes {
		for _, comp := range release.ControlPlaneFiles { // in order: the API server first
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
			// The next release on the way from here: the first of the
			// hops and the target newer than what the component runs.
			next := pc.target
			for _, t := range pc.target.Chain() {
				if from.Compare(t.Version) < 0 {
					next = t
					break
				}
			}
			switch c := from.Compare(to); {
			case c == 0:
			case c > 0:
				rel, err := pc.opts.Catalog.Lookup(from.String())
				if from.Minor != to.Minor || err != nil || !rel.CanDowngradeTo(to) {
					pc.add(Blocking, CheckPath, obj, fmt.Sprintf("%s runs %s: %s would be a downgrade the catalog does not allow (patch downgrades within a minor only, listed in downgradeTo)", comp, from, to), "choose a version the catalog allows, or upgrade forward")
				}
			case next.Version.Minor-from.Minor > 1 || next.Version.Major != from.Major:
				msg := fmt.Sprintf("%s runs %s: %s skips a minor version (the API server must not skip one)", comp, from, next.Version)
				if len(pc.target.Hops) > 0 {
					msg += fmt.Sprintf("; the bundle passes through %s", hopList(pc.target))
				}
				fix := fmt.Sprintf("upgrade to a %d.%d release first", to.Major, from.Minor+1)
				if pc.view.Kubeadm == nil && to.Major == from.Major && to.Minor-from.Minor <= catalog.MaxKubeletSkew && len(pc.target.Hops) == 0 {
					fix += fmt.Sprintf(", or make the bundle with bundle create --from v%d.%d", from.Major, from.Minor)
				}
				pc.add(Blocking, CheckPath, obj, msg, fix)
			case !next.Catalog.CanUpgradeFrom(from):
				pc.add(Blocking, CheckPath, obj, fmt.Sprintf("%s runs %s: the catalog does not list it among %s's upgrade sources (%s)", comp, from, next.Version, strings.Join(next.Catalog.UpgradeFrom, ", ")), "upgrade to an allowed intermediate version first")
			case next != pc.target && pc.view.Kubeadm != nil:
				// kubeadm's side of hops is not built: a kubeadm control
				// plane moves one minor per apply.
				pc.add(Blocking, CheckPath, obj, fmt.Sprintf("%s runs %s: the way to %s passes through %s, and kubelift moves a kubeadm control plane one minor at a time", comp, from, to, hopList(pc.target)),
					fmt.Sprintf("import and apply a %s bundle first", next.Version.MinorString()))
			}
		}
	}
	if len(seen) == 0 {
		pc.add(Warning, CheckPath, "version/"+to.String(), "no control-plane component version could be read on any node", "check SSH access to the control-plane nodes")
	}
	// Skew: kubelets never newer than any API server, at most 3 minors older.
	for _, s := range pc.plan.Nodes {
		kv, err := catalog.ParseVersion(s.Kubelet)
		if err != nil {
			continue
		}
		if kv.Compare(to) > 0 {
			pc.add(Blocking, CheckSkew, "node/"+s.Name, fmt.Sprintf("kubelet %s is newer than %s: a kubelet may never be newer than the API server", kv, to), "")
		}
		if to.Minor-kv.Minor > 3 {
			pc.add(Blocking, CheckSkew, "node/"+s.Name, fmt.Sprintf("kubelet %s is more than 3 minors older than %s", kv, to), "upgrade this node's kubelet in steps first")
		}
	}
}

func (pc *planCheck) imported() {
	t := pc.target
	pc.add(Info, CheckImported, "version/"+t.Version.String(), fmt.Sprintf("imported (record %s), signed bundle.json verified with the given key", t.Record.BundleDigest), "")
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
			pc.add(Blocking, CheckImages, "image/"+im.Target, fmt.Sprintf("cannot check the private registry: %v", err), "pass the registry flags (--username, --ca-file ...) or re-import the bundle")
		case got != want:
			pc.add(Blocking, CheckImages, "image/"+im.Target, fmt.Sprintf("%s is not in the private registry", ref), "re-import the bundle")
		}
	}
}

func (pc *planCheck) sshReach() {
	for _, t := range pc.view.Addresses {
		if err := pc.view.SSH[t.Name]; err != nil {
			pc.add(Blocking, CheckSSH, "node/"+t.Name, fmt.Sprintf("not reachable: %v", err), "fix SSH access (--ssh-key, --known-hosts, --inventory), or with --via agent the agent's pod (its image in the registry and pullable by the node), and plan again")
		}
	}
}

// staged: the files each node needs (its binaries, and the parts of the
// runtime move the bundle makes on it) are staged with the right sha256,
// and there is room for the rest and for the backups.
func (pc *planCheck) staged() {
	version := pc.target.Version.String()
	for i := range pc.plan.Nodes {
		s := &pc.plan.Nodes[i]
		f := pc.view.Facts[s.Name]
		if f == nil {
			continue
		}
		arch := s.Arch
		if arch == "" {
			arch = "amd64"
		}
		var missing []string
		var need int64
		names, err := pc.target.NodeFiles(pc.kind, s.Role, pc.runtimes[s.Name], arch)
		if err != nil {
			pc.add(Blocking, CheckStaged, "node/"+s.Name, err.Error(), "make the bundle again with a catalog whose node stack parses")
		}
		for _, name := range names {
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
		// Each hop's files, which the facts do not list (apply stages
		// them, sending only what is missing): counted at full size, with
		// their backups.
		for _, h := range pc.target.Hops {
			for _, name := range release.HopFilesForKind(pc.kind, s.Role) {
				if bf, _, ok := h.File(name, arch); ok {
					need += 2 * bf.Size
				}
			}
		}
		s.Staged = len(missing) == 0
		if len(missing) > 0 {
			how, sev := "apply stages them", Info
			if p, ok := pc.view.Paths[s.Name]; ok {
				s.StagePath, s.StagePathReason = p[0], p[1]
				if how = stage.Describe(p[0], p[1]); p[0] == stage.ViaNone {
					sev = Blocking
				}
			}
			pc.add(sev, CheckStaged, "node/"+s.Name, fmt.Sprintf("%s not staged in %s yet: %s", strings.Join(missing, ", "), release.StagePath(pc.opts.StageDir, version, ""), how), "upgrade stage --to "+version)
		}
		if f.FreeBytes > 0 && f.FreeBytes < need {
			pc.add(Blocking, CheckDisk, "node/"+s.Name, fmt.Sprintf("%d MiB free below %s, staging and backups need %d MiB", f.FreeBytes>>20, pc.opts.StageDir, need>>20), "free disk space on the node")
		}
	}
}

// Components are the control-plane parts a cluster of kind moves on
// node n, in the order it moves them: on a binary cluster those of the
// API server, controller manager and scheduler the node has units for;
// on a kubeadm cluster all three on every control-plane node (static
// pods).
func Components(kind string, n *NodeState) []string {
	if kind == release.KindKubeadm {
		if n.Role != release.RoleControlPlane {
			return nil
		}
		return append([]string{}, release.ControlPlaneFiles...)
	}
	var out []string
	for _, c := range release.ControlPlaneFiles {
		if _, ok := n.Components[c]; ok {
			out = append(out, c)
		}
	}
	return out
}

// missingFiles says the node lacks some of the target's files it needs
// (its binaries, its runtime move's parts, rt being its runtime, and its
// tools' archives: release.Release.NodeFiles).
func missingFiles(target *release.Release, f *nodefacts.Facts, kind, role string, rt nodefacts.Runtime, arch string) bool {
	if target == nil || target.Manifest == nil {
		return false // rollback and cleanup read nodes without a bundle
	}
	if arch == "" {
		arch = "amd64"
	}
	names, err := target.NodeFiles(kind, role, rt, arch)
	if err != nil {
		return true // the plan's staged check says why
	}
	for _, name := range names {
		if bf, _, ok := target.File(name, arch); ok && f.Staged[name] != bf.SHA256 {
			return true
		}
	}
	return false
}
