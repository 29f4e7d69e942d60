package nodescript

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// hostile is a value as a forged Node status or binary could report it:
// every character a shell treats specially.
const hostile = "$(touch PWNED)`touch PWNED2`;touch PWNED3 'x' \"y\" \\ v1.30.14\n|&<>*?"

// goldenArgs are the arguments each golden command is made with: the
// hostile value in every position.
var goldenArgs = map[string][]string{
	"facts":                 {"/var/lib/kubelift/staged/" + hostile, "/var/lib/kubelift/staged", "kubelet", "kube-apiserver"},
	"list-staged":           {"/var/lib/kubelift/staged/" + hostile, "https://" + hostile, hostile},
	"stage-file":            {"/var/lib/kubelift/staged/v1.31.4", "kubelet", hostile, "1000", "zstd", "0"},
	"pull-file":             {"/var/lib/kubelift/staged/v1.31.4", "kubelet", hostile, "1000", "https://registry.example:5000/v2/library/kubelift-files/kubelet/blobs/sha256:" + hostile, "registry.example:5000", "zstd", "300"},
	"backup":                {"/var/lib/kubelift/backup/" + hostile, "kubelet", "/usr/local/bin/kubelet", hostile, "/var/lib/kubelet", "cpu_manager_state"},
	"swap":                  {"/var/lib/kubelift/staged/v1.31.4/kubelet", hostile, "/usr/local/bin/kubelet", "kubelet"},
	"restore":               {"/var/lib/kubelift/backup/" + hostile, "/usr/local/bin/kubelet", "kubelet", "/var/lib/kubelet", "kubelift-hash-skip.json", "cpu_manager_state"},
	"put-file":              {"/var/lib/kubelift/kubeadm/upgrade-" + hostile + ".yaml", "0600"},
	"write-file":            {"/var/lib/kubelet/kubelift-hash-skip.json", `{"oldKubeletVersion":"` + hostile + `"}`},
	"running":               {"kubelet"},
	"installed":             {"/usr/local/bin/" + hostile},
	"containers":            {},
	"healthz":               {"http://127.0.0.1:10256/healthz?" + hostile},
	"etcd-snapshot":         {"/var/lib/kubelift/backup/" + hostile + "/etcd.db", "https://127.0.0.1:2379", "/etc/etcd/ca.pem", "", hostile},
	"exists":                {"/var/lib/kubelet/" + hostile},
	"check-file":            {"/var/lib/kubelift/staged/" + hostile + "/kubeadm", hostile},
	"read-file":             {"/var/lib/kubelift/backup/" + hostile + "/etcd-snapshot.db"},
	"remove":                {"/var/lib/kubelet/" + hostile},
	"start":                 {hostile},
	"kubeadm-start":         {"/var/lib/kubelift/kubeadm", "upgrade-apply-v1.31.4-1", "/var/lib/kubelift/staged/v1.31.4/kubeadm", "upgrade", "apply", hostile, "--yes"},
	"kubeadm-status":        {"/var/lib/kubelift/kubeadm", "upgrade-apply-" + hostile},
	"kubeadm-etcd-snapshot": {"/var/lib/kubelift/backup/" + hostile + "/etcd.db", "/var/lib/etcd", "/etc/kubernetes/pki/etcd"},
	"kubeadm-manifests":     {"/etc/kubernetes/manifests", "/etc/kubernetes/tmp", "kube-apiserver", hostile},
	"kubeadm-restore-manifest": {"/etc/kubernetes/tmp/kubeadm-backup-manifests-" + hostile + "/kube-apiserver.yaml", "/etc/kubernetes/manifests/kube-apiserver.yaml",
		"/etc/kubernetes/tmp/kubelift-rollback-manifests-" + hostile},
	"runtime-swap": {"/var/lib/kubelift/backup/" + hostile, "/var/lib/kubelift/staged/v1.31.4/containerd", hostile, "/var/lib/kubelift/staged/v1.31.4/runc", hostile,
		"/usr/local/sbin/runc", "/usr/local/bin", "/etc/containerd/config.toml", "migrate", "containerd", hostile},
	"runtime-restore": {"/var/lib/kubelift/backup/" + hostile, "/usr/local/bin", "/usr/local/sbin/runc", "/etc/containerd/config.toml", "containerd"},
	"tools-swap": {"/var/lib/kubelift/backup/" + hostile, "/var/lib/kubelift/staged/v1.31.4/cni-plugins", hostile, "/opt/cni/bin",
		"/var/lib/kubelift/staged/v1.31.4/crictl", hostile, "/usr/local/bin/crictl"},
	"tools-restore": {"/var/lib/kubelift/backup/" + hostile, "/opt/cni/bin", "/usr/local/bin/crictl"},
	"etcd-status":   {"/usr/local/bin/etcdctl", "http://10.0.0.1:2379," + hostile, "/etc/etcd/ca.pem", "", hostile},
	"etcd-swap":     {"/var/lib/kubelift/backup/" + hostile + "/etcd", "/var/lib/kubelift/staged/v1.31.4/etcd", hostile, "/usr/local/bin", "etcd"},
	"etcd-restore":  {"/var/lib/kubelift/backup/" + hostile + "/etcd", "/usr/local/bin", hostile},
	"agent-step":    {"/var/lib/kubelift/agent/" + hostile, "60"},
}

