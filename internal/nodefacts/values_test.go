package nodefacts

import (
	"context"
	"io"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const forged = "$(touch /tmp/MARK)v1.30.14"

func TestParseVersionRefusesWhatDoesNotParse(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"v1.30.14", "v1.30.14", true},
		{"v1.30.14+k3s1", "v1.30.14", true},
		{forged, "", false},
		{"v1.30.14$(id)", "", false},
		{"v1.30.14;reboot", "", false},
		{" v1.30.14", "", false},
		{"v1.30.14\n", "", false},
		{"1.30.14", "", false},
		{"v1.31.0-rc.1", "", false},
		{"v1.30", "", false},
		{"", "", false},
	} {
		v, bad := ParseVersion("worker-3", "status.nodeInfo.kubeletVersion", tc.in)
		if (bad == nil) != tc.ok {
			t.Errorf("%q: %v", tc.in, bad)
			continue
		}
		if tc.ok && v.String() != tc.want {
			t.Errorf("%q: %s, want %s", tc.in, v, tc.want)
		}
		if !tc.ok && !strings.Contains(bad.Error(), "node worker-3: status.nodeInfo.kubeletVersion") {
			t.Errorf("%q: the error does not name node and field: %v", tc.in, bad)
		}
	}
}

func TestParseVersionLine(t *testing.T) {
	if v, bad := ParseVersionLine("n", "kubelet --version", "Kubernetes v1.31.4"); bad != nil || v.String() != "v1.31.4" {
		t.Errorf("%v %v", v, bad)
	}
	for _, line := range []string{"Kubernetes " + forged, "Kubernetes v1.31.4 $(id)", "", "Kubernetes v1.31.4\nrm -rf /"} {
		if _, bad := ParseVersionLine("n", "kubelet --version", line); bad == nil {
			t.Errorf("%q accepted", line)
		}
	}
}

func TestCheckPath(t *testing.T) {
	for p, ok := range map[string]bool{"/var/lib/kubelet": true, "/usr/local/bin/kubelet": true, "var/lib": false, "/var/../etc": false,
		"/var//lib": false, "/var/lib/": false, "/var/lib\nx": false, "": false} {
		if (CheckPath("n", "kubelet --root-dir", p) == nil) != ok {
			t.Errorf("%q: want ok=%v", p, ok)
		}
	}
	for e, ok := range map[string]bool{"https://127.0.0.1:2379": true, "http://etcd:2379": true, "https://x:1;id": false, "file:///x": false, "127.0.0.1:2379": false} {
		if (CheckEndpoint("n", "kube-apiserver --etcd-servers", e) == nil) != ok {
			t.Errorf("%q: want ok=%v", e, ok)
		}
	}
	if _, ok := Under("/var/lib/kubelift/staged", "../../etc"); ok {
		t.Error("under accepted ..")
	}
}

func TestKubeletVersions(t *testing.T) {
	node := func(name, v string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: v}}}
	}
	got, bad := KubeletVersions([]corev1.Node{node("cp-1", "v1.30.14"), node("worker-3", forged), node("Bad_Name", "v1.30.14")})
	if len(got) != 1 || got["cp-1"] != "v1.30.14" {
		t.Errorf("versions %v", got)
	}
	if len(bad) != 2 || bad[0].Node != "worker-3" || bad[0].Value != forged || bad[1].Field != "metadata.name" {
		t.Errorf("refused %+v", bad)
	}
}

// fixedRunner answers every command with out, and records them.
type fixedRunner struct {
	out  string
	cmds []string
}

func (r *fixedRunner) Run(_ context.Context, cmd string, _ io.Reader) ([]byte, error) {
	r.cmds = append(r.cmds, cmd)
	return []byte(r.out), nil
}

