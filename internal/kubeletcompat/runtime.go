package kubeletcompat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Labels the kubelet puts on every container it creates.
const (
	labelPodUID        = "io.kubernetes.pod.uid"
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelContainerName = "io.kubernetes.container.name"
)

// RuntimeContainer is a container as a node's runtime reports it, with the
// hashes the kubelet that created it recorded.
type RuntimeContainer struct {
	ID                       string
	PodUID, Namespace, Pod   string
	Name                     string
	Running                  bool
	StartedAt                time.Time
	Hash                     string
	HashWithoutResources     string
	hasHash, hasWithoutResrc bool
}

// ParseCrictl reads the output of `crictl inspect ID...` (one JSON object
// per container) or of `crictl ps -o json` (containerd, CRI-O). Sandboxes
// and containers the kubelet did not create are left out.
func ParseCrictl(data []byte) ([]RuntimeContainer, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var out []RuntimeContainer
	for {
		var doc struct {
			Status     *crictlStatus  `json:"status"`
			Containers []crictlStatus `json:"containers"`
		}
		if err := dec.Decode(&doc); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("crictl JSON: %w", err)
		}
		switch {
		case doc.Status != nil:
			c, err := doc.Status.container()
			if err != nil {
				return nil, err
			}
			out = appendKubelet(out, c)
		case doc.Containers != nil:
			for i := range doc.Containers {
				c, err := doc.Containers[i].container()
				if err != nil {
					return nil, err
				}
				out = appendKubelet(out, c)
			}
		default:
			return nil, errors.New("crictl JSON: neither `crictl inspect` (status) nor `crictl ps -o json` (containers) output")
		}
	}
	return out, nil
}

// crictlStatus covers both shapes: inspect's status (RFC 3339 times) and
// ps's containers (protojson: int64 nanoseconds as strings).
type crictlStatus struct {
	ID       string `json:"id"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	State       string            `json:"state"`
	CreatedAt   json.RawMessage   `json:"createdAt"`
	StartedAt   json.RawMessage   `json:"startedAt"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func (s *crictlStatus) container() (RuntimeContainer, error) {
	c := RuntimeContainer{
		ID: s.ID, PodUID: s.Labels[labelPodUID], Namespace: s.Labels[labelPodNamespace], Pod: s.Labels[labelPodName],
		Name: s.Labels[labelContainerName], Running: s.State == "CONTAINER_RUNNING",
	}
	c.Hash, c.hasHash = s.Annotations[HashAnnotation]
	c.HashWithoutResources, c.hasWithoutResrc = s.Annotations[HashWithoutResourcesAnnotation]
	// inspect has startedAt; ps only createdAt, which precedes the start.
	ts := s.StartedAt
	if len(ts) == 0 {
		ts = s.CreatedAt
	}
	t, err := parseCRITime(ts)
	if err != nil {
		return c, fmt.Errorf("container %s: %w", s.ID, err)
	}
	c.StartedAt = t
	return c, nil
}

func parseCRITime(raw json.RawMessage) (time.Time, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return time.Time{}, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		var n int64
		if err := json.Unmarshal(raw, &n); err != nil {
			return time.Time{}, fmt.Errorf("time %s: %w", raw, err)
		}
		return time.Unix(0, n), nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Unix(0, n), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("time %q: %w", s, err)
	}
	return t, nil
}

// ParseDockerInspect reads `docker inspect ID...` of dockershim containers
// (kubelets up to 1.23), whose annotations are labels prefixed "annotation.".
func ParseDockerInspect(data []byte) ([]RuntimeContainer, error) {
	var list []struct {
		ID    string `json:"Id"`
		State struct {
			Running   bool   `json:"Running"`
			StartedAt string `json:"StartedAt"`
		} `json:"State"`
		Config struct {
			Labels map[string]string `json:"Labels"`
		} `json:"Config"`
	}
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("docker inspect JSON: %w", err)
	}
	var out []RuntimeContainer
	for _, d := range list {
		l := d.Config.Labels
		c := RuntimeContainer{ID: d.ID, PodUID: l[labelPodUID], Namespace: l[labelPodNamespace], Pod: l[labelPodName],
			Name: l[labelContainerName], Running: d.State.Running}
		c.Hash, c.hasHash = l[DockerLabelPrefix+HashAnnotation]
		c.HashWithoutResources, c.hasWithoutResrc = l[DockerLabelPrefix+HashWithoutResourcesAnnotation]
		if d.State.StartedAt != "" {
			t, err := time.Parse(time.RFC3339Nano, d.State.StartedAt)
			if err != nil {
				return nil, fmt.Errorf("container %s: StartedAt: %w", d.ID, err)
			}
			c.StartedAt = t
		}
		out = appendKubelet(out, c)
	}
	return out, nil
}

// appendKubelet keeps containers the kubelet created (they carry the pod
// UID and container name labels; sandboxes have no container name).
func appendKubelet(out []RuntimeContainer, c RuntimeContainer) []RuntimeContainer {
	if c.PodUID == "" || c.Name == "" {
		return out
	}
	return append(out, c)
}

// ParseTasks reads the output of `ctr -n k8s.io tasks ls` (a header, then
// "ID PID STATUS" per task) into each running task's PID by container ID.
// A line that does not parse is an error naming it: it comes from a node.
func ParseTasks(data []byte) (map[string]int, error) {
	out := map[string]int{}
	for i, line := range bytes.Split(data, []byte("\n")) {
		f := strings.Fields(string(line))
		if len(f) == 0 || (i == 0 && len(f) == 3 && f[0] == "TASK") {
			continue
		}
		if len(f) != 3 || !validContainerID(f[0]) {
			return nil, fmt.Errorf("ctr tasks ls: line %d %q is not ID PID STATUS", i+1, truncate(string(line)))
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil || pid < 0 {
			return nil, fmt.Errorf("ctr tasks ls: line %d: PID %q is not a number", i+1, truncate(f[1]))
		}
		if f[2] == "RUNNING" && pid > 0 {
			out[f[0]] = pid
		}
	}
	return out, nil
}

// validContainerID: what a runtime names a container (hex, or the
// letters, digits, '-' and '_' some runtimes use), at most 128 bytes.
func validContainerID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