// TestGolden pins each script's command, byte for byte, with a hostile
// value in its arguments: the script text is the embedded constant and
// every argument a quoted word after it.
func TestGolden(t *testing.T) {
	if len(All()) != len(goldenArgs) {
		t.Fatalf("%d scripts, %d golden argument lists: give each script one", len(All()), len(goldenArgs))
	}
	for _, s := range All() {
		t.Run(s.Name, func(t *testing.T) {
			args, ok := goldenArgs[s.Name]
			if !ok {
				t.Fatalf("no golden arguments for %s", s.Name)
			}
			got := s.Command(args...)
			file := filepath.Join("testdata", s.Name+".golden")
			if *update {
				if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (go test ./internal/nodescript -update writes it)", err)
			}
			if got != string(want) {
				t.Errorf("command differs from %s:\n%s", file, got)
			}
			if !strings.HasPrefix(got, "sh -c "+quoteForTest(s.Text)+" kubelift-"+s.Name) {
				t.Errorf("the script's text is not the constant: %.80q", got)
			}
			back, backArgs, err := Parse(got)
			if err != nil || back.Name != s.Name || strings.Join(backArgs, "\x00") != strings.Join(args, "\x00") {
				t.Errorf("Parse: %v %q %q", err, back.Name, backArgs)
			}
		})
	}
}

