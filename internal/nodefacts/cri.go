package nodefacts

import (
	"regexp"
	"strings"
)

// CRI is what a node's container runtime says of itself over the
// Container Runtime Interface, asked by crictl on the node: its name and
// version (as status.nodeInfo.containerRuntimeVersion carries them, but
// from the runtime itself), the CRI API version it serves, and the
// cgroup driver it tells the kubelet.
type CRI struct {
	Runtime Runtime `json:"runtime"`
	// APIVersion is the CRI API version the runtime serves ("v1").
	APIVersion string `json:"apiVersion"`
	// RuntimeConfig: the runtime answers CRI's RuntimeConfig (containerd
	// 2.0+, CRI-O 1.28+), which kubelets from v1.31 ask for the cgroup
	// driver (KubeletCgroupDriverFromCRI); false when it answered
	// Unimplemented.
	RuntimeConfig bool `json:"runtimeConfig"`
	// CgroupDriver is the driver it answered: "systemd" or "cgroupfs";
	// "" when it does not implement RuntimeConfig or could not be asked
	// (ConfigErr).
	CgroupDriver string `json:"cgroupDriver,omitempty"`
	ConfigErr    string `json:"configError,omitempty"`
}

var apiVersionRE = regexp.MustCompile(`^v[0-9]{1,3}((alpha|beta)[0-9]{1,3})?$`)

// ParseCRIVersion reads what `crictl version` printed:
//
//	Version:  0.1.0
//	RuntimeName:  containerd
//	RuntimeVersion:  v2.1.4
//	RuntimeApiVersion:  v1
//
// Each value is held to what it may be, and refused (naming the node,
// the field and the value) when it is not.
func ParseCRIVersion(node, out string) (*CRI, *BadValue) {
	kv := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			kv[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	name, version, api := kv["RuntimeName"], kv["RuntimeVersion"], kv["RuntimeApiVersion"]
	if name == "" || version == "" || api == "" {
		return nil, &BadValue{Node: node, Field: "crictl version", Value: lastLines(out, 4), Reason: "want RuntimeName, RuntimeVersion and RuntimeApiVersion lines"}
	}
	rt, bad := ParseRuntime(node, name+"://"+version)
	if bad != nil {
		bad.Field = "crictl version: RuntimeName and RuntimeVersion"
		bad.Value = name + " " + version
		bad.Reason = "want a runtime's name and MAJOR.MINOR.PATCH, as containerd's v2.1.4"
		return nil, bad
	}
	if !apiVersionRE.MatchString(api) {
		return nil, &BadValue{Node: node, Field: "crictl version: RuntimeApiVersion", Value: api, Reason: "want a CRI API version such as v1"}
	}
	return &CRI{Runtime: rt, APIVersion: api}, nil
}

// setConfig reads what `crictl runtime-config` printed ("cgroup driver:
// SYSTEMD"), or, when it failed, whether the runtime answered
// Unimplemented (it predates RuntimeConfig) or could not be asked.
func (c *CRI) setConfig(node, out string, failed bool) *BadValue {
	if failed {
		if strings.Contains(out, "Unimplemented") || strings.Contains(out, "unknown method RuntimeConfig") {
			return nil
		}
		c.ConfigErr = "crictl runtime-config: " + strings.TrimSpace(lastLines(out, 3))
		return nil
	}
	for _, line := range strings.Split(out, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "cgroup driver:")
		if !ok {
			continue
		}
		switch d := strings.TrimSpace(v); d {
		case "SYSTEMD", "CGROUPFS":
			c.RuntimeConfig, c.CgroupDriver = true, strings.ToLower(d)
			return nil
		default:
			return &BadValue{Node: node, Field: "crictl runtime-config: cgroup driver", Value: d, Reason: "want SYSTEMD or CGROUPFS"}
		}
	}
	// A runtime that answers without a Linux section: no driver said.
	c.RuntimeConfig = true
	return nil
}
