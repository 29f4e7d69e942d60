package kubeadm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kubelift/kubelift/internal/inplace/driver"
	"github.com/kubelift/kubelift/internal/inplace/nodeops"
	"github.com/kubelift/kubelift/internal/inplace/release"
	kadm "github.com/kubelift/kubelift/internal/kubeadm"
	"github.com/kubelift/kubelift/internal/nodescript"
	"github.com/kubelift/kubelift/internal/waiter"
)

// RunDir is where, on a node, each kubeadm run kubelift starts
// keeps its output (NAME.log), exit status (NAME.rc) and pid.
const RunDir = "/var/lib/kubelift/kubeadm"

// errKubeadmFailed: kubeadm ended with a status other than 0 (having put
// back what it moved, as it does on every error).
var errKubeadmFailed = errors.New("kubeadm failed")

// kubeadmTimeout bounds one `kubeadm upgrade` on a node: kubeadm waits up
// to 5 minutes for each static pod it moves, and etcd, the API server,
// the controller manager and the scheduler may each take that long.
const kubeadmTimeout = 25 * time.Minute

// kubeadmArgs are the arguments of `kubeadm upgrade VERB` on the node:
// --patches when the node has kubeadm's patches directory, and with
// --kubeadm-config the node's UpgradeConfiguration, put on the node first
// (it then says the patches directory: kubeadm refuses the flag beside
// --config).
func kubeadmArgs(ctx context.Context, r *driver.Run, o *nodeops.Ops, verb string) ([]string, error) {
	patches, err := o.Exists(ctx, kadm.PatchesDir)
	if err != nil {
		return nil, err
	}
	config := ""
	if c := r.KubeadmConfig; c != nil {
		data, at, err := c.ForNode(RunDir, patches)
		if err != nil {
			return nil, fmt.Errorf("--kubeadm-config: %w", err)
		}
		if r.Dry {
			r.Fx.Would(o.Name, "put the UpgradeConfiguration (--kubeadm-config) at "+at, "")
		} else if _, err := o.Node.Upload(ctx, at, 0o600, bytes.NewReader(data)); err != nil {
			return nil, err
		}
		config = at
	}
	if verb == "apply" {
		return kadm.ApplyArgs(r.Target.Version.String(), patches, config), nil
	}
	return kadm.NodeArgs(patches, config), nil
}

// kubeadmRun names a kubeadm run of this upgrade on a node:
// upgrade-VERB-VERSION-STARTED (the upgrade record's start, in Unix
// seconds), so that a resumed run follows, or does not repeat, the one
// this upgrade started, and a later upgrade to the same version (after a
// rollback) runs kubeadm anew.
func runName(r *driver.Run, verb string) string {
	return fmt.Sprintf("upgrade-%s-%s-%d", verb, r.Target.Version, r.Started)
}

// runKubeadm starts the staged kubeadm on the node with args, detached,
// as run NAME (or follows the one already going), and waits until it
// ends; an exit other than 0 is the node failed, with kubeadm's last
// lines for its reason. A kubeadm that failed at its health check's Job,
// before it moved anything, is started again (healthJobAttempts).
func runKubeadm(ctx context.Context, r *driver.Run, o *nodeops.Ops, run string, args []string) error {
	prog := release.StagePath(r.StageDir, r.Target.Version.String(), "kubeadm")
	start := append([]string{RunDir, run, prog}, args...)
	if r.Dry {
		r.Fx.Would(o.Name, "kubeadm "+strings.Join(args, " "), nodescript.KubeadmStart.Show(start...))
		return nil
	}
	// The staged kubeadm runs as root and no swap checks it: its signed
	// sum is checked on the node first.
	if _, err := o.Run(ctx, "check the staged kubeadm", nodescript.CheckFile, prog, r.Target.SHA256("kubeadm", r.Node(o.Name).Arch)); err != nil {
		return fmt.Errorf("%w (the signed sum): stage it again (upgrade stage)", err)
	}
	defer r.Fx.Timed()()
	for attempt := 1; ; attempt++ {
		err := startAndWait(ctx, r, o, run, args, start)
		if !errors.Is(err, errHealthJob) {
			return err
		}
		if attempt == healthJobAttempts {
			return fmt.Errorf("%w (kubeadm started %d times)", err, attempt)
		}
		r.Log.Warn("kubeadm's health check Job did not complete in kubeadm's time; nothing moved: kubeadm again", "node", o.Name, "run", run, "attempt", attempt+1, "of", healthJobAttempts)
		// The Job's pod may still be finishing on a busy node.
		if err := r.Wait.Pause(ctx, healthJobPause); err != nil {
			return err
		}
	}
}

