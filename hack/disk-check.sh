#!/usr/bin/env bash
# make test needs room: two sandboxes at once, each machine with its own
# binaries, staged files and backups (an HA sandbox is about 7 GB), the
# bundles and registry they import, and, on a new machine, the Go build
# cache and the built Kubernetes releases. Measured on a fresh clone: 17 GB
# under the temporary directory at the peak; with cold caches the disk's
# use grew by 33 GB (22 GB of it the Go build cache, mostly Kubernetes
# releases, which now go to a cache of the run's own, removed at its end).
# This refuses to start a run that would stop half an hour in with "no
# space left on device", and says what holds the space.
#   hack/disk-check.sh NEED_GB
set -euo pipefail
need=${1:?usage: $0 NEED_GB}
tmp=${TMPDIR:-/tmp}
[ -d "$tmp" ] || { echo "TMPDIR $tmp is not a directory" >&2; exit 1; }
# Kubernetes releases not built yet: their objects fill the run's build
# cache under $tmp until the run ends (15 GB for the eight the tests use).
k8s=${KUBELIFT_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubelift/kubernetes}
if [ -z "$(ls -A "$k8s" 2>/dev/null)" ]; then
	need=$((need + 15))
fi
avail=$(df -Pk "$tmp" | awk 'NR == 2 { print int($4 / 1048576) }')
if [ "$avail" -ge "$need" ]; then
	exit 0
fi
{
	echo "only $avail GB free on the disk of $tmp; make test needs about $need GB (more on a new machine, while its caches fill)"
	gocache=$(go env GOCACHE 2>/dev/null || :)
	for d in "$gocache" "${XDG_CACHE_HOME:-$HOME/.cache}/kubelift" "$tmp"/kubelift-* "$tmp"/go-build*; do
		[ -e "$d" ] || continue
		echo "  $(du -xsh "$d" 2>/dev/null | cut -f1)	$d"
	done
	echo "the Go build cache is freed by 'go clean -cache'; a $tmp/kubelift-* directory that no test is running is a stopped run's sandbox ('kubelift-sandbox down --dir DIR/sandbox' stops what is left of it)"
} >&2
exit 1
