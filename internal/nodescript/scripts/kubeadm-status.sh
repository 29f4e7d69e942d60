# kubelift node script: kubeadm-status
# Says how the kubeadm run NAME that kubeadm-start began is doing: a first
# line "running", "exit N" (it ended with status N) or "lost" (it is not
# running and left no status: killed, or never started), then the last
# 80 lines of its output.
# Arguments: DIR NAME
set -eu
dir=$1
name=$2
if [ -f "$dir/$name.rc" ]; then
  echo "exit $(cat "$dir/$name.rc")"
elif [ -f "$dir/$name.pid" ] && kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null; then
  echo running
else
  echo lost
fi
if [ -f "$dir/$name.log" ]; then tail -n 80 "$dir/$name.log"; fi
