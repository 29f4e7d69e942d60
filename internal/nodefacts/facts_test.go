package nodefacts

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
)

// replay answers every command with a node's recorded output (testdata).
type replay struct{ out []byte }

func (r replay) Run(context.Context, string, io.Reader) ([]byte, error) { return r.out, nil }

func readFixture(t *testing.T, node string) *Facts {
	t.Helper()
	out, err := os.ReadFile("testdata/facts-" + node + ".txt")
	if err != nil {
		t.Fatal(err)
	}
	f, err := Read(context.Background(), replay{out}, node, "/var/lib/kubelift/staged", "v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestReadFactsWorker(t *testing.T) {
	f := readFixture(t, "worker-3")
	if f.Components["kubelet"] != "v1.30.14" || f.Components["kube-apiserver"] != "" {
		t.Errorf("components %v", f.Components)
	}
	// Flags come from what the next start reads: the unit (its ExecStart
	// and Environment=) and its EnvironmentFile.
	if f.FlagSources["kubelet --node-ip"] != "/var/lib/kubelet/kubelet-flags.env" || f.FlagSources["kubelet --config"] != "/etc/systemd/system/kubelet.service" {
		t.Errorf("flag sources %v", f.FlagSources)
	}
	if f.Values["kubelet --node-labels"] != "kubelift.io/sandbox=true,kubelift.io/pool=blue" {
		t.Errorf("--node-labels = %q", f.Values["kubelet --node-labels"])
	}
	if len(f.Staged) != 3 || f.Staged["kubelet"] == "" || f.FreeBytes < 1<<30 {
		t.Errorf("staged %v, free %d", f.Staged, f.FreeBytes)
	}
	if f.ContainersErr != "" || len(f.Containers) != 10 {
		t.Fatalf("%d containers (%s)", len(f.Containers), f.ContainersErr)
	}
	for _, c := range f.Containers {
		if !c.Running || c.Hash == "" || c.PodUID == "" || c.StartedAt.IsZero() {
			t.Errorf("container %+v", c)
		}
	}
}

func TestReadFactsControlPlane(t *testing.T) {
	f := readFixture(t, "cp-1")
	for _, c := range []string{"kubelet", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if f.Components[c] != "v1.30.14" {
			t.Errorf("%s: %q", c, f.Components[c])
		}
	}
	if f.Values["kube-apiserver --disable-admission-plugins"] != "DefaultTolerationSeconds" {
		t.Errorf("--disable-admission-plugins = %q", f.Values["kube-apiserver --disable-admission-plugins"])
	}
	// Flags of a unit's continued ExecStart lines count too.
	if f.FlagSources["kube-apiserver --etcd-servers"] == "" {
		t.Errorf("apiserver flags %v", f.Flags["kube-apiserver"])
	}
}

func TestUnitAndEnvArgs(t *testing.T) {
	unit := "[Service]\nExecStart=/usr/local/bin/kubelet \\\n  --a=1 \\\n  --b\nEnvironment=\"X=--from-env\"\nDescription=--not-a-flag\n"
	if got := unitExecArgs(unit); len(got) != 4 || got[1] != "--a=1" || got[2] != "--b" || got[3] != "--from-env" {
		t.Errorf("ExecStart words %q", got)
	}
	env := "# comment\nKUBELET_ARGS=\"--c=2 --keep-terminated-pod-volumes=false\"\nOTHER='--d'\n"
	if got := envArgs(env); len(got) != 3 || got[1] != "--keep-terminated-pod-volumes=false" || got[2] != "--d" {
		t.Errorf("env words %q", got)
	}
	// kubeadm's drop-in: one quoted assignment carrying two flags.
	kubeadm := "[Service]\nEnvironment=\"KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf\" Y=--y\nExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS\n"
	want := []string{"--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf", "--kubeconfig=/etc/kubernetes/kubelet.conf", "--y", "/usr/bin/kubelet", "$KUBELET_KUBECONFIG_ARGS"}
	if got := unitExecArgs(kubeadm); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("kubeadm drop-in words %q, want %q", got, want)
	}
}

