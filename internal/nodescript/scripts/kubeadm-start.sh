# kubelift node script: kubeadm-start
# Starts KUBEADM ARG... detached from this session (its own session, no
# terminal, no inherited output), so that a lost SSH connection or a
# killed kubelift never stops kubeadm halfway through moving manifests:
# its output goes to DIR/NAME.log, its exit status to DIR/NAME.rc when it
# ends, its pid to DIR/NAME.pid. A run of NAME still going is left alone
# (kubeadm-status follows it), and one that succeeded is not run again;
# one that failed is (its output kept as NAME.log.previous). Prints
# "started", "running" or "done".
# Arguments: DIR NAME KUBEADM ARG...
set -eu
export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
dir=$1
name=$2
shift 2
mkdir -p "$dir"
if [ ! -f "$dir/$name.rc" ] && [ -f "$dir/$name.pid" ] && kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null; then
  echo running
  exit 0
fi
if [ "$(cat "$dir/$name.rc" 2>/dev/null)" = 0 ]; then
  echo 'done'
  exit 0
fi
rm -f "$dir/$name.rc" "$dir/$name.rc.partial"
# The output of the run that failed is kept beside the new one.
if [ -f "$dir/$name.log" ]; then mv "$dir/$name.log" "$dir/$name.log.previous"; fi
# shellcheck disable=SC2016 # expanded by the detached shell
KUBELIFT_LOG=$dir/$name.log KUBELIFT_RC=$dir/$name.rc setsid sh -c '"$@" >"$KUBELIFT_LOG" 2>&1 </dev/null; echo $? >"$KUBELIFT_RC.partial"; mv "$KUBELIFT_RC.partial" "$KUBELIFT_RC"' kubelift-kubeadm "$@" </dev/null >/dev/null 2>&1 &
echo $! >"$dir/$name.pid.partial"
mv "$dir/$name.pid.partial" "$dir/$name.pid"
echo started
