package sandbox

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubelift/kubelift/internal/catalog"
)

// These tests need no sandbox of their own (nothing boots): the files a
// binary sandbox with Config.Etcd and Config.EtcdTo writes, checked in a
// temporary directory.

// fakeEtcd is a directory with etcd's programs, each its name as content.
func fakeEtcd(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range etcdPrograms {
		if err := os.WriteFile(filepath.Join(dir, p), []byte("#!/bin/sh\necho "+p+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// etcdState is a binary sandbox's state with three control planes and a
// worker, each machine's tree below a temporary directory.
func etcdState(t *testing.T, etcd string) *State {
	t.Helper()
	root := t.TempDir()
	s := &State{Dir: root, Name: "kl", Subnet: "10.77.0", OldVersion: "v1.30.14", NewVersion: "v1.31.4", Etcd: etcd}
	s.Machines = []Machine{{Name: "admin", Role: "admin", Address: "10.77.0.1"}, {Name: "internet", Role: "internet", Address: "127.0.0.1", NetNS: "kl-internet"},
		{Name: "cp-1", Role: "control-plane", Address: "10.77.0.11"}, {Name: "cp-2", Role: "control-plane", Address: "10.77.0.12"},
		{Name: "cp-3", Role: "control-plane", Address: "10.77.0.13"}, {Name: "worker-1", Role: "worker", Address: "10.77.0.21"}}
	for i := range s.Machines {
		m := &s.Machines[i]
		m.Root = filepath.Join(root, "machines", m.Name)
		if err := os.MkdirAll(m.fsPath("etc/systemd/system/multi-user.target.wants"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if etcd != "" {
		s.Binaries.Etcd = fakeEtcd(t)
	}
	return s
}

// With Config.Etcd every control plane runs a member of one cluster, its
// programs in /usr/local/bin, and every API server names every member,
// its own first.
func TestEtcdMemberOnEveryControlPlane(t *testing.T) {
	s := etcdState(t, "v3.5.35")
	const cluster = "cp-1=http://10.77.0.11:2380,cp-2=http://10.77.0.12:2380,cp-3=http://10.77.0.13:2380"
	servers := map[string]string{
		"cp-1": "http://10.77.0.11:2379,http://10.77.0.12:2379,http://10.77.0.13:2379",
		"cp-2": "http://10.77.0.12:2379,http://10.77.0.11:2379,http://10.77.0.13:2379",
		"cp-3": "http://10.77.0.13:2379,http://10.77.0.11:2379,http://10.77.0.12:2379",
	}
	for _, m := range s.Nodes()[:3] {
		t.Run(m.Name, func(t *testing.T) {
			if err := s.etcdFiles(&m); err != nil {
				t.Fatal(err)
			}
			unit, err := os.ReadFile(m.fsPath("etc/systemd/system/etcd.service"))
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{
				"ExecStart=/usr/local/bin/etcd --name " + m.Name + " --data-dir /var/lib/etcd ",
				"--listen-client-urls http://" + m.Address + ":2379,http://127.0.0.1:2379 --advertise-client-urls http://" + m.Address + ":2379 ",
				"--listen-peer-urls http://" + m.Address + ":2380 --initial-advertise-peer-urls http://" + m.Address + ":2380 ",
				"--initial-cluster " + cluster + " --initial-cluster-state new --initial-cluster-token kubelift-sandbox ",
				"--unsafe-no-fsync --log-level warn\n", "Restart=always\n",
			} {
				if !strings.Contains(string(unit), want) {
					t.Errorf("etcd.service lacks %q:\n%s", want, unit)
				}
			}
			if _, err := os.Readlink(m.fsPath("etc/systemd/system/multi-user.target.wants/etcd.service")); err != nil {
				t.Errorf("etcd.service is not enabled: %v", err)
			}
			for _, p := range etcdPrograms {
				fi, err := os.Stat(m.fsPath("usr/local/bin/" + p))
				if err != nil || fi.Mode().Perm() != 0o755 {
					t.Errorf("/usr/local/bin/%s: %v, mode %v, want 0755", p, err, fi.Mode())
				}
			}
			if fi, err := os.Stat(m.fsPath("var/lib/etcd")); err != nil || fi.Mode().Perm() != 0o700 {
				t.Errorf("/var/lib/etcd: %v, want a directory of mode 0700", err)
			}
			if got := s.etcdServers(&m); got != servers[m.Name] {
				t.Errorf("--etcd-servers %s, want %s", got, servers[m.Name])
			}
		})
	}
}

// Without Config.Etcd, cp-1 alone runs Debian's etcd and every API
// server names it: what every sandbox ran before.
func TestDebianEtcdOnCP1Alone(t *testing.T) {
	s := etcdState(t, "")
	for _, m := range s.Nodes()[:3] {
		if err := s.etcdFiles(&m); err != nil {
			t.Fatal(err)
		}
		unit, err := os.ReadFile(m.fsPath("etc/systemd/system/etcd.service"))
		if m.Name == "cp-1" {
			if err != nil || !strings.Contains(string(unit), "ExecStart=/usr/bin/etcd --name cp-1 ") {
				t.Errorf("cp-1: %v, want Debian's etcd:\n%s", err, unit)
			}
		} else if err == nil {
			t.Errorf("%s runs etcd too:\n%s", m.Name, unit)
		}
		if _, err := os.Stat(m.fsPath("usr/local/bin/etcd")); err == nil {
			t.Errorf("%s has /usr/local/bin/etcd", m.Name)
		}
		if got, want := s.etcdServers(&m), "http://10.77.0.11:2379"; got != want {
			t.Errorf("%s: --etcd-servers %s, want %s", m.Name, got, want)
		}
	}
}

func TestCheckEtcd(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" for none
	}{
		{"binary", Config{Etcd: "v3.5.35", EtcdTo: "v3.6.16"}, ""},
		{"served alone", Config{EtcdTo: "v3.6.16"}, ""},
		{"kubeadm", Config{Kubeadm: true, Etcd: "v3.5.35"}, "runs on a binary sandbox"},
		{"kubeadm served", Config{Kubeadm: true, EtcdTo: "v3.6.16"}, "EtcdTo v3.6.16"},
		{"no v", Config{Etcd: "3.5.35"}, `Etcd "3.5.35": want an etcd release`},
		{"pre-release", Config{EtcdTo: "v3.6.0-rc.1"}, `EtcdTo "v3.6.0-rc.1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkEtcd(tc.cfg)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("checkEtcd: %v, want %q", err, tc.want)
			}
		})
	}
}

// With Config.EtcdTo the stand-in internet serves etcd's release archive
// where upstream publishes it, laid out as upstream's, below the host
// bundle create's --url-mirror sends github.com to.
func TestInternetServesEtcdRelease(t *testing.T) {
	s := etcdState(t, "")
	s.EtcdTo = "v3.6.16"
	s.Binaries.EtcdTo = fakeEtcd(t)
	s.Binaries.New = t.TempDir() // nothing built: every Kubernetes file a stand-in
	inet, err := s.Machine("internet")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.internetFiles(inet); err != nil {
		t.Fatal(err)
	}
	const mirror = "https://github.com=http://" + internetFiles + "/github.com"
	if !slices.Contains(s.Internet.BundleFlags, mirror) {
		t.Errorf("bundle flags %q lack --url-mirror %s", s.Internet.BundleFlags, mirror)
	}
	if err := s.serveFiles(inet); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse("https://github.com/etcd-io/etcd/releases/download/v3.6.16/etcd-v3.6.16-linux-amd64.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	served := inet.fsPath(filepath.Join("srv/files", u.Host, u.Path))
	data, err := os.ReadFile(served)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(served + ".sha256")
	if err != nil || string(sum) != fmt.Sprintf("%x\n", sha256.Sum256(data)) {
		t.Errorf("%s.sha256: %q, %v, want the archive's", u.Path, sum, err)
	}
	checkEtcdArchive(t, data, "v3.6.16", s.Binaries.EtcdTo)
}

// checkEtcdArchive checks that data is etcd's release archive of
// version: etcd-VERSION-linux-amd64/ holding etcd, etcdctl and etcdutl,
// each mode 0755, with the content of dir's.
func checkEtcdArchive(t *testing.T, data []byte, version, dir string) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	top := "etcd-" + version + "-linux-amd64/"
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Typeflag != tar.TypeReg {
			continue
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join(dir, strings.TrimPrefix(h.Name, top)))
		if err != nil || !bytes.Equal(body, want) {
			t.Errorf("%s: not the built program (%v)", h.Name, err)
		}
		if h.Mode != 0o755 {
			t.Errorf("%s: mode %o, want 0755", h.Name, h.Mode)
		}
	}
	if want := []string{top, top + "etcd", top + "etcdctl", top + "etcdutl"}; !slices.Equal(names, want) {
		t.Errorf("archive holds %q, want %q", names, want)
	}
}

// Where the target's node stack names the etcd served (Config.EtcdTo),
// its etcd part is the same archive, not a stand-in.
func TestNodeStackEtcdIsTheServedRelease(t *testing.T) {
	rel, err := catalogRelease("v1.34.4")
	if err != nil {
		t.Fatal(err)
	}
	part, ok := rel.StackPart(catalog.StackEtcd)
	if !ok {
		t.Fatal("v1.34.4's node stack has no etcd")
	}
	if part.File().URLFor("amd64") != etcdReleaseURL(part.Version) {
		t.Errorf("the catalog's etcd URL %s, the stand-in internet's %s", part.File().URLFor("amd64"), etcdReleaseURL(part.Version))
	}
	s := &State{EtcdTo: part.Version, Binaries: Binaries{EtcdTo: fakeEtcd(t)}}
	data, err := s.stackFile(rel, catalog.StackEtcd)
	if err != nil {
		t.Fatal(err)
	}
	checkEtcdArchive(t, data, part.Version, s.Binaries.EtcdTo)
}
