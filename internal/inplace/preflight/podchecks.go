package preflight

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/inplace/workloads"
	"github.com/kubelift/kubelift/internal/kubeletcompat"
	"github.com/kubelift/kubelift/internal/nodefacts"
	"github.com/kubelift/kubelift/pkg/hashskip"
)

// readmission: the kubelet re-admits every pod when it restarts; a pod
// whose nodeSelector or required node affinity no longer matches its
// node's labels fails with NodeAffinity.
func (pc *planCheck) readmission() {
	nodes := map[string]*corev1.Node{}
	for i := range pc.view.Nodes {
		nodes[pc.view.Nodes[i].Name] = &pc.view.Nodes[i]
	}
	for i := range pc.view.Pods {
		pod := &pc.view.Pods[i]
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
		code := ""
		if len(missing) > 0 {
			why = fmt.Sprintf("node %s lacks the label %s its nodeSelector requires", node.Name, strings.Join(missing, ", "))
			code = CodeLabelsMissing
		}
		pc.add(Blocking, CheckReadmission, "pod/"+pod.Namespace+"/"+pod.Name,
			"the restarted kubelet would reject it (reason NodeAffinity, the pod fails): "+why, fix).Code = code
	}
}

// eviction: pods without not-ready/unreachable NoExecute tolerations are
// evicted at once if their node is NotReady while its kubelet restarts.
func (pc *planCheck) eviction() {
	for i := range pc.view.Pods {
		pod := &pc.view.Pods[i]
		if pod.Spec.NodeName == "" || workloads.IsDaemonSetPod(pod) {
			continue
		}
		var lack []string
		for _, key := range []string{"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"} {
			if !workloads.Tolerates(pod.Spec.Tolerations, key) {
				lack = append(lack, key)
			}
		}
		if len(lack) > 0 {
			pc.add(Warning, CheckEviction, "pod/"+pod.Namespace+"/"+pod.Name,
				fmt.Sprintf("no NoExecute toleration for %s: evicted at once if node %s turns NotReady while its kubelet restarts", strings.Join(lack, ", "), pod.Spec.NodeName),
				"apply adds them (tolerationSeconds 300) before any kubelet restarts")
		}
	}
	// DefaultTolerationSeconds adds them to new pods; if it is off, they
	// will keep arriving without.
	for _, s := range pc.plan.Nodes {
		f := pc.view.Facts[s.Name]
		if f == nil || s.Components["kube-apiserver"] == "" {
			continue
		}
		for _, p := range strings.Split(f.Values["kube-apiserver --disable-admission-plugins"], ",") {
			if p == "DefaultTolerationSeconds" {
				pc.add(Warning, CheckEviction, "apiserver/"+s.Name, "the DefaultTolerationSeconds admission plugin is disabled: new pods lack the not-ready/unreachable tolerations too", "enable it (remove it from --disable-admission-plugins)")
			}
		}
	}
}

// restarts predicts, from each node's runtime, which running containers
// the bundled kubelet would restart, and which the hash-skip file keeps.
func (pc *planCheck) restarts() {
	t := pc.target
	hasher := &kubeletcompat.Hasher{Version: t.Version, Era: t.Catalog.KubeletHashEra}
	for i := range pc.plan.Nodes {
		s := &pc.plan.Nodes[i]
		f := pc.view.Facts[s.Name]
		if f == nil || s.Kubelet == t.Version.String() {
			continue // a kubelet already at the target is not restarted
		}
		pc.restartsOn(s, f, hasher)
	}
}

