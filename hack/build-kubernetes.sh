#!/usr/bin/env bash
# Builds real Kubernetes components from the Go module proxy and caches them
# by version: k8s.io/kubernetes at the release tag laid out as its
# repository is, each k8s.io/* staging module in staging/src from the
# matching published v0.MINOR.PATCH (hack/lib.sh's kube_tree), with version
# ldflags so --version prints the real version.
#
#   hack/build-kubernetes.sh v1.31.4 kube-apiserver [kubelet ...]
#
# Binaries land in $KUBELIFT_K8S_CACHE/VERSION/ (default
# ~/.cache/kubelift/kubernetes/VERSION); existing ones are kept. Prints the
# directory.
set -euo pipefail
# A build is background work: the tests that ask for it run sandboxes
# beside it whose pods and prober must not wait behind the compiler.
renice -n 10 -p $$ >/dev/null
version=${1:?usage: $0 VERSION COMPONENT...}
shift
[ $# -gt 0 ] || { echo "usage: $0 VERSION COMPONENT..." >&2; exit 2; }
cache=${KUBELIFT_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubelift/kubernetes}
# absolute: the build cds into a work directory before it writes there
mkdir -p "$cache" && cache=$(CDPATH='' cd -- "$cache" && pwd)
out=$cache/$version
mkdir -p "$out"
missing=()
for c in "$@"; do [ -x "$out/$c" ] || missing+=("$c"); done
if [ ${#missing[@]} -eq 0 ]; then echo "$out"; exit 0; fi
. "$(dirname "$0")/lib.sh"
if fetch_only; then
	# no lock (nothing is built), and each release's modules once a run
	todo=()
	for c in "${missing[@]}"; do fetched_before "$version-$c" || todo+=("$c"); done
	if [ ${#todo[@]} -eq 0 ]; then echo "$out"; exit 0; fi
	missing=("${todo[@]}")
else
	# One build at a time per minor (test packages run side by side and
	# ask for the same version, or two of one minor): the second waits,
	# then builds only what the first did not, and two releases of one
	# minor share nearly every package (kube_tree), which the second then
	# takes from the run's build cache. Side by side, each compiled them
	# all (2026-11-28: v1.31.14's kubelet 436 s beside v1.31.4's 381 s).
	minor=${version#v1.}
	minor=${minor%%.*}
	exec 9>"$cache/.lock-v1.$minor"
	flock 9
	SECONDS=0 # the build log times the build, not the wait for the lock
	missing=()
	for c in "$@"; do [ -x "$out/$c" ] || missing+=("$c"); done
	if [ ${#missing[@]} -eq 0 ]; then echo "$out"; exit 0; fi
fi

work=$(mktemp -d)
# Compiled objects are not kept in the user's Go cache: the binaries are
# what is kept. There each release's objects came to gigabytes, and they
# filled the disk the tests run on. make test hands every build of its
# run one cache (KUBELIFT_BUILD_CACHE, removed when the run ends), where
# each release takes what an earlier one compiled and it did not change;
# alone, a build's goes with $work.
export GOCACHE=${KUBELIFT_BUILD_CACHE:-$work/go-build}
# (the tree kube_tree copies is read-only until it is done with it)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
# The release laid out as its repository is (hack/lib.sh's kube_tree): a
# later release's build then takes from the run's cache every package
# this one compiled and that one did not change.
kube_tree "$version" "$work/src"
cd "$work/src"
export GOWORK=off GOFLAGS=-mod=mod
pkgs=()
for c in "${missing[@]}"; do pkgs+=("./cmd/$c"); done
if fetch_only; then
	CGO_ENABLED=0 go list -deps "${pkgs[@]}" >/dev/null
	echo "fetched the modules of ${missing[*]} $version" >&2
	echo "$out"
	exit 0
fi
echo "building ${missing[*]} $version (staging modules $KUBE_STAGING)" >&2
ld="-s -w $KUBE_LDFLAGS"
# One go build for all of them: shared packages compile once and the links
# run in parallel. Each binary is moved into place only when all are built.
partial="$out/.partial.$$"
mkdir -p "$partial"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work" "$partial"' EXIT
CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$partial/" "${pkgs[@]}"
for c in "${missing[@]}"; do mv "$partial/$c" "$out/$c"; done
built_note "built ${missing[*]} $version in ${SECONDS}s"
echo "$out"