// TestReadFactsRefusesForgedValues: a binary whose --version line, a
// program path or a flag a script would get that does not parse is
// refused, named, and left out of the facts.
func TestReadFactsRefusesForgedValues(t *testing.T) {
	r := &fixedRunner{out: "### version kubelet\nKubernetes " + forged + "\n" +
		"### cmdline kubelet\n/usr/local/bin/kubelet\n--root-dir=/var/lib/../../etc\n\n" +
		"### version kube-apiserver\nKubernetes v1.30.14\n" +
		"### cmdline kube-apiserver\n/usr/local/bin/$(reboot)\n--etcd-servers=https://127.0.0.1:2379;id\n\n" +
		"### staged\n### df\n/dev/vda1 100 10 90 10% /\n### crictl\n{\"containers\":[]}\n"}
	f, err := Read(context.Background(), r, "worker-3", "/var/lib/kubelift/staged", "v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	if f.Components["kubelet"] != "" || f.Components["kube-apiserver"] != "v1.30.14" {
		t.Errorf("components %v", f.Components)
	}
	if f.Values["kubelet --root-dir"] != "" || f.Values["kube-apiserver --etcd-servers"] != "" || f.Programs["kube-apiserver"] != "" {
		t.Errorf("refused values kept: %v %v", f.Values, f.Programs)
	}
	var fields []string
	for _, b := range f.Bad {
		fields = append(fields, b.Field)
	}
	want := "kubelet --version,kube-apiserver program (/proc/PID/cmdline),kubelet --root-dir,kube-apiserver --etcd-servers"
	if strings.Join(fields, ",") != want {
		t.Errorf("refused %q, want %q", strings.Join(fields, ","), want)
	}
	if len(r.cmds) != 1 || !strings.HasPrefix(r.cmds[0], "sh -c ") {
		t.Errorf("commands %q", r.cmds)
	}
}

// A node's container runtime as its kubelet reports it: NAME://VERSION,
// with or without the v, a distribution's suffix dropped; anything else
// refused naming node, field and value; nothing reported is no runtime.
func TestParseRuntime(t *testing.T) {
	for in, want := range map[string]string{
		"containerd://2.1.4":             "containerd v2.1.4",
		"containerd://v2.3.7":            "containerd v2.3.7",
		"containerd://1.6.20~ds1":        "containerd v1.6.20",
		"containerd://1.7.12-0ubuntu4.1": "containerd v1.7.12",
		"cri-o://1.31.2":                 "cri-o v1.31.2",
	} {
		rt, bad := ParseRuntime("worker-1", in)
		if bad != nil || rt.String() != want {
			t.Errorf("%q: %v, %v; want %s", in, rt, bad, want)
		}
	}
	for _, in := range []string{"containerd", "containerd://", "containerd://1.7", "contai\nerd://1.7.1", "containerd://1.7.1 ", "containerd://1.7.1;reboot", "docker://$(id)", "containerd://1.7.1\n", "://1.7.1", "containerd://99999999999.1.1"} {
		_, bad := ParseRuntime("worker-1", in)
		if bad == nil || bad.Node != "worker-1" || bad.Field != "status.nodeInfo.containerRuntimeVersion" || bad.Value != in {
			t.Errorf("%q: %+v, want refused naming node, field and value", in, bad)
		}
	}
	if rt, bad := ParseRuntime("worker-1", ""); bad != nil || rt.Name != "" {
		t.Errorf("empty: %v %v", rt, bad)
	}
}

// A feature gate's setting is read as the component reads it: each
// "NAME=BOOL" of --feature-gates, spaces around them allowed, the last
// one winning; a name only a prefix of another's, or a setting that is
// no boolean, sets nothing.
func TestFeatureGate(t *testing.T) {
	for value, want := range map[string][2]bool{
		"": {false, false},
		"A=true, KubeletCgroupDriverFromCRI = false":                       {false, true},
		"KubeletCgroupDriverFromCRI=True":                                  {true, true},
		"KubeletCgroupDriverFromCRI=false,KubeletCgroupDriverFromCRI=true": {true, true},
		"XKubeletCgroupDriverFromCRI=false":                                {false, false},
		"KubeletCgroupDriverFromCRI=maybe":                                 {false, false},
	} {
		f := &Facts{Values: map[string]string{"kubelet --feature-gates": value}}
		if on, set := f.FeatureGate("kubelet", "KubeletCgroupDriverFromCRI"); on != want[0] || set != want[1] {
			t.Errorf("--feature-gates=%q: on %v, set %v; want %v, %v", value, on, set, want[0], want[1])
		}
	}
}