// healthJobAttempts is how many times one kubeadm run is started when it
// fails at its health check's Job ("[ERROR CreateJob]"), before it moved
// anything. kubeadm before v1.36 gives the Job 15 seconds to complete, which
// a busy cluster can miss while the Job's pod runs well
// (kubernetes/kubeadm#3282; kubeadm v1.36 waits 60 seconds, as 4 attempts
// do); kubeadm changes nothing before that check.
const healthJobAttempts = 4

// healthJobPause is the pause between such attempts.
const healthJobPause = 5 * time.Second

// errHealthJob: kubeadm failed at its pre-flight health check's Job,
// before it moved anything.
var errHealthJob = errors.New("its health check's Job did not complete")

// startAndWait starts (or follows) kubeadm run NAME on the node and waits
// until it ends.
func startAndWait(ctx context.Context, r *driver.Run, o *nodeops.Ops, run string, args, start []string) error {
	out, err := o.Run(ctx, "start kubeadm", nodescript.KubeadmStart, start...)
	if err != nil {
		return err
	}
	r.Log.Info("kubeadm", "node", o.Name, "run", run, "args", strings.Join(args, " "), "state", strings.TrimSpace(out))
	var tail string
	err = r.Wait.Poll(ctx, 2*time.Second, kubeadmTimeout, func(ctx context.Context) error {
		out, err := o.Run(ctx, "kubeadm status", nodescript.KubeadmStatus, RunDir, run)
		if err != nil {
			return err // the node may be busy restarting its API server: try again
		}
		status, rest, _ := strings.Cut(out, "\n")
		tail = strings.TrimSpace(rest)
		switch status = strings.TrimSpace(status); {
		case status == "running":
			return errors.New("kubeadm is running")
		case status == "exit 0":
			return nil
		case strings.HasPrefix(status, "exit "):
			code, err := strconv.Atoi(strings.TrimPrefix(status, "exit "))
			if err != nil {
				return waiter.Stop(fmt.Errorf("node %s: kubeadm status %q: not an exit status", o.Name, status))
			}
			if healthJobFailed(tail) {
				return waiter.Stop(fmt.Errorf("%w (%w): node %s: kubeadm %s exited %d: %s", errKubeadmFailed, errHealthJob, o.Name, strings.Join(args, " "), code, kubeadmReason(tail)))
			}
			return waiter.Stop(fmt.Errorf("%w: node %s: kubeadm %s exited %d: %s", errKubeadmFailed, o.Name, strings.Join(args, " "), code, kubeadmReason(tail)))
		default:
			return waiter.Stop(fmt.Errorf("node %s: kubeadm %s stopped without an exit status (%q; killed?), what it moved may not be back: %s", o.Name, strings.Join(args, " "), status, kubeadmReason(tail)))
		}
	})
	if errors.Is(err, waiter.ErrTimeout) {
		return fmt.Errorf("node %s: kubeadm %s still running after %s (it goes on; %s/%s.log on the node says how): %s", o.Name, strings.Join(args, " "), kubeadmTimeout, RunDir, run, kubeadmReason(tail))
	}
	return err
}

// healthJobFailed says whether kubeadm's output ends at its pre-flight
// health check's Job not completing in time (not at one it could not
// create: RBAC, admission, quota), before it prepared to move any static
// pod.
func healthJobFailed(log string) bool {
	_, job, ok := strings.Cut(log, "[ERROR CreateJob]")
	job, _, _ = strings.Cut(job, "\n")
	return ok && strings.Contains(job, "did not complete in") && !strings.Contains(log, "Preparing for ")
}

// kubeadmReason is what kubeadm said last, for an error message: the
// static pod it was moving when it stopped ("Preparing for "NAME"
// upgrade"), then its "error execution phase" or FATAL line and what
// follows when there is one, else its last lines.
func kubeadmReason(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	moving := ""
	for _, l := range lines {
		if _, rest, ok := strings.Cut(l, `Preparing for "`); ok {
			if name, _, ok := strings.Cut(rest, `"`); ok {
				moving = name
			}
		}
	}
	for i, l := range lines {
		if strings.Contains(l, "error execution phase") || strings.Contains(l, "] FATAL") || strings.HasPrefix(l, "error: ") {
			lines = lines[i:]
			break
		}
	}
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	if moving != "" {
		return "while it moved " + moving + ": " + strings.Join(lines, " | ")
	}
	return strings.Join(lines, " | ")
}