func quoteForTest(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// TestHostileArgumentsStayData runs scripts under a real sh with the
// hostile value as arguments, in a temporary directory: no command in it
// runs, and it arrives byte for byte where it is data.
func TestHostileArgumentsStayData(t *testing.T) {
	dir := t.TempDir()
	run := func(cmd string) (string, error) {
		c := exec.Command("sh", "-c", cmd)
		c.Dir = dir
		out, err := c.CombinedOutput()
		return string(out), err
	}
	file := filepath.Join(dir, "f"+hostile)
	if out, err := run(WriteFile.Command(file, hostile)); err != nil {
		t.Fatalf("write-file: %v: %s", err, out)
	}
	data, err := os.ReadFile(file)
	if err != nil || string(data) != hostile+"\n" {
		t.Fatalf("write-file wrote %q, %v", data, err)
	}
	if out, err := run(Exists.Command(file)); err != nil || out != "yes\n" {
		t.Fatalf("exists: %q %v", out, err)
	}
	put := func(mode, content string) (string, error) {
		c := exec.Command("sh", "-c", PutFile.Command(file, mode))
		c.Dir, c.Stdin = dir, strings.NewReader(content)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	if out, err := put("0640", hostile); err != nil {
		t.Fatalf("put-file: %v: %s", err, out)
	}
	if data, err := os.ReadFile(file); err != nil || string(data) != hostile {
		t.Fatalf("put-file wrote %q, %v", data, err)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("put-file's mode: %v %v", fi.Mode(), err)
	}
	for _, mode := range []string{"0640; touch x", "4755", "0"} {
		if out, err := put(mode, "changed"); err == nil || !strings.Contains(out, "want 3 octal digits") {
			t.Fatalf("put-file took mode %q: %v %s", mode, err, out)
		}
	}
	if data, _ := os.ReadFile(file); string(data) != hostile {
		t.Fatalf("a refused put-file changed the file: %q", data)
	}
	// Its directory made where missing; a directory in FILE's place
	// refused; no temporary file left either way.
	deep := filepath.Join(dir, "new"+hostile, "kubeadm", "upgrade.yaml")
	c := exec.Command("sh", "-c", PutFile.Command(deep, "600"))
	c.Stdin = strings.NewReader("x")
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("put-file into a new directory: %v %s", err, out)
	}
	c = exec.Command("sh", "-c", PutFile.Command(filepath.Dir(deep), "600"))
	c.Stdin = strings.NewReader("x")
	if out, err := c.CombinedOutput(); err == nil || !strings.Contains(string(out), "is a directory") {
		t.Fatalf("put-file over a directory: %v %s", err, out)
	}
	for _, d := range []string{dir, filepath.Dir(deep)} {
		left, _ := filepath.Glob(filepath.Join(d, "*.kubelift-*"))
		if len(left) != 0 {
			t.Fatalf("put-file left %v", left)
		}
	}
	// list-staged lists what it can name on a line of its own: a file
	// named with anything but [A-Za-z0-9._-] is left out (it is no file
	// kubelift staged), a plain one is listed with its sum.
	if err := os.WriteFile(filepath.Join(dir, "kubelet"), []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(ListStaged.Command(dir)); err != nil || strings.Contains(out, "PWNED") ||
		!strings.Contains(out, "8254c329a92850f6d539dd376f4816ee2764517da5e0235514af433164480d7a  kubelet\n") {
		t.Fatalf("list-staged: %q %v", out, err)
	}
	// backup's FROM is matched as data: a binary printing the hostile
	// value as its version is not "FROM" unless it is exactly that.
	bin := filepath.Join(dir, "bin")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho 'Kubernetes v1.30.14'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := run(Backup.Command(filepath.Join(dir, "backup", hostile), "kubelet", bin, hostile)); err == nil || !strings.Contains(out, "no backup of the old binary") {
		t.Fatalf("backup took a binary at v1.30.14 for %q: %v %s", hostile, err, out)
	}
	if out, err := run(Backup.Command(filepath.Join(dir, "backup", hostile), "kubelet", bin, "v1.30.14")); err != nil {
		t.Fatalf("backup: %v: %s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "backup", hostile, "kubelet")); err != nil {
		t.Fatalf("backup did not land under the hostile directory name, as data: %v", err)
	}
	if out, err := run(Remove.Command(file)); err != nil {
		t.Fatalf("remove: %v: %s", err, out)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("remove left %s: %v", file, err)
	}
	for _, mark := range []string{"PWNED", "PWNED2", "PWNED3"} {
		if _, err := os.Stat(filepath.Join(dir, mark)); err == nil {
			t.Errorf("a hostile argument ran as a command: %s exists", mark)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for _, cmd := range []string{
		"rm -rf /",
		"sh -c 'echo hi' kubelift-remove x", // not the script's text
		"sh -c " + quoteForTest(Remove.Text) + " kubelift-exists x", // another script's name
		"sh -c " + quoteForTest(Remove.Text) + " remove x",          // no kubelift- name
		"sh -c 'unterminated",
	} {
		if _, _, err := Parse(cmd); err == nil {
			t.Errorf("Parse accepted %.60q", cmd)
		}
	}
}

// kubeadm-start runs the program detached with its arguments as data,
// kubeadm-status follows it to its exit status, a failed run is started
// again (its output kept) and a succeeded one is not.
func TestKubeadmStartAndStatus(t *testing.T) {
	dir := t.TempDir()
	sh := func(cmd string) string {
		out, err := exec.Command("sh", "-c", cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return string(out)
	}
	prog := filepath.Join(dir, "kubeadm")
	// Exits with the status in file "code" (3, then 0), printing its arguments.
	if err := os.WriteFile(prog, []byte("#!/bin/sh\nprintf '%s\\n' \"$@\"\nexit \"$(cat "+filepath.Join(dir, "code")+")\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	wait := func() string {
		for i := 0; i < 100; i++ {
			out := sh(KubeadmStatus.Command(dir, "run"))
			if !strings.HasPrefix(out, "running") {
				return out
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("still running after 5s")
		return ""
	}
	for i, tc := range []struct{ code, start, status string }{{"3", "started", "exit 3"}, {"0", "started", "exit 0"}, {"0", "done", "exit 0"}} {
		if err := os.WriteFile(filepath.Join(dir, "code"), []byte(tc.code), 0o644); err != nil {
			t.Fatal(err)
		}
		if out := sh(KubeadmStart.Command(dir, "run", prog, "upgrade", hostile)); strings.TrimSpace(out) != tc.start {
			t.Fatalf("run %d: kubeadm-start said %q, want %s", i, out, tc.start)
		}
		out := wait()
		first, log, _ := strings.Cut(out, "\n")
		if first != tc.status || !strings.Contains(log, hostile) {
			t.Fatalf("run %d: kubeadm-status said %q, want %s and the hostile argument as data", i, out, tc.status)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "run.log.previous")); err != nil {
		t.Errorf("the failed run's output was not kept: %v", err)
	}
	if out := sh(KubeadmStatus.Command(dir, "never")); !strings.HasPrefix(out, "lost") {
		t.Errorf("status of a run never started: %q", out)
	}
	for _, mark := range []string{"PWNED", "PWNED2", "PWNED3"} {
		if _, err := os.Stat(mark); err == nil {
			t.Errorf("a hostile argument ran as a command: %s exists", mark)
		}
	}
}

// kubeadm-manifests prints the current manifests and then kubeadm's
// backups, newest first, each file once in base64; kubeadm-restore-manifest
// keeps the current manifest and renames the backup over it, leaving no
// temporary file where the kubelet reads manifests.
func TestKubeadmManifestsAndRestore(t *testing.T) {
	root := t.TempDir()
	manifests, tmp := filepath.Join(root, "manifests"), filepath.Join(root, "tmp")
	write := func(p, content string) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(manifests, "kube-apiserver.yaml"), "new")
	write(filepath.Join(manifests, "etcd.yaml"), "etcd")
	write(filepath.Join(tmp, "kubeadm-backup-manifests-2026-11-24-10-00-00", "kube-apiserver.yaml"), "older")
	write(filepath.Join(tmp, "kubeadm-backup-manifests-2026-11-25-10-00-00", "kube-apiserver.yaml"), "old")
	write(filepath.Join(tmp, "kubeadm-backup-etcd-2026-11-25-10-00-00", "kube-apiserver.yaml"), "not a manifest backup")
	out, err := exec.Command("sh", "-c", KubeadmManifests.Command(manifests, tmp, "kube-apiserver", "kube-scheduler", hostile)).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	want := strings.Join([]string{
		"file " + manifests + "/kube-apiserver.yaml", b64("new"),
		"file " + tmp + "/kubeadm-backup-manifests-2026-11-25-10-00-00/kube-apiserver.yaml", b64("old"),
		"file " + tmp + "/kubeadm-backup-manifests-2026-11-24-10-00-00/kube-apiserver.yaml", b64("older"),
	}, "\n") + "\n"
	if string(out) != want {
		t.Fatalf("kubeadm-manifests printed\n%s\nwant\n%s", out, want)
	}

	keep := filepath.Join(tmp, "kubelift-rollback-manifests-1")
	backup := filepath.Join(tmp, "kubeadm-backup-manifests-2026-11-25-10-00-00", "kube-apiserver.yaml")
	for i := 0; i < 2; i++ { // a second run restores again and keeps the first copy
		if out, err := exec.Command("sh", "-c", KubeadmRestoreManifest.Command(backup, filepath.Join(manifests, "kube-apiserver.yaml"), keep)).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	for p, want := range map[string]string{filepath.Join(manifests, "kube-apiserver.yaml"): "old", filepath.Join(keep, "kube-apiserver.yaml"): "new", backup: "old"} {
		if got, err := os.ReadFile(p); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v; want %q", p, got, err, want)
		}
	}
	entries, err := os.ReadDir(manifests)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Errorf("manifests dir holds %v, want only etcd.yaml and kube-apiserver.yaml", entries)
	}
	if out, err := exec.Command("sh", "-c", KubeadmRestoreManifest.Command(filepath.Join(tmp, "none.yaml"), filepath.Join(manifests, "kube-apiserver.yaml"), keep)).CombinedOutput(); err == nil || !strings.Contains(string(out), "no manifest at") {
		t.Errorf("a missing backup: %v, %s", err, out)
	}
}

// TestStagedFileSumFallsBack: stage-file takes OpenSSL's sha256 when it
// answers with one (it is asked: the wrapper marks it), and sha256sum's
// when OpenSSL is missing or answers with anything else; a sum that does
// not match is asked of sha256sum too before the file is removed. So a
// node without OpenSSL, or with a broken one, is staged as before, and a
// wrong file is refused either way.
func TestStagedFileSumFallsBack(t *testing.T) {
	content := []byte(strings.Repeat("kubelet bytes ", 1000))
	sum := sha256hex(content)
	realSSL, err := exec.LookPath("openssl")
	if err != nil {
		t.Fatal(err)
	}
	fakes := map[string]string{
		"no openssl":      "",
		"openssl":         "#!/bin/sh\ntouch \"$MARK\"\nexec " + realSSL + " \"$@\"\n",
		"openssl garbage": "#!/bin/sh\necho garbage\n",
		"openssl fails":   "#!/bin/sh\nexit 1\n",
		"openssl short":   "#!/bin/sh\necho 'abc *stdin'\n",
		"openssl 63 hex":  "#!/bin/sh\necho " + sum[:63] + "\n",
		"openssl wrong":   "#!/bin/sh\necho '" + strings.Repeat("ab", 32) + " *stdin'\n",
	}
	for name, fake := range fakes {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			bin := filepath.Join(dir, "bin")
			if err := os.Mkdir(bin, 0o755); err != nil {
				t.Fatal(err)
			}
			// Only what the script needs, and the fake (or no) openssl.
			for _, tool := range []string{"sh", "cat", "cut", "wc", "tr", "mkdir", "rm", "mv", "chmod", "sha256sum", "touch"} {
				p, err := exec.LookPath(tool)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
					t.Fatal(err)
				}
			}
			if fake != "" {
				if err := os.WriteFile(filepath.Join(bin, "openssl"), []byte(fake), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			mark := filepath.Join(dir, "openssl-asked")
			stage := func(want string) (string, error) {
				c := exec.Command(filepath.Join(bin, "sh"), "-c", StageFile.Command(filepath.Join(dir, "v"), "kubelet", want, strconv.Itoa(len(content)), "none", "0"))
				c.Env = []string{"PATH=" + bin, "MARK=" + mark}
				c.Stdin = bytes.NewReader(content)
				out, err := c.CombinedOutput()
				return string(out), err
			}
			if out, err := stage(sum); err != nil {
				t.Fatalf("stage-file refused the right file: %v: %s", err, out)
			}
			if got, err := os.ReadFile(filepath.Join(dir, "v", "kubelet")); err != nil || !bytes.Equal(got, content) {
				t.Fatalf("staged %d bytes, %v", len(got), err)
			}
			if _, err := os.Stat(mark); (err == nil) != (name == "openssl") {
				t.Errorf("OpenSSL asked: %v", err == nil)
			}
			wrong := strings.Repeat("0", 64)
			out, err := stage(wrong)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 65 || !strings.Contains(out, "sha256 "+sum) {
				t.Fatalf("stage-file took a file whose sum is not the signed one: %v: %s", err, out)
			}
		})
	}
}

// TestStagingYieldsToWorkloads: stage-file runs its decoder at nice 19
// and best-effort I/O level 7; in its own session (an SSH session's) the
// session's autogroup takes nice 19 too, and in a caller's session it
// leaves the caller's alone. A fake zstd reports what it runs with.
func TestStagingYieldsToWorkloads(t *testing.T) {
	content := []byte(strings.Repeat("kubelet bytes ", 1000))
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	zstd := "#!/bin/sh\n{ nice; ionice -p $$; cat /proc/self/autogroup; } >\"$MARK\"\nexec cat\n"
	if err := os.WriteFile(filepath.Join(bin, "zstd"), []byte(zstd), 0o755); err != nil {
		t.Fatal(err)
	}
	stage := func(t *testing.T, vdir string, nested bool) (mark, leader string) {
		t.Helper()
		markFile := filepath.Join(dir, filepath.Base(vdir)+".mark")
		cmd := StageFile.Command(filepath.Join(dir, vdir), "kubelet", sha256hex(content), strconv.Itoa(len(content)), "zstd", "0")
		c := exec.Command("sh", "-c", cmd)
		if nested {
			// The session's leader runs a shell that runs the script:
			// the session is not the script's own.
			c = exec.Command("sh", "-c", `sh -c "$1; true"; cat /proc/$$/autogroup`, "leader", cmd)
		}
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		c.Env = []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "MARK=" + markFile}
		c.Stdin = bytes.NewReader(content)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("stage-file: %v: %s", err, out)
		}
		b, err := os.ReadFile(markFile)
		if err != nil {
			t.Fatal(err)
		}
		return string(b), string(out)
	}
	t.Run("own session", func(t *testing.T) {
		mark, _ := stage(t, "own", false)
		lines := strings.Split(strings.TrimSpace(mark), "\n")
		if len(lines) != 3 || lines[0] != "19" || lines[1] != "best-effort: prio 7" || !strings.HasSuffix(lines[2], " nice 19") {
			t.Errorf("the decoder ran with\n%s\nwant nice 19, best-effort: prio 7, its autogroup at nice 19", mark)
		}
	})
	t.Run("a caller's session", func(t *testing.T) {
		mark, leader := stage(t, "nested", true)
		if !strings.HasPrefix(mark, "19\nbest-effort: prio 7\n") {
			t.Errorf("the decoder ran with\n%s\nwant nice 19 and best-effort 7", mark)
		}
		if !strings.HasSuffix(mark, " nice 0\n") || !strings.HasSuffix(leader, " nice 0\n") {
			t.Errorf("the caller's session was lowered: the decoder's %q, the leader's %q", mark, leader)
		}
	})
}

func sha256hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestSumFunctionsAgree: pull-file carries the same sha256_of and
// yield_to_workloads as stage-file (each script stands alone), so the
// tests above hold for it.
func TestSumFunctionsAgree(t *testing.T) {
	fn := func(s Script, name string) string {
		_, rest, ok := strings.Cut(s.Text, "\n"+name+"() {\n")
		body, _, ok2 := strings.Cut(rest, "\n}\n")
		if !ok || !ok2 {
			t.Fatalf("%s has no %s", s.Name, name)
		}
		return body
	}
	for _, name := range []string{"sha256_of", "yield_to_workloads"} {
		if a, b := fn(StageFile, name), fn(PullFile, name); a != b {
			t.Errorf("stage-file's %s:\n%s\npull-file's:\n%s", name, a, b)
		}
	}
	if !strings.Contains(PullFile.Text, "\nyield_to_workloads\n") {
		t.Error("pull-file does not call yield_to_workloads")
	}
}

// running (and facts, which carries the same main_pid) says a unit runs
// only when its main process is the same before and after its version is
// read: a unit that restarts meanwhile (crash-looping) or whose process
// ended is not running, rather than a line from a process that was on its
// way out.
func TestRunningOnlyASteadyMainProcess(t *testing.T) {
	steady := exec.Command("sleep", "60")
	if err := steady.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = steady.Process.Kill(); _ = steady.Wait() }()
	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Fatal(err)
	}
	version, err := exec.Command("sleep", "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(version), "\n")
	pid := strconv.Itoa(steady.Process.Pid)
	for _, tc := range []struct {
		name, first, later, want string
	}{
		{"steady", pid, pid, first + "\npid " + pid + "\n"},
		{"restarted while read", pid, "999999", ""},
		{"ended", strconv.Itoa(ended.Process.Pid), strconv.Itoa(ended.Process.Pid), ""},
		{"not started", "0", "0", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			// systemctl as the node's: the unit's MainPID, first one, then another.
			fake := "#!/bin/sh\nn=$(cat \"$DIR/calls\" 2>/dev/null || echo 0); echo $((n + 1)) >\"$DIR/calls\"\n" +
				"if [ \"$n\" = 0 ]; then echo \"MainPID=$FIRST\"; else echo \"MainPID=$LATER\"; fi\n"
			if err := os.WriteFile(filepath.Join(dir, "systemctl"), []byte(fake), 0o755); err != nil {
				t.Fatal(err)
			}
			c := exec.Command("sh", "-c", Running.Command("kube-apiserver"))
			c.Env = []string{"PATH=" + dir + ":" + os.Getenv("PATH"), "DIR=" + dir, "FIRST=" + tc.first, "LATER=" + tc.later}
			out, err := c.CombinedOutput()
			if err != nil || string(out) != tc.want {
				t.Errorf("running said %q (%v), want %q", out, err, tc.want)
			}
		})
	}
	// facts carries the same main_pid and the same check.
	if !strings.Contains(Facts.Text, mainPID(t, Running)) || !strings.Contains(Facts.Text, `if [ "$(main_pid "$c")" = "$pid" ] && [ -e "/proc/$pid/exe" ]`) {
		t.Error("facts does not carry running's main_pid and its check")
	}
}

func mainPID(t *testing.T, s Script) string {
	t.Helper()
	_, rest, ok := strings.Cut(s.Text, "\nmain_pid() {\n")
	body, _, ok2 := strings.Cut(rest, "\n}\n")
	if !ok || !ok2 {
		t.Fatalf("%s has no main_pid", s.Name)
	}
	return body
}

// Every exit code a script uses to say something (above 2) is one of the
// named ones the engine tells apart, with the meaning the constant gives.
func TestExitCodesAreNamed(t *testing.T) {
	named := map[string]bool{}
	for _, c := range []int{ExitUsage, ExitDataErr, ExitNoInput, ExitUnavailable, ExitTempFail} {
		named[strconv.Itoa(c)] = true
	}
	// A command, not words: at a line's start or after ;, && or ||.
	re := regexp.MustCompile(`(?m)(?:^\s*|;\s*|&&\s*|\|\|\s*)exit ([0-9]+)\b`)
	entries, err := files.ReadDir("scripts")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		b, err := files.ReadFile("scripts/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			if n, _ := strconv.Atoi(m[1]); n > 2 && !named[m[1]] {
				t.Errorf("%s: exit %s is not one of nodescript's named exit codes", e.Name(), m[1])
			}
			seen[m[1]] = true
		}
	}
	for c := range named {
		if !seen[c] {
			t.Errorf("exit %s is named but no script uses it", c)
		}
	}
}
