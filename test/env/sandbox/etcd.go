package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kubelift/kubelift/internal/catalog"
)

// A binary sandbox with Config.Etcd runs etcd as binary installers leave
// it (kubespray's etcd_deployment_type: host, the "hard way"): one member
// on every control plane, all of one cluster, the release's own etcd,
// etcdctl and etcdutl in /usr/local/bin and an etcd.service; every
// kube-apiserver names every member. That is what the engine's etcd step
// moves member by member. Without it, cp-1 runs Debian's etcd alone
// (etcdUnit), which no step moves: Debian's 3.4 is older than any
// release the catalog pairs etcd with.
//
// With Config.EtcdTo the stand-in internet also serves etcd's release
// archive at that version, where upstream publishes it, for `bundle
// create --etcd`.

// etcdPrograms are the programs of etcd's release archive, and what a
// member's machine has in /usr/local/bin.
var etcdPrograms = []string{"etcd", "etcdctl", "etcdutl"}

// etcdMemberUnit runs one member of the sandbox's etcd cluster: %[1]s is
// its name (the machine's), %[2]s its address, %[3]s the initial
// cluster (etcdInitialCluster). Plain HTTP, as the Debian one (sandbox
// only); the token keeps two sandboxes' members, were they ever to meet,
// from joining each other's cluster. No fsync (--unsafe-no-fsync): the
// members share one virtual disk with make test's other clusters and
// builds, where a WAL's fdatasync took 1.8 s and the API servers' 2 s
// etcd check timed out (applyha beside the scale story, 2026-12-02); a
// production member has a disk of its own (etcd's hardware guide), and
// no test here is of etcd's durability.
const etcdMemberUnit = `[Unit]
Description=etcd member (the release's binary in /usr/local/bin, as binary installers place it)
After=network-online.target

[Service]
ExecStart=/usr/local/bin/etcd --name %[1]s --data-dir /var/lib/etcd \
  --listen-client-urls http://%[2]s:2379,http://127.0.0.1:2379 --advertise-client-urls http://%[2]s:2379 \
  --listen-peer-urls http://%[2]s:2380 --initial-advertise-peer-urls http://%[2]s:2380 \
  --initial-cluster %[3]s --initial-cluster-state new --initial-cluster-token kubelift-sandbox \
  --unsafe-no-fsync --log-level warn
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`

// checkEtcd refuses an etcd version (Config.Etcd, Config.EtcdTo) that
// is not vMAJOR.MINOR.PATCH, or is set on a kubeadm sandbox, whose etcd
// kubeadm runs as a static pod (EtcdVersion) and moves itself.
func checkEtcd(cfg Config) error {
	for _, f := range []struct{ field, version string }{{"Etcd", cfg.Etcd}, {"EtcdTo", cfg.EtcdTo}} {
		if f.version == "" {
			continue
		}
		if cfg.Kubeadm {
			return fmt.Errorf("sandbox: %s %s: etcd of a chosen version runs on a binary sandbox (a kubeadm sandbox runs kubeadm's, %s, as a static pod)", f.field, f.version, EtcdVersion)
		}
		if v, err := catalog.ParseVersion(f.version); err != nil || v.String() != f.version {
			return fmt.Errorf("sandbox: %s %q: want an etcd release, vMAJOR.MINOR.PATCH (v3.5.35)", f.field, f.version)
		}
	}
	return nil
}

// etcdInitialCluster is etcd's --initial-cluster: every control plane,
// NAME=http://ADDRESS:2380, in order.
func (s *State) etcdInitialCluster() string {
	var members []string
	for _, m := range s.Nodes() {
		if m.Role == "control-plane" {
			members = append(members, m.Name+"=http://"+m.Address+":2380")
		}
	}
	return strings.Join(members, ",")
}

// etcdServers is kube-apiserver's --etcd-servers on control plane m:
// every member's client URL, m's own first (the member on its machine
// is the one it reaches without the bridge), the others in order.
// Without Config.Etcd it is cp-1's Debian etcd alone.
func (s *State) etcdServers(m *Machine) string {
	if s.Etcd == "" {
		return "http://" + s.Nodes()[0].Address + ":2379"
	}
	urls := []string{"http://" + m.Address + ":2379"}
	for _, n := range s.Nodes() {
		if n.Role == "control-plane" && n.Name != m.Name {
			urls = append(urls, "http://"+n.Address+":2379")
		}
	}
	return strings.Join(urls, ",")
}

// etcdFiles puts control plane m's etcd in place: Debian's on cp-1 alone
// without Config.Etcd; with it, a member of the sandbox's cluster on
// every control plane, its programs copied from Binaries.Etcd.
func (s *State) etcdFiles(m *Machine) error {
	if s.Etcd == "" && m.Name != s.Nodes()[0].Name {
		return nil
	}
	if err := os.MkdirAll(m.fsPath("var/lib/etcd"), 0o700); err != nil {
		return err
	}
	if s.Etcd == "" {
		return writeUnit(m, "etcd.service", fmt.Sprintf(etcdUnit, m.Name, m.Address), true)
	}
	if s.Binaries.Etcd == "" {
		return fmt.Errorf("etcd %s was not built", s.Etcd)
	}
	for _, p := range etcdPrograms {
		if err := copyFile(filepath.Join(s.Binaries.Etcd, p), m.fsPath("usr/local/bin/"+p), 0o755); err != nil {
			return fmt.Errorf("etcd %s on %s: %w", s.Etcd, m.Name, err)
		}
	}
	return writeUnit(m, "etcd.service", fmt.Sprintf(etcdMemberUnit, m.Name, m.Address, s.etcdInitialCluster()), true)
}

// etcdReleaseURL is where etcd publishes version's archive for linux/amd64.
func etcdReleaseURL(version string) string {
	return "https://github.com/etcd-io/etcd/releases/download/" + version + "/etcd-" + version + "-linux-amd64.tar.gz"
}

// etcdArchive is etcd's release archive of version as upstream lays it
// out (etcd-VERSION-linux-amd64/ holding etcd, etcdctl and etcdutl; its
// documentation left out), of the programs built in dir.
func etcdArchive(dir, version string) ([]byte, error) {
	if dir == "" {
		return nil, errors.New("stand-in internet: etcd " + version + " was not built")
	}
	return tarGz(dir, "etcd-"+version+"-linux-amd64", etcdPrograms...)
}

// etcdServedSet is the stand-in internet's etcd release archive at
// Config.EtcdTo (nil: none).
func (s *State) etcdServedSet() []servedSet {
	if s.EtcdTo == "" {
		return nil
	}
	return []servedSet{{s.EtcdTo, []catalog.File{{Name: catalog.StackEtcd, URL: etcdReleaseURL(s.EtcdTo)}},
		func(string) ([]byte, error) { return etcdArchive(s.Binaries.EtcdTo, s.EtcdTo) }}}
}