// A flag only on the running command line (its unit no longer has it) is
// not what the next start uses; a component without a unit file is known
// by its command line alone.
func TestFlagsFromUnitBeforeCommandLine(t *testing.T) {
	out := "### version kubelet\nKubernetes v1.30.14\n### cmdline kubelet\n/usr/local/bin/kubelet\n--stale=1\n--v=2\n" +
		"### unit kubelet /etc/systemd/system/kubelet.service\n[Service]\nExecStart=/usr/local/bin/kubelet --v=3\n" +
		"### version kube-proxy\nKubernetes v1.30.14\n### cmdline kube-proxy\n/opt/bin/kube-proxy\n--cluster-cidr=10.0.0.0/8\n"
	f, err := Read(context.Background(), replay{[]byte(out)}, "n", "/var/lib/kubelift/staged", "v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(f.Flags["kubelet"], " ") != "--v" || f.Values["kubelet --v"] != "2" {
		t.Errorf("kubelet flags %v, --v=%q (the running value)", f.Flags["kubelet"], f.Values["kubelet --v"])
	}
	if strings.Join(f.Flags["kube-proxy"], " ") != "--cluster-cidr" || f.Programs["kube-proxy"] != "/opt/bin/kube-proxy" {
		t.Errorf("kube-proxy flags %v, program %q", f.Flags["kube-proxy"], f.Programs["kube-proxy"])
	}
}

// A unit that does not run still names its program: the one systemd
// reads (/etc before /lib), as its drop-ins leave it.
func TestProgramOfAUnitThatDoesNotRun(t *testing.T) {
	out := "### version kubelet\nKubernetes v1.30.14\n### cmdline kubelet\n/usr/local/bin/kubelet\n--v=2\n" +
		"### unit kube-scheduler /etc/systemd/system/kube-scheduler.service\n[Service]\nExecStart=/opt/bin/kube-scheduler \\\n  --v=2\n" +
		"### unit kube-scheduler /lib/systemd/system/kube-scheduler.service\n[Service]\nExecStart=/usr/bin/kube-scheduler\n" +
		"### unit kube-scheduler /etc/systemd/system/kube-scheduler.service.d/10-path.conf\n[Service]\nExecStart=\nExecStart=-/opt/k8s/kube-scheduler --v=3\n" +
		"### unit kube-proxy /etc/systemd/system/kube-proxy.service\n[Service]\nExecStart=/opt/bin/$(touch x)\n"
	f, err := Read(context.Background(), replay{[]byte(out)}, "cp-2", "/var/lib/kubelift/staged", "v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Programs["kube-scheduler"]; got != "/opt/k8s/kube-scheduler" {
		t.Errorf("kube-scheduler's program %q, want the drop-in's /opt/k8s/kube-scheduler", got)
	}
	if got := f.Units["kube-scheduler"]; got != "/etc/systemd/system/kube-scheduler.service" {
		t.Errorf("kube-scheduler's unit %q", got)
	}
	if _, runs := f.Components["kube-scheduler"]; runs {
		t.Errorf("kube-scheduler counted as running: %v", f.Components)
	}
	if f.Programs["kubelet"] != "/usr/local/bin/kubelet" {
		t.Errorf("kubelet's program %q (the running one's)", f.Programs["kubelet"])
	}
	if _, ok := f.Programs["kube-proxy"]; ok || len(f.Bad) != 1 || !strings.Contains(f.Bad[0].Error(), "kube-proxy program") {
		t.Errorf("a unit's program that is no clean path: programs %v, refused %v", f.Programs, f.Bad)
	}
}

