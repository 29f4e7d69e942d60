package catalog

import "testing"

// A runtime version is supported when a line lists it or it is newer than
// every line; an older line, or one between those listed, is not. The
// built-in catalog holds containerd's own table: 1.7 through v1.35, 2.2
// and later only from v1.36.
func TestRuntimeSupport(t *testing.T) {
	c, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		kube, runtime, version string
		supported, listed      bool
	}{
		{"v1.31.4", "containerd", "v1.7.20", true, true},
		{"v1.31.4", "containerd", "v1.7.19", false, true},
		{"v1.31.4", "containerd", "v1.6.33", false, true},
		{"v1.31.4", "containerd", "v2.0.0", true, true},
		{"v1.31.4", "containerd", "v2.3.7", true, true},  // newer than every line
		{"v1.31.4", "containerd", "v1.8.0", false, true}, // between lines: there is no 1.8
		{"v1.35.4", "containerd", "v1.7.28", true, true},
		{"v1.35.4", "containerd", "v2.0.6", false, true},
		{"v1.36.3", "containerd", "v1.7.30", false, true},
		{"v1.36.3", "containerd", "v2.1.9", false, true},
		{"v1.36.3", "containerd", "v2.2.0", true, true},
		{"v1.36.3", "containerd", "v3.0.0", true, true},
		{"v1.36.3", "cri-o", "v1.36.0", false, false},
	} {
		rel, err := c.Lookup(tc.kube)
		if err != nil {
			t.Fatal(err)
		}
		v, err := ParseVersion(tc.version)
		if err != nil {
			t.Fatal(err)
		}
		if supported, listed := rel.RuntimeSupport(tc.runtime, v); supported != tc.supported || listed != tc.listed {
			t.Errorf("%s with %s %s: supported %v listed %v, want %v %v", tc.kube, tc.runtime, tc.version, supported, listed, tc.supported, tc.listed)
		}
	}
	for _, s := range []string{"v1.7.20+", "v1.7", "v1.7.20-v1.7.30", "v2.0.4"} {
		if _, err := ParseRuntimeRange(s); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	for _, s := range []string{"v1.7+", "1.7.20++", "v1.7.x+", "+"} {
		if _, err := ParseRuntimeRange(s); err == nil {
			t.Errorf("%s accepted", s)
		}
	}
}
