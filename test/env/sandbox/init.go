package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kubelift/kubelift/test/env/kube"
	"github.com/kubelift/kubelift/test/env/sandbox/systemd"
)

// RunInit is a machine's init, started by boot inside the machine's
// namespaces: it sets the host name, bind-mounts the machine's own
// directories from root over the host's (BindPaths, where root has them,
// their mount points made inside overlays of PrivateHostDirs,
// plus the systemctl stand-in over /usr/bin/systemctl), then runs the
// service manager until ctx ends (SIGTERM), stopping every service. log
// receives what goes wrong while booting units.
func RunInit(ctx context.Context, root, hostname string, log func(format string, args ...any)) error {
	if err := syscall.Sethostname([]byte(hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	// The mount namespace is a private copy; make sure nothing propagates
	// back to the host.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// Mount points the host lacks (/etc/kubernetes, /var/lib/kubelet on a
	// fresh machine) are made inside an overlay of their parents, so the
	// host's directories are never written.
	for _, d := range kube.PrivateHostDirs {
		up := filepath.Join(root, ".overlay", strings.ReplaceAll(strings.Trim(d, "/"), "/", "_"))
		if err := os.MkdirAll(filepath.Join(up, "upper"), 0o755); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(up, "work"), 0o755); err != nil {
			return err
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", d, up, up)
		if err := syscall.Mount("overlay", d, "overlay", 0, opts); err != nil {
			return fmt.Errorf("overlay over %s: %w", d, err)
		}
	}
	for _, p := range BindPaths {
		src := filepath.Join(root, p)
		if _, err := os.Stat(src); err != nil {
			continue
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("mount point %s: %w", p, err)
		}
		if err := syscall.Mount(src, p, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s over %s: %w", src, p, err)
		}
	}
	// kubeadm's kube-proxy DaemonSet mounts the host's /lib/modules (a
	// node of a kubeadm sandbox has usr/lib/modules in its tree): on a host
	// without it, it is made inside an overlay of /usr/lib.
	if _, err := os.Stat(filepath.Join(root, "usr/lib/modules")); err == nil {
		if _, err := os.Stat("/usr/lib/modules"); err != nil {
			up := filepath.Join(root, ".overlay", "usr_lib")
			for _, d := range []string{"upper/modules", "work"} {
				if err := os.MkdirAll(filepath.Join(up, d), 0o755); err != nil {
					return err
				}
			}
			opts := fmt.Sprintf("lowerdir=/usr/lib,upperdir=%s/upper,workdir=%s/work", up, up)
			if err := syscall.Mount("overlay", "/usr/lib", "overlay", 0, opts); err != nil {
				return fmt.Errorf("overlay over /usr/lib: %w", err)
			}
		}
	}
	for _, name := range []string{"systemctl", "systemd-run"} {
		if _, err := os.Stat("/usr/bin/" + name); err == nil {
			// The machine's own /usr/local is mounted by now.
			if err := syscall.Mount(toolPath, "/usr/bin/"+name, "", syscall.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind %s: %w", name, err)
			}
		}
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	m := systemd.NewManager()
	m.Log = log
	return m.Boot(ctx, systemd.Socket)
}
