#!/usr/bin/env bash
# Builds KWOK (Kubernetes WithOut Kubelet) from the Go module proxy and
# caches it by version: sigs.k8s.io/kwok/cmd/kwok at VERSION (default
# v0.8.0), with the pod stages KWOK ships (its kustomize/stage/pod/fast:
# pod-ready, pod-complete, pod-delete), which KWOK since v0.8.0 no longer
# plays unless its configuration names them.
#
#   hack/build-kwok.sh [VERSION]
#
# The binary lands in $KUBELIFT_TOOLS_CACHE/kwok-VERSION/kwok (default
# ~/.cache/kubelift/tools), its pod stages beside it in pod-stages.yaml;
# existing ones are kept. Prints the binary's path.
#
# KWOK is built in a module that requires what kubelift's go.mod requires
# (client-go, apimachinery, api, ...), into the user's Go build cache,
# with kubelift's own build settings (no -trimpath, cgo as the go command
# has it): the packages it shares with kubelift are then the ones go vet
# and the tests already compiled. Built alone from an empty cache it took
# 319 CPU-seconds; after kubelift's packages, 72.
set -euo pipefail
# A build is background work: the tests that ask for it run sandboxes
# beside it whose pods and prober must not wait behind the compiler.
renice -n 10 -p $$ >/dev/null
. "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
version=${1:-v0.8.0}
cache=${KUBELIFT_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubelift/tools}
# absolute: the build cds into a work directory before it writes there
mkdir -p "$cache" && cache=$(CDPATH='' cd -- "$cache" && pwd)
out=$cache/kwok-$version
if [ -x "$out/kwok" ] && [ -s "$out/pod-stages.yaml" ]; then echo "$out/kwok"; exit 0; fi

partial=
work=
trap '[ -z "$partial" ] || rm -rf "$partial"; [ -z "$work" ] || rm -rf "$work"' EXIT
work=$(mktemp -d)
fetch_only || echo "building kwok $version" >&2
cd "$work"
{
	printf 'module kubelift.local/kwok-build\n\n'
	grep '^go ' "$root/go.mod"
	# kubelift's requirements, but not its own modules (replaced by a
	# directory in its go.mod, unknown to the proxy)
	sed -n '/^require (/,/^)/p' "$root/go.mod" | grep -v 'github.com/kubelift/'
} >go.mod
export GOWORK=off GOFLAGS=-mod=mod
if ! go get "sigs.k8s.io/kwok@$version" >get.log 2>&1; then
	echo "kwok $version: go get failed:" >&2
	cat get.log >&2
	exit 1
fi
# Under fetch_only (hack/lib.sh): the modules the build would compile.
if fetch_only; then
	go list -deps sigs.k8s.io/kwok/cmd/kwok >/dev/null
	echo "fetched the modules of kwok $version" >&2
	echo "$out/kwok"
	exit 0
fi
# Build into a temporary directory next to the destination, then rename
# it into place: a half-built or interrupted build is never seen.
partial=$(mktemp -d "$cache/.kwok-$version.XXXXXX")
chmod 755 "$partial"
go build -ldflags "-s -w" -o "$partial/kwok" sigs.k8s.io/kwok/cmd/kwok
stages=$(go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage/pod/fast
for s in pod-ready pod-complete pod-delete; do
	[ -s "$stages/$s.yaml" ] || { echo "kwok $version has no $stages/$s.yaml" >&2; exit 1; }
	echo ---
	cat "$stages/$s.yaml"
done >"$partial/pod-stages.yaml"
# Another build may have won the race: keep its result when whole.
if [ -x "$out/kwok" ] && [ -s "$out/pod-stages.yaml" ]; then
	rm -rf "$partial"
else
	rm -rf "$out"
	mv "$partial" "$out"
fi
partial=
built_note "built kwok $version in ${SECONDS}s"
echo "$out/kwok"
