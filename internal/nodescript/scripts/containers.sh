# kubelift node script: containers
# Prints the runtime's containers as JSON, then, where containerd's ctr
# is installed, "### tasks" and its tasks (ID, PID, status): the
# processes, which must be the same ones after a kubelet swap.
# Arguments: none
set -eu
crictl ps -o json
if command -v ctr >/dev/null 2>&1; then
  echo '### tasks'
  ctr -n k8s.io tasks ls 2>/dev/null || true
fi
