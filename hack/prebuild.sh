#!/usr/bin/env bash
# Builds, one after the other, every release and tool that make test's
# sandboxes and stories run, in the order the stories need them (make
# test starts it in the background after lint, niced: on a cold machine
# the builds are most of the run, and they then fill the time the unit
# tests and the waiting stories leave). Each build holds a lock per
# version: a story that asks for a release meanwhile waits for this
# build and takes its result, and a story that asks first builds it
# itself; either way nothing is built twice. Beside the first build it
# downloads every build's Go modules (builds, run under fetch_only). A
# failure here fails nothing: the story that needs the build fails with
# its own error.
#
#   hack/prebuild.sh KUBELIFT-SANDBOX
set -euo pipefail
renice -n 10 -p $$ >/dev/null
sb=${1:?usage: $0 KUBELIFT-SANDBOX}
root=$(cd "$(dirname "$0")/.." && pwd)
# builds: every build, in the order the stories need them.
builds() {
	# The patch stories (test/stories/applyha, kubeadmha) are the longest:
	# their releases first, with the runtime, etcd and CoreDNS.
	"$sb" build --old-version v1.31.4 --target v1.31.14 --kubeadm --hash-skip
	# applyha's CoreDNS and etcd (the members' and the bundle's).
	"$sb" build --old-version v1.31.4 --target v1.31.14 --coredns v1.11.1 --etcd v3.5.35 --etcd-to v3.6.16
	# The sandbox's own tests and most stories (apply, drain, engine, e2e,
	# kubeadm, scale, upstream).
	"$sb" build --old-version v1.30.14 --target v1.31.4 --kubeadm --hash-skip
	# containerd 1.7, the runtime test/stories/apply's nodes start on (the
	# node stack in its bundles moves them to the default), and its CoreDNS.
	"$sb" build --old-version v1.30.14 --target v1.31.4 --runtime-version v1.7.35 --coredns v1.11.1
	# Several minors in one run (test/stories/multihop). Before KWOK: the
	# story that waits for the last build runs after it, at the end of the
	# run, and the simulated nodes' stories are the shortest (multihop's
	# 400 s after v1.32.13 were a cold run's last minutes, the CPU 60% busy).
	"$sb" build --old-version v1.30.14 --target v1.32.13 --hash-skip
	# The simulated nodes (test/env/simcluster, test/stories/scale).
	"$root/hack/build-kwok.sh" >/dev/null
}
# The Go modules of every build first, beside the builds (hack/lib.sh's
# fetch_only): each build then finds its modules downloaded, where it
# waited for them with the CPU idle. The fetch has its own log, apart
# from the builds' (whose end make test prints when one fails), in the
# run's build cache, which make test removes.
logdir=${KUBELIFT_BUILD_CACHE:-${TMPDIR:-/tmp}}
mkdir -p "$logdir"
fetchlog=$(mktemp -p "$logdir")
fetch=
# A build that fails ends this script (set -e): it waits for the fetch
# first, so that make test's kill of its process group still reaches
# the fetch, and nothing outlives the run.
trap '[ -z "$fetch" ] || wait "$fetch" 2>/dev/null || :; rm -f "$fetchlog"' EXIT
(export KUBELIFT_FETCH_ONLY=1; builds) >/dev/null 2>"$fetchlog" & fetch=$!
builds
if ! wait "$fetch"; then
	echo "fetching the builds' modules failed (each build fetched its own); its end:" >&2
	tail -n 5 "$fetchlog" >&2
fi
fetch=