// A command line read a moment after its process exec'd is empty: it is
// no value to refuse, and the unit's ExecStart names the program.
func TestEmptyCommandLineIsNotRefused(t *testing.T) {
	out := "### version kubelet\nKubernetes v1.30.14\n### cmdline kubelet\n\n" +
		"### unit kubelet /etc/systemd/system/kubelet.service\n[Service]\nExecStart=/usr/local/bin/kubelet --v=3\n"
	f, err := Read(context.Background(), replay{[]byte(out)}, "worker-1", "/var/lib/kubelift/staged", "v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Bad) != 0 || f.Components["kubelet"] != "v1.30.14" || f.Programs["kubelet"] != "/usr/local/bin/kubelet" || f.Values["kubelet --v"] != "3" {
		t.Errorf("refused %v, components %v, programs %v, --v=%q", f.Bad, f.Components, f.Programs, f.Values["kubelet --v"])
	}
}

// The hash-skip file an earlier upgrade left: its era, parsed where it
// enters; anything else refused, naming the node, the field and the value.
func TestReadFactsHashSkipEra(t *testing.T) {
	read := func(out string) *Facts {
		t.Helper()
		f, err := Read(context.Background(), replay{[]byte(out)}, "worker-1", "/var/lib/kubelift/staged", "v1.32.13")
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	if f := read("### hash-skip\n2 json-without-resources\n"); f.HashSkipEra != "json-without-resources" || f.HashSkipUnread != "" || len(f.Bad) != 0 {
		t.Fatalf("era %q, unread %q, refused %v", f.HashSkipEra, f.HashSkipUnread, f.Bad)
	}
	// Not taken, and said, but the node is not refused: cleanup and
	// rollback must still reach it.
	for out, want := range map[string]string{
		"### hash-skip\n2 $(reboot)\n":              `oldHashEra "$(reboot)"`,
		"### hash-skip\n1 json-without-resources\n": `schemaVersion "1", want 2`,
		"### hash-skip\n \n":                        `schemaVersion ""`,
	} {
		if f := read(out); f.HashSkipEra != "" || !strings.Contains(f.HashSkipUnread, want) || len(f.Bad) != 0 {
			t.Errorf("%q: era %q, unread %q (want %q), refused %v", out, f.HashSkipEra, f.HashSkipUnread, want, f.Bad)
		}
	}
}

func TestReadFactsCgroup(t *testing.T) {
	read := func(out string) *Facts {
		t.Helper()
		f, err := Read(context.Background(), replay{[]byte(out)}, "worker-1", "/var/lib/kubelift/staged", "v1.35.4")
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := read("### kubelet-config\nfailCgroupV1: false # on cgroup v1 until the OS moves\n### cgroupfs\ntmpfs\n")
	if f.Cgroup != 1 || f.FailCgroupV1 == nil || *f.FailCgroupV1 || len(f.Bad) != 0 {
		t.Errorf("cgroup %d, failCgroupV1 %v, refused %v", f.Cgroup, f.FailCgroupV1, f.Bad)
	}
	// The flag, read from the unit, overrides the file.
	f = read("### kubelet-config\nfailCgroupV1: false\n### unit kubelet /etc/systemd/system/kubelet.service\nExecStart=/usr/local/bin/kubelet --fail-cgroupv1\n### cgroupfs\ncgroup2fs\n")
	if f.Cgroup != 2 || f.FailCgroupV1 == nil || !*f.FailCgroupV1 {
		t.Errorf("cgroup %d, failCgroupV1 %v", f.Cgroup, f.FailCgroupV1)
	}
	// What the kubelet itself takes: YAML 1.1's no in the file, 0 as the
	// flag's value.
	if f = read("### kubelet-config\nfailCgroupV1: no\n"); f.FailCgroupV1 == nil || *f.FailCgroupV1 || len(f.Bad) != 0 {
		t.Errorf("failCgroupV1: no -> %v, refused %v", f.FailCgroupV1, f.Bad)
	}
	if f = read("### cmdline kubelet\n/usr/bin/kubelet\n--fail-cgroupv1=0\n"); f.FailCgroupV1 == nil || *f.FailCgroupV1 || f.FailCgroupV1Source != "kubelet --fail-cgroupv1" {
		t.Errorf("--fail-cgroupv1=0 -> %v from %q", f.FailCgroupV1, f.FailCgroupV1Source)
	}
	// Neither says: the kubelet's default.
	if f = read("### cgroupfs\ntmpfs\n"); f.FailCgroupV1 != nil {
		t.Errorf("failCgroupV1 %v, want not set", *f.FailCgroupV1)
	}
	f = read("### kubelet-config\nfailCgroupV1: $(reboot)\n### cgroupfs\nnfs\n")
	if f.Cgroup != 0 || f.FailCgroupV1 != nil || len(f.Bad) != 2 {
		t.Fatalf("cgroup %d, failCgroupV1 %v, refused %v", f.Cgroup, f.FailCgroupV1, f.Bad)
	}
	for i, want := range []string{`node worker-1: failCgroupV1 (kubelet configuration file) "$(reboot)" refused: want true or false`, `node worker-1: file system type of /sys/fs/cgroup "nfs" refused`} {
		if !strings.Contains(f.Bad[i].Error(), want) {
			t.Errorf("refused[%d] = %q, want %q", i, f.Bad[i].Error(), want)
		}
	}
}

// What the runtime says of itself over CRI: name, version and CRI API
// version (crictl version), the cgroup driver it tells the kubelet
// (crictl runtime-config), or that it answers Unimplemented; the
// kubelet's own cgroup driver from its configuration file, overridden by
// its flag. Values that do not parse are refused, naming node, field and
// value; a crictl that cannot reach the runtime is said, not refused.
func TestReadFactsCRI(t *testing.T) {
	read := func(out string) *Facts {
		t.Helper()
		f, err := Read(context.Background(), replay{[]byte(out)}, "worker-1", "/var/lib/kubelift/staged", "v1.31.4")
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	// As crictl v1.34.0 prints them against containerd 2.1.4.
	f := read("### kubelet-config\nfailCgroupV1: false\ncgroupDriver: systemd\n" +
		"### cri-version\nVersion:  0.1.0\nRuntimeName:  containerd\nRuntimeVersion:  v2.1.4\nRuntimeApiVersion:  v1\n" +
		"### cri-config\ncgroup driver:   SYSTEMD\n")
	if len(f.Bad) != 0 || f.CRI == nil {
		t.Fatalf("refused %v, CRI %+v (%s)", f.Bad, f.CRI, f.CRIErr)
	}
	if got := *f.CRI; got.Runtime.String() != "containerd v2.1.4" || got.APIVersion != "v1" || !got.RuntimeConfig || got.CgroupDriver != "systemd" {
		t.Errorf("CRI %+v", got)
	}
	if f.KubeletCgroupDriver != "systemd" || f.FailCgroupV1 == nil || *f.FailCgroupV1 {
		t.Errorf("kubelet's cgroup driver %q, failCgroupV1 %v", f.KubeletCgroupDriver, f.FailCgroupV1)
	}
	// containerd 1.7 predates RuntimeConfig; the flag overrides the file.
	f = read("### cmdline kubelet\n/usr/bin/kubelet\n--cgroup-driver=cgroupfs\n### kubelet-config\ncgroupDriver: systemd\n" +
		"### cri-version\nVersion:  0.1.0\nRuntimeName:  containerd\nRuntimeVersion:  1.7.24\nRuntimeApiVersion:  v1\n" +
		"### cri-config\nE1127 get runtime config: call RuntimeConfig RPC: rpc error: code = Unimplemented desc = unknown method RuntimeConfig for service runtime.v1.RuntimeService\n### cri-config-failed\n")
	if len(f.Bad) != 0 || f.CRI == nil || f.CRI.RuntimeConfig || f.CRI.CgroupDriver != "" || f.CRI.ConfigErr != "" || f.CRI.Runtime.String() != "containerd v1.7.24" {
		t.Errorf("refused %v, CRI %+v", f.Bad, f.CRI)
	}
	if f.KubeletCgroupDriver != "cgroupfs" || f.KubeletCgroupDriverSource != "kubelet --cgroup-driver" {
		t.Errorf("kubelet's cgroup driver %q from %q", f.KubeletCgroupDriver, f.KubeletCgroupDriverSource)
	}
	// crictl cannot reach the runtime: said, not refused.
	f = read("### cri-version\ntime=\"2026-11-28\" level=fatal msg=\"validate service connection: connection refused\"\n### cri-version-failed\n### cri-config\nx\n### cri-config-failed\n")
	if len(f.Bad) != 0 || f.CRI != nil || !strings.Contains(f.CRIErr, "connection refused") {
		t.Errorf("refused %v, CRI %+v, error %q", f.Bad, f.CRI, f.CRIErr)
	}
	f = read("### kubelet-config\ncgroupDriver: $(reboot)\n" +
		"### cri-version\nVersion:  0.1.0\nRuntimeName:  containerd\nRuntimeVersion:  v2.1.4; rm -rf /\nRuntimeApiVersion:  v1\n")
	g := read("### cri-version\nRuntimeName:  containerd\nRuntimeVersion:  v2.1.4\nRuntimeApiVersion:  v1'\n")
	h := read("### cri-version\nRuntimeName:  containerd\nRuntimeVersion:  v2.1.4\nRuntimeApiVersion:  v1\n### cri-config\ncgroup driver:   SYSTEMD;x\n")
	bad := append(append(f.Bad, g.Bad...), h.Bad...)
	want := []string{
		`node worker-1: cgroupDriver (kubelet configuration file) "$(reboot)" refused: want systemd or cgroupfs`,
		`node worker-1: crictl version: RuntimeName and RuntimeVersion "containerd v2.1.4; rm -rf /" refused`,
		`node worker-1: crictl version: RuntimeApiVersion "v1'" refused`,
		`node worker-1: crictl runtime-config: cgroup driver "SYSTEMD;x" refused`,
	}
	if len(bad) != len(want) {
		t.Fatalf("refused %v", bad)
	}
	for i := range want {
		if !strings.Contains(bad[i].Error(), want[i]) {
			t.Errorf("refused[%d] = %q, want %q", i, bad[i].Error(), want[i])
		}
	}
	if f.CRI != nil || g.CRI != nil || f.KubeletCgroupDriver != "" {
		t.Errorf("refused values kept: %+v %+v %q", f.CRI, g.CRI, f.KubeletCgroupDriver)
	}
}

// Where containerd and runc run from is read from facts' containerd
// section, each path checked: one that is not absolute and clean, or
// holds a shell's characters, is refused naming the node and the field.
func TestReadContainerdPaths(t *testing.T) {
	out := "### containerd\nbinary /opt/containerd/bin/containerd\nconfig /etc/containerd/config.toml\nrunc /usr/local/sbin/runc\n### df\n"
	f, err := Read(context.Background(), replay{[]byte(out)}, "worker-1", "/var/lib/kubelift/staged", "v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	want := ContainerdPaths{Binary: "/opt/containerd/bin/containerd", Config: "/etc/containerd/config.toml", Runc: "/usr/local/sbin/runc"}
	if f.Containerd != want || len(f.Bad) != 0 {
		t.Errorf("containerd %+v, bad %v; want %+v", f.Containerd, f.Bad, want)
	}

	// crictl on the PATH; the CNI plugins' directory as crictl info says
	// it: containerd 2.x's binDirs (its first), 1.x's binDir.
	for _, tc := range []struct{ info, want string }{
		{`{"status":{},"config":{"containerd":{},"cni":{"binDir":"","binDirs":["/usr/libexec/cni","/opt/cni/bin"],"confDir":"/etc/cni/net.d"}}}`, "/usr/libexec/cni"},
		{`{"status":{},"config":{"cni":{"binDir":"/opt/cni/bin","confDir":"/etc/cni/net.d","maxConfNum":1}}}`, "/opt/cni/bin"},
	} {
		out := "### containerd\ncrictl /usr/local/bin/crictl\n### cri-info\n" + tc.info + "\n### df\n"
		f, err := Read(context.Background(), replay{[]byte(out)}, "worker-1", "/var/lib/kubelift/staged", "v1.31.4")
		if err != nil {
			t.Fatal(err)
		}
		if want := (ContainerdPaths{Crictl: "/usr/local/bin/crictl", CNIBinDir: tc.want}); f.Containerd != want || len(f.Bad) != 0 {
			t.Errorf("containerd %+v, bad %v; want %+v", f.Containerd, f.Bad, want)
		}
	}
	// A directory as a config may write it is taken clean.
	out = "### cri-info\n" + `{"config":{"cni":{"binDir":"/opt/cni/bin/"}}}` + "\n"
	if f, err = Read(context.Background(), replay{[]byte(out)}, "worker-1", "/var/lib/kubelift/staged", "v1.31.4"); err != nil {
		t.Fatal(err)
	}
	if f.Containerd.CNIBinDir != "/opt/cni/bin" || len(f.Bad) != 0 {
		t.Errorf("containerd %+v, bad %v; want /opt/cni/bin", f.Containerd, f.Bad)
	}
	// crictl info failed, is not JSON, names no directory or one that is
	// not a plain absolute path: said (CNIErr, refusing a tools move),
	// not refused with the node, whose other facts stand.
	for out, why := range map[string]string{
		"### cri-info\n### cri-info-failed\n":                                            "crictl info failed",
		"### cri-info\n{\"status\":{},\"config\":{}}\n":                                  "names no config.cni.binDirs",
		"### cri-info\nWARN[0000] not JSON\n":                                            `crictl info is not JSON (invalid character 'W' looking for beginning of value): "WARN[0000] not JSON"`,
		"### cri-info\n{\"config\":{\"cni\":{\"binDirs\":[\"/opt/cni/bin;reboot\"]}}}\n": `crictl info: config.cni.binDirs "/opt/cni/bin;reboot" refused`,
	} {
		f, err := Read(context.Background(), replay{[]byte("### containerd\nrunc /usr/sbin/runc\n" + out)}, "worker-1", "/var/lib/kubelift/staged", "v1.31.4")
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Bad) != 0 || f.Containerd.CNIBinDir != "" || !strings.Contains(f.Containerd.CNIErr, why) || f.Containerd.Runc != "/usr/sbin/runc" {
			t.Errorf("%q: containerd %+v, bad %v; want why %q", out, f.Containerd, f.Bad, why)
		}
	}
	// crictl that is not a clean path is refused, as runc is.
	if f, err = Read(context.Background(), replay{[]byte("### containerd\ncrictl crictl\n")}, "worker-1", "/var/lib/kubelift/staged", "v1.31.4"); err != nil {
		t.Fatal(err)
	}
	if len(f.Bad) != 1 || f.Bad[0].Field != "crictl (command -v crictl)" || f.Containerd.Crictl != "" {
		t.Errorf("containerd %+v, bad %+v; want crictl refused", f.Containerd, f.Bad)
	}

	out = "### containerd\nbinary /usr/bin/containerd\nconfig /etc/c.toml; reboot\nrunc ../runc\n"
	if f, err = Read(context.Background(), replay{[]byte(out)}, "worker-1", "/var/lib/kubelift/staged", "v1.31.4"); err != nil {
		t.Fatal(err)
	}
	if f.Containerd != (ContainerdPaths{Binary: "/usr/bin/containerd"}) || len(f.Bad) != 2 ||
		f.Bad[0].Field != "containerd --config" || f.Bad[1].Field != "runc (command -v runc)" || f.Bad[0].Node != "worker-1" {
		t.Errorf("containerd %+v, bad %+v", f.Containerd, f.Bad)
	}
}

// A binary cluster's etcd member: its version read apart from the
// Kubernetes components ("etcd Version: 3.5.35", never among Components,
// whose versions are Kubernetes'), its flags in the --flag VALUE form etcd
// units write as well as --flag=VALUE (never a $VARIABLE taken for a
// value). A version that does not parse is not taken, and says why
// (EtcdUnread), without refusing the node: only an etcd move needs it.
func TestReadFactsEtcdMember(t *testing.T) {
	member := func(version, urls string) string {
		return "### version etcd\n" + version + "\n### cmdline etcd\n/usr/local/bin/etcd\n--name\ncp-1\n--data-dir=/var/lib/etcd\n--advertise-client-urls\n" + urls + "\n--log-level\nwarn\n--enable-v2\n--debug\n--peer-auto-tls\n$ETCD_ARGS\n\n" +
			"### unit etcd /etc/systemd/system/etcd.service\n[Service]\nExecStart=/usr/local/bin/etcd --name cp-1\n"
	}
	read := func(out string) *Facts {
		t.Helper()
		f, err := Read(context.Background(), replay{[]byte(out)}, "cp-1", "/var/lib/kubelift/staged", "v1.31.4")
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := read(member("etcd Version: 3.5.35", "http://10.0.0.11:2379,http://127.0.0.1:2379"))
	if len(f.Bad) != 0 || f.Etcd != "v3.5.35" || f.Components["etcd"] != "" || f.Programs["etcd"] != "/usr/local/bin/etcd" {
		t.Fatalf("refused %v, etcd %q, components %v, programs %v", f.Bad, f.Etcd, f.Components, f.Programs)
	}
	for k, want := range map[string]string{"etcd --name": "cp-1", "etcd --data-dir": "/var/lib/etcd", "etcd --advertise-client-urls": "http://10.0.0.11:2379,http://127.0.0.1:2379", "etcd --log-level": "warn"} {
		if got := f.Values[k]; got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"etcd --enable-v2", "etcd --debug", "etcd --peer-auto-tls"} {
		if got := f.Values[k]; got != "" {
			t.Errorf("%s = %q, want none (a flag alone, or before a $VARIABLE)", k, got)
		}
	}
	f = read(member("etcd Version: 3.5.35$(reboot)", "http://10.0.0.11:2379"))
	if f.Etcd != "" || len(f.Bad) != 0 || !strings.HasPrefix(f.EtcdUnread, `etcd --version "etcd Version: 3.5.35$(reboot)": `) {
		t.Errorf("a forged version: etcd %q, unread %q, refused %+v", f.Etcd, f.EtcdUnread, f.Bad)
	}
}

// The Kubernetes components' flags are read in the --flag=VALUE form
// only: their words mix several sources, and a boolean given alone
// (--fail-cgroupv1) is followed by another source's word (the next
// Environment= value, the program, a $VARIABLE), never its value.
func TestABooleanFlagTakesNoOtherSourcesWord(t *testing.T) {
	out := "### version kubelet\nKubernetes v1.30.14\n### cmdline kubelet\n/usr/local/bin/kubelet\n--fail-cgroupv1\n--v=3\n\n" +
		"### unit kubelet /etc/systemd/system/kubelet.service\n[Service]\nEnvironment=\"KUBELET_EXTRA_ARGS=--fail-cgroupv1\"\nExecStart=/usr/local/bin/kubelet $KUBELET_EXTRA_ARGS --fail-cgroupv1 $KUBELET_ARGS\n"
	f, err := Read(context.Background(), replay{[]byte(out)}, "worker-1", "/var/lib/kubelift/staged", "v1.31.4")
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Bad) != 0 || f.FailCgroupV1 == nil || !*f.FailCgroupV1 {
		t.Errorf("refused %+v, failCgroupV1 %v (want true: the flag alone)", f.Bad, f.FailCgroupV1)
	}
}
