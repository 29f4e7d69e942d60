package simcluster

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// ReasonKubeletRestarting is the Ready condition's reason (status False)
// that says a node's kubelet is restarting: whoever restarts it (kubelift's
// SSH fleet) sets it, together with the new status.nodeInfo.kubeletVersion,
// and KWOK's node-restart stage makes the node Ready again after the
// cluster's RestartDelay (plus jitter), counted from the condition's
// lastTransitionTime.
const ReasonKubeletRestarting = "KubeletRestarting"

// RestartingStatusPatch is the strategic merge patch of a Node's status
// subresource that marks its kubelet restarting at now, coming back at
// kubeletVersion.
func RestartingStatusPatch(kubeletVersion string, now time.Time) []byte {
	ts := now.UTC().Format(time.RFC3339)
	b, _ := json.Marshal(map[string]any{"status": map[string]any{
		"conditions": []map[string]string{{
			"type": "Ready", "status": "False", "reason": ReasonKubeletRestarting,
			"message": "kubelet is restarting", "lastHeartbeatTime": ts, "lastTransitionTime": ts,
		}},
		"nodeInfo": map[string]string{"kubeletVersion": kubeletVersion},
	}})
	return b
}

// The Node stages are kubelift's (KWOK v0.8.0 plays only the stages its
// configuration names; the pods get KWOK's own pod-ready, pod-complete
// and pod-delete, which hack/build-kwok.sh copies from its module, and
// which v0.7.0 played by default). When several stages match, KWOK
// picks one at random, so the selectors are disjoint on the Ready
// condition:
//
//	node-initialize            Ready missing or not True, reason not KubeletRestarting
//	node-heartbeat-with-lease  Ready True, reason not KubeletRestarting
//	node-restart               Ready reason KubeletRestarting
//
// A restarting node never goes back to Ready early: KWOK keeps one pending
// job per node, and the restart job replaces the heartbeat scheduled while
// it was Ready; and the heartbeat only refreshes lastHeartbeatTime (a
// strategic merge on conditions by type), so even one already in flight
// cannot touch status, reason or lastTransitionTime. The restart's delay
// is anchored on the condition's lastTransitionTime rather than counted
// from the last change KWOK saw, because every update of the Node (the
// controller-manager's taints) makes KWOK schedule the stage again.
const nodeStages = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .reason'
      operator: 'NotIn'
      values:
      - 'KubeletRestarting'
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
      addresses:
      {{ with .status.addresses }}
      {{ YAML . 1 }}
      {{ else }}
      {{ with NodeIP }}
      - address: {{ . | Quote }}
        type: InternalIP
      {{ end }}
      {{ with NodeName }}
      - address: {{ . | Quote }}
        type: Hostname
      {{ end }}
      {{ end }}
      allocatable:
      {{ with .status.allocatable }}
      {{ YAML . 1 }}
      {{ else }}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{ end }}
      capacity:
      {{ with .status.capacity }}
      {{ YAML . 1 }}
      {{ else }}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{ end }}
      {{ $nodeInfo := .status.nodeInfo }}
      {{ $kwokVersion := printf "kwok-%s" Version }}
      nodeInfo:
        architecture: {{ or $nodeInfo.architecture "amd64" }}
        bootID: {{ or $nodeInfo.bootID ` + "`" + `""` + "`" + ` }}
        containerRuntimeVersion: {{ or $nodeInfo.containerRuntimeVersion $kwokVersion }}
        kernelVersion: {{ or $nodeInfo.kernelVersion $kwokVersion }}
        kubeProxyVersion: {{ or $nodeInfo.kubeProxyVersion $kwokVersion }}
        kubeletVersion: {{ or $nodeInfo.kubeletVersion $kwokVersion }}
        machineID: {{ or $nodeInfo.machineID ` + "`" + `""` + "`" + ` }}
        operatingSystem: {{ or $nodeInfo.operatingSystem "linux" }}
        osImage: {{ or $nodeInfo.osImage ` + "`" + `""` + "`" + ` }}
        systemUUID: {{ or $nodeInfo.systemUUID ` + "`" + `""` + "`" + ` }}
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-heartbeat-with-lease
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values:
      - 'True'
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .reason'
      operator: 'NotIn'
      values:
      - 'KubeletRestarting'
  delay:
    durationMilliseconds: {{HEARTBEAT}}
    jitterDurationMilliseconds: {{HEARTBEAT_JITTER}}
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range .status.conditions }}
      - type: {{ .type | Quote }}
        lastHeartbeatTime: {{ $now | Quote }}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-restart
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .reason'
      operator: 'In'
      values:
      - 'KubeletRestarting'
  delay:
    durationMilliseconds: {{DELAY}}
    durationFrom:
      jq:
        expression: '.status.conditions.[] | select( .type == "Ready" ) | .lastTransitionTime // empty | fromdateiso8601 + {{DELAY_S}} | todateiso8601'
    jitterDurationMilliseconds: {{DELAY_JITTER}}
    jitterDurationFrom:
      jq:
        expression: '.status.conditions.[] | select( .type == "Ready" ) | .lastTransitionTime // empty | fromdateiso8601 + {{DELAY_JITTER_S}} | todateiso8601'
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - type: Ready
        status: "True"
        reason: KubeletReady
        message: kubelet is posting ready status
        lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
`

// kwokConfig is KWOK's configuration file: its options, the Node
// stages with the cluster's delays, and podStages (KWOK's own).
func kwokConfig(o Options, podStages string) string {
	ms := func(d time.Duration) string { return fmt.Sprint(d.Milliseconds()) }
	secs := func(d time.Duration) string { return fmt.Sprintf("%g", d.Seconds()) }
	stages := strings.NewReplacer(
		"{{HEARTBEAT}}", ms(o.HeartbeatInterval),
		"{{HEARTBEAT_JITTER}}", ms(o.HeartbeatInterval+o.HeartbeatInterval/60),
		"{{DELAY}}", ms(o.RestartDelay),
		"{{DELAY_S}}", secs(o.RestartDelay),
		"{{DELAY_JITTER}}", ms(o.RestartDelay+o.RestartJitter),
		"{{DELAY_JITTER_S}}", secs(o.RestartDelay+o.RestartJitter),
	).Replace(nodeStages)
	return fmt.Sprintf(`apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  manageAllNodes: true
  nodeLeaseDurationSeconds: %d
  nodeLeaseParallelism: 16
  nodePlayStageParallelism: 16
  podPlayStageParallelism: 16
  # Each node KWOK takes on has its pods listed once: from the watch
  # cache (resourceVersion 0, indexed by spec.nodeName) instead of pages
  # read from etcd, which at 1000 nodes and 5000 pods kept the API server
  # busy for minutes.
  enablePodsOnNodeSyncListPager: false
  podsOnNodeSyncParallelism: 4
  cidr: 10.0.0.1/16
---
%s
%s`, int(o.LeaseDuration.Seconds()), stages, podStages)
}
