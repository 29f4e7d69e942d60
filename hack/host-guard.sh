#!/usr/bin/env bash
# Tests never write the host's Kubernetes and container runtime paths, nor
# leave a cgroup, a mount or an iptables rule of theirs. make test records
# them before the tests and fails, naming each, if anything changed after:
#   hack/host-guard.sh snapshot FILE ; ... ; hack/host-guard.sh check FILE
set -euo pipefail
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kubelift
paths=(
	/var/lib/kubelet /var/lib/kubelift /var/lib/etcd /var/lib/cni /etc/kubernetes /etc/cni /opt/cni
	/var/log/containers /var/log/pods /usr/local/bin /etc/systemd/system /run/kubelift
	/etc/containerd /var/lib/containerd /run/containerd /etc/crictl.yaml /run/netns
	# What upgrade writes below its default cache directory (the builds'
	# own, kubernetes/, runtime/, addons/, tools/, are make test's to fill).
	"$cache/etcd-snapshots" "$cache/files/blobs/sha256" "$cache/gzip" "$cache/zstd"
)
snapshot() {
	local p
	for p in "${paths[@]}"; do
		# ip netns add makes /run/netns and ip netns del never removes
		# it: empty there is as good as absent.
		if [ "$p" = /run/netns ] && [ -z "$(ls -A "$p" 2>/dev/null)" ]; then
			printf '%s: (absent)\n' "$p"
		elif [ -e "$p" ] || [ -L "$p" ]; then
			printf '%s: %s\n' "$p" "$(ls -A "$p" 2>/dev/null | tr '\n' ' ')"
		else
			printf '%s: (absent)\n' "$p"
		fi
	done
	# The sandboxes' cgroups (kubelift-NAME in every hierarchy), mounts
	# of containerd's or the kubelet's, and the host's iptables rules.
	printf 'cgroups: %s\n' "$(find /sys/fs/cgroup -maxdepth 2 -name 'kubelift-*' 2>/dev/null | sort | tr '\n' ' ')"
	printf 'mounts: %s\n' "$(grep -E 'containerd|kubelet|kubelift' /proc/self/mountinfo | cut -d' ' -f5 | sort | tr '\n' ' ')"
	printf 'iptables: %s\n' "$( (iptables-save 2>/dev/null || true) | grep -cv '^#')"
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
