package kubeletcompat

import (
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// NamedContainer is a container of a pod, with where it sits.
type NamedContainer struct {
	// Init is true for init containers (restartable sidecars are compared
	// by hash too).
	Init      bool
	Container corev1.Container
}

// ParseContainers reads JSON or YAML holding a Container, a list of
// Containers, or a Pod (its init and regular containers).
func ParseContainers(data []byte) ([]NamedContainer, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("not JSON or YAML: %w", err)
	}
	var probe struct {
		Kind string          `json:"kind"`
		Spec json.RawMessage `json:"spec"`
	}
	if len(js) > 0 && js[0] == '[' {
		var list []corev1.Container
		if err := json.Unmarshal(js, &list); err != nil {
			return nil, fmt.Errorf("container list: %w", err)
		}
		out := make([]NamedContainer, len(list))
		for i := range list {
			out[i] = NamedContainer{Container: list[i]}
		}
		return nonEmpty(out)
	}
	if err := json.Unmarshal(js, &probe); err != nil {
		return nil, err
	}
	if probe.Kind == "Pod" || len(probe.Spec) > 0 {
		var pod corev1.Pod
		if err := json.Unmarshal(js, &pod); err != nil {
			return nil, fmt.Errorf("pod: %w", err)
		}
		var out []NamedContainer
		for _, c := range pod.Spec.InitContainers {
			out = append(out, NamedContainer{Init: true, Container: c})
		}
		for _, c := range pod.Spec.Containers {
			out = append(out, NamedContainer{Container: c})
		}
		return nonEmpty(out)
	}
	if probe.Kind != "" {
		return nil, fmt.Errorf("kind %q: want a Pod, a container or a list of containers", probe.Kind)
	}
	var c corev1.Container
	if err := json.Unmarshal(js, &c); err != nil {
		return nil, fmt.Errorf("container: %w", err)
	}
	return nonEmpty([]NamedContainer{{Container: c}})
}

func nonEmpty(cs []NamedContainer) ([]NamedContainer, error) {
	for _, c := range cs {
		if c.Container.Name == "" {
			return nil, errors.New("a container without a name: is this a container, a list of them, or a Pod?")
		}
	}
	if len(cs) == 0 {
		return nil, errors.New("no containers found")
	}
	return cs, nil
}
