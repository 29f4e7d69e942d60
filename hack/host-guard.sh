#!/usr/bin/env bash
# Tests never write the host's Kubernetes paths. make test records them
# before the tests and fails, naming each path, if anything changed after:
#   hack/host-guard.sh snapshot FILE ; ... ; hack/host-guard.sh check FILE
set -euo pipefail
paths=(
	/var/lib/kubelet /var/lib/kubelift /var/lib/etcd /var/lib/cni /etc/kubernetes /etc/cni /opt/cni
	/var/log/containers /var/log/pods /usr/local/bin /etc/systemd/system /run/kubelift
)
snapshot() {
	local p
	for p in "${paths[@]}"; do
		if [ -e "$p" ] || [ -L "$p" ]; then
			printf '%s: %s\n' "$p" "$(ls -A "$p" 2>/dev/null | tr '\n' ' ')"
		else
			printf '%s: (absent)\n' "$p"
		fi
	done
}
case ${1:-} in
snapshot) snapshot >"${2:?file}" ;;
check)
	if ! changes=$(diff <(cat "${2:?file}") <(snapshot)); then
		echo "FAIL: the tests changed the host's paths (tests must write only their temporary directories and namespaces):" >&2
		printf '%s\n' "$changes" | sed -n 's/^< /  before: /p; s/^> /  after:  /p' >&2
		exit 1
	fi
	echo "host paths unchanged: ${paths[*]}"
	;;
*) echo "usage: $0 snapshot|check FILE" >&2; exit 2 ;;
esac
