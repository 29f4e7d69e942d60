#!/usr/bin/env bash
# Builds KWOK (Kubernetes WithOut Kubelet) from the Go module proxy and
# caches it by version: sigs.k8s.io/kwok/cmd/kwok at VERSION (default
# v0.7.0; if the proxy cannot build that one, the newest it serves).
#
#   hack/build-kwok.sh [VERSION]
#
# The binary lands in $KUBELIFT_TOOLS_CACHE/kwok-VERSION/kwok (default
# ~/.cache/kubelift/tools); an existing one is kept. Prints its path.
set -euo pipefail
# A build is background work: the tests that ask for it run sandboxes
# beside it whose pods and prober must not wait behind the compiler.
renice -n 10 -p $$ >/dev/null
. "$(dirname "$0")/lib.sh"
version=${1:-v0.7.0}
cache=${KUBELIFT_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubelift/tools}
# absolute: the build cds into a work directory before it writes there
mkdir -p "$cache" && cache=$(CDPATH='' cd -- "$cache" && pwd)

partial=
trap '[ -z "$partial" ] || rm -rf "$partial"' EXIT

build() {
	local v=$1 out=$cache/kwok-$1
	if [ -x "$out/kwok" ]; then echo "$out/kwok"; return 0; fi
	mkdir -p "$cache"
	# Build into a temporary directory next to the destination, then rename
	# it into place: a half-built or interrupted build is never seen.
	partial=$(mktemp -d "$cache/.kwok-$v.XXXXXX")
	chmod 755 "$partial"
	echo "building kwok $v" >&2
	if ! CGO_ENABLED=0 GOBIN=$partial go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$v" >&2; then
		rm -rf "$partial"
		partial=
		return 1
	fi
	# Another build may have won the race: keep its binary.
	if [ -e "$out" ]; then rm -rf "$partial"; else mv "$partial" "$out"; fi
	partial=
	built_note "built kwok $v in ${SECONDS}s"
	echo "$out/kwok"
}

if build "$version"; then exit 0; fi
[ $# -eq 0 ] || exit 1
latest=$(go list -m -json sigs.k8s.io/kwok@latest | sed -n 's/^[[:space:]]*"Version": "\(.*\)",$/\1/p')
[ -n "$latest" ] && [ "$latest" != "$version" ] || exit 1
echo "kwok $version failed to build; trying the newest, $latest" >&2
build "$latest"