// restartsOn predicts what the target's kubelet would restart on node s
// (whose facts are f), counts it in s, and says so.
func (pc *planCheck) restartsOn(s *NodeState, f *nodefacts.Facts, hasher *kubeletcompat.Hasher) {
	t := pc.target
	if f.ContainersErr != "" {
		pc.add(Warning, CheckRestarts, "node/"+s.Name, "cannot read the runtime's containers (crictl ps -o json): "+f.ContainersErr, "install crictl on the node")
		return
	}
	var cache *hashskip.File
	era := "unknown"
	recreate := true // a kubelet whose version does not parse: expect the worst
	if kv, err := catalog.ParseVersion(s.Kubelet); err == nil {
		if e, err := pc.opts.Catalog.HashEraFor(kv); err == nil {
			era = e
		}
		recreate = kubeletcompat.StaticPodsRecreated(kv, t.Version)
	}
	switch {
	case !t.Manifest.KubeletHashSkip(release.ArchOr(s.Arch)):
	case era != "unknown" && era != t.Catalog.KubeletHashEra: // apply writes the file
		cache = &hashskip.File{SchemaVersion: hashskip.SchemaVersion, OldKubeletVersion: s.Kubelet, OldHashEra: era, NewKubeletVersion: t.Version.String(), UpgradedAt: pc.opts.Now()}
	case era == t.Catalog.KubeletHashEra && f.HashSkipEra != "" && f.HashSkipEra != era:
		// An earlier upgrade's file stays (apply writes none when the
		// era does not change), keeping the containers the kubelet
		// before it started: the new kubelet reads it as this one does.
		cache = &hashskip.File{SchemaVersion: hashskip.SchemaVersion, OldHashEra: f.HashSkipEra, NewKubeletVersion: t.Version.String(), UpgradedAt: pc.opts.Now()}
	}
	preds, err := kubeletcompat.PredictPods(pc.onNode[s.Name], map[string][]kubeletcompat.RuntimeContainer{s.Name: f.Containers},
		kubeletcompat.PredictOptions{Target: hasher, Cache: cache, RecreateStatic: recreate})
	if err != nil {
		pc.add(Warning, CheckRestarts, "node/"+s.Name, "cannot predict restarts: "+err.Error(), "")
		return
	}
	var static []string
	for _, p := range preds {
		s.Containers++
		if p.Restart {
			s.Restarts++
		}
		if p.Protected {
			s.Protected++
		}
		if p.Recreated {
			s.Recreated++
			if pod := p.Namespace + "/" + p.Pod; !slices.Contains(static, pod) {
				static = append(static, pod)
			}
		}
	}
	pc.restartFindings(s, f, era, static)
}

// restartFindings are what restartsOn found on node s: containers no pod
// explains, static pods recreated, a hash-skip file left unread, and the
// restarts predicted or kept, with why.
func (pc *planCheck) restartFindings(s *NodeState, f *nodefacts.Facts, era string, static []string) {
	t := pc.target
	// Containers of no pod the API knows (a static pod whose mirror
	// pod the API refused, a pod deleted meanwhile): nothing predicts
	// them, and verify counts them as restarted if they go.
	known := kubeletcompat.ByRuntimeUID(pc.onNode[s.Name])
	var unknown []string
	for _, c := range f.Containers {
		if c.Running && known[c.PodUID] == nil {
			unknown = append(unknown, c.Namespace+"/"+c.Pod+"/"+c.Name)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		pc.add(Warning, CheckRestarts, "node/"+s.Name, fmt.Sprintf("%d running containers belong to no pod the API server knows (%s): their restarts cannot be predicted, and apply stops if they go",
			len(unknown), strings.Join(unknown, ", ")), "a static pod needs its mirror pod (its namespace must exist); otherwise wait for the deleted pod to end")
	}
	if len(static) > 0 {
		pc.add(Warning, CheckRestarts, "node/"+s.Name, fmt.Sprintf("static pods %s (%d containers) will be recreated: the kubelet derives a static pod's UID from its Pod types, which change between minors (%s to %s; kubernetes#116080), and no hash-skip file can keep a pod whose UID changed",
			strings.Join(static, ", "), s.Recreated, s.Kubelet, t.Version), "expected; apply checks they run again. To keep such a workload running, run it as a DaemonSet")
	}
	if f.HashSkipUnread != "" {
		pc.add(Warning, CheckRestarts, "node/"+s.Name, "the hash-skip file an earlier upgrade left says "+f.HashSkipUnread+": the containers it keeps are predicted as if it were not there",
			"compare it with kubelift's (docs/hash-skip.md); upgrade compat cleanup removes it once no container needs it")
	}
	why := fmt.Sprintf("the kubelet's container hash changes (era %s to %s)", era, t.Catalog.KubeletHashEra)
	switch {
	case era == t.Catalog.KubeletHashEra && f.HashSkipEra != "" && f.HashSkipEra != era:
		why = fmt.Sprintf("they were started in hash era %s, before an earlier upgrade whose hash-skip file stays", f.HashSkipEra)
	case era == t.Catalog.KubeletHashEra:
		why = "their spec hashes differ under " + t.Version.String()
	}
	if s.Restarts > 0 {
		sev := Blocking
		if pc.opts.AllowRestarts {
			sev = Warning
		}
		fix := "bundle kubelift's hash-skip kubelet (make kubelet; bundle create --kubelet-binary), or pass --allow-restarts, or --drain"
		pc.add(sev, CheckRestarts, "node/"+s.Name, fmt.Sprintf("%d of %d running containers would restart: %s and the bundled kubelet does not keep them", s.Restarts, s.Containers, why), fix)
	}
	if s.Protected > 0 {
		pc.add(Info, CheckRestarts, "node/"+s.Name, fmt.Sprintf("%d of %d running containers kept running by the hash-skip file (%s)", s.Protected, s.Containers, why), "")
	}
}
