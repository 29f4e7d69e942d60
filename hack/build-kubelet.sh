#!/usr/bin/env bash
# Builds the real kubelet of a release with kubelift's hash-skip patch, from
# the Go module proxy. No fork is kept: k8s.io/kubernetes at the tag is
# laid out in a work directory as hack/build-kubernetes.sh builds it
# (hack/lib.sh's kube_tree), hack/kubelet/v1.MINOR/containerChanged.patch
# is applied to its pkg/kubelet/kuberuntime (the build fails if upstream's
# file no longer matches), and kubelift_hashskip.go (+ its test) is added
# there, importing the rule from github.com/kubelift/kubelift/pkg/hashskip
# (a standard-library-only module, so the kubelet's dependencies stay
# upstream's). Only the packages the patch reaches compile apart from the
# stock kubelet's: under make test (one build cache for the run) the
# patched kubelet costs about 20 s after the stock one, not the 130 to
# 360 s of a whole kubelet.
#
#   hack/build-kubelet.sh v1.31.4 [--test]
#
# Writes $KUBELIFT_K8S_CACHE/VERSION-kubelift/kubelet (default cache
# ~/.cache/kubelift/kubernetes) and prints its path. --test also runs
# upstream's pkg/kubelet/kuberuntime tests, and kubelift's, on the patched
# copy (test/upstream runs it): the kubelet is still kept while its key
# holds, and the tests compile with the build's flags, so that a run that
# also builds the kubelet compiles the shared packages once.
set -euo pipefail
# A build is background work: the tests that ask for it run sandboxes
# beside it whose pods and prober must not wait behind the compiler.
renice -n 10 -p $$ >/dev/null
version=${1:?usage: $0 VERSION [--test]}
runtests=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
minor=${version#v1.}; minor=${minor%%.*}
series=v1.$minor
patchdir=$root/hack/kubelet/$series
if [ ! -d "$patchdir" ]; then
	echo "no kubelift kubelet patch for $series (have: $(ls "$root/hack/kubelet" | tr '\n' ' '))" >&2
	exit 1
fi
cache=${KUBELIFT_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubelift/kubernetes}
# absolute: the build cds into a work directory before it writes there
mkdir -p "$cache" && cache=$(CDPATH='' cd -- "$cache" && pwd)
out=$cache/$version-kubelift
mkdir -p "$out"
# Under KUBELIFT_FETCH_ONLY=1 (hack/lib.sh's fetch_only) there is nothing
# to fetch: the patched kubelet's modules are the stock kubelet's, which
# the release's own fetch (hack/build-kubernetes.sh) downloaded.
if [ "${KUBELIFT_FETCH_ONLY:-}" = 1 ]; then echo "$out/kubelet"; exit 0; fi
# One build at a time per version: test packages run side by side and
# each asks for the kubelet; the second waits and takes the first's.
exec 9>"$out/.lock"
flock 9
# The binary is kept while its inputs (the patch and pkg/hashskip) are
# unchanged: their sha256 is its key.
key=$(cd "$root" && cat "$patchdir"/* pkg/hashskip/go.mod pkg/hashskip/*.go | sha256sum | cut -d ' ' -f 1)
built=
if [ -x "$out/kubelet" ] && [ "$(cat "$out/kubelet.key" 2>/dev/null)" = "$key" ]; then
	built=yes
	if [ "$runtests" != "--test" ]; then
		echo "$out/kubelet"
		exit 0
	fi
fi
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
# The stock kubelet first (or, if another build of the release is under
# way, after it): every package the patch does not reach is then in the
# build cache, and this build compiles only the few it does. Two builds of
# one release at once would each compile the whole kubelet.
export KUBELIFT_BUILD_CACHE=${KUBELIFT_BUILD_CACHE:-$work/go-build}
"$root/hack/build-kubernetes.sh" "$version" kubelet >/dev/null
SECONDS=0 # the note below times this build alone
export GOCACHE=$KUBELIFT_BUILD_CACHE
. "$root/hack/lib.sh"
# The release laid out as hack/build-kubernetes.sh builds it (kube_tree),
# so that the patched kubelet takes every package the patch does not
# reach from the stock kubelet's build.
kube_tree "$version" "$work/src"
cd "$work/src"
export GOWORK=off GOFLAGS=-mod=mod
go mod edit -require github.com/kubelift/kubelift/pkg/hashskip@v0.0.0 -replace "github.com/kubelift/kubelift/pkg/hashskip=$root/pkg/hashskip"
kuberuntime=k8s.io/kubernetes/pkg/kubelet/kuberuntime
kr=pkg/kubelet/kuberuntime
if ! patch -d "$kr" --forward --dry-run --quiet kuberuntime_manager.go <"$patchdir/containerChanged.patch" >/dev/null; then
	echo "k8s.io/kubernetes@$version: pkg/kubelet/kuberuntime/kuberuntime_manager.go no longer matches hack/kubelet/$series/containerChanged.patch" >&2
	patch -d "$kr" --forward --dry-run kuberuntime_manager.go <"$patchdir/containerChanged.patch" >&2 || true
	exit 1
fi
patch -d "$kr" --forward --quiet kuberuntime_manager.go <"$patchdir/containerChanged.patch"
sed '/^\/\/go:build ignore$/d' "$patchdir/kubelift_hashskip.go" >"$kr/kubelift_hashskip.go"
ld=$KUBE_LDFLAGS
export CGO_ENABLED=0
if [ -z "$built" ]; then
	echo "building kubelet $version with kubelift's hash-skip patch" >&2
	go build -trimpath -ldflags "-s -w $ld" -o "$out/.kubelet.partial" ./cmd/kubelet
	mv "$out/.kubelet.partial" "$out/kubelet"
	printf '%s\n' "$key" >"$out/kubelet.key"
fi
exec 9>&-
if [ "$runtests" = "--test" ]; then
	echo "running upstream's pkg/kubelet/kuberuntime tests on the patched copy" >&2
	# not vetted: upstream's code is vetted upstream (1.3 CPU-minutes here)
	sed '/^\/\/go:build ignore$/d' "$patchdir/kubelift_hashskip_test.go" >"$kr/kubelift_hashskip_test.go"
	go test -trimpath -vet=off -count=1 -v -ldflags "$ld" "$kuberuntime" 2>&1 | grep -E '^(--- |ok|FAIL|PASS)' >&2
fi
built_note "kubelet $version with the hash-skip patch${built:+ (cached)}${runtests:+ and its tests}: ${SECONDS}s"
echo "$out/kubelet"
