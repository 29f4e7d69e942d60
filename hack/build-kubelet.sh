#!/usr/bin/env bash
# Builds the real kubelet of a release with kubelift's hash-skip patch, from
# the Go module proxy. No fork is kept: k8s.io/kubernetes at the tag is
# vendored from the module cache into a work directory,
# hack/kubelet/v1.MINOR/containerChanged.patch is applied to the vendored
# pkg/kubelet/kuberuntime (the build fails if upstream's file no longer
# matches), and kubelift_hashskip.go (+ its test) is added there,
# importing the rule from github.com/kubelift/kubelift/pkg/hashskip (a
# standard-library-only module, so the kubelet's dependencies stay
# upstream's). Staging modules are replaced by v0.MINOR.PATCH as for
# hack/build-kubernetes.sh. Vendored, k8s.io/kubernetes is still the
# module at the tag to the go command, so only the packages the patch
# reaches compile apart from the stock kubelet's: under make test (one
# build cache for the run) the patched kubelet costs about 20 s after the
# stock one, not the 130 to 360 s of a whole kubelet.
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
# Compiled objects are not kept in the user's Go cache: the binaries are
# what is kept. There each release's objects came to gigabytes that
# later builds seldom reuse, and they filled the disk the tests run on.
# make test hands every build of its run one cache (KUBELIFT_BUILD_CACHE,
# removed when the run ends); alone, a build's goes with $work.
export GOCACHE=$KUBELIFT_BUILD_CACHE
cd "$work"
. "$root/hack/lib.sh"
kube_module "$version"
# The patch goes into a vendored copy: k8s.io/kubernetes stays the
# module at $version to the go command, so every package the patch does
# not reach compiles as the stock kubelet's does and is shared with it in
# the run's build cache (a copy put in by a replace directive is another
# module to the cache: every package of it compiled again, 300 s more).
# (-overlay would do the same, but it refuses files in the module cache.)
# kuberuntime, patched, imports pkg/hashskip: the build's module provides it.
go mod edit -require github.com/kubelift/kubelift/pkg/hashskip@v0.0.0 -replace "github.com/kubelift/kubelift/pkg/hashskip=$root/pkg/hashskip"
printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kubelet"\n\t_ "github.com/kubelift/kubelift/pkg/hashskip"\n)\n' >tools.go
export GOFLAGS=-mod=mod
go get "k8s.io/kubernetes/cmd/kubelet@$version" >/dev/null 2>&1 || go get "k8s.io/kubernetes/cmd/kubelet@$version"
# With upstream's tests of kuberuntime, their imports are vendored too.
kuberuntime=k8s.io/kubernetes/pkg/kubelet/kuberuntime
if [ "$runtests" = "--test" ]; then
	{
		printf '//go:build tools\n\npackage tools\n\nimport (\n'
		go list -f '{{join .TestImports "\n"}}{{"\n"}}{{join .XTestImports "\n"}}' "$kuberuntime" |
			grep '\.' | grep -vx "$kuberuntime" | sort -u | sed 's/.*/\t_ "&"/'
		printf ')\n'
	} >tools_test.go
fi
go mod tidy >/dev/null 2>&1 || go mod tidy
go mod vendor
kr=vendor/k8s.io/kubernetes/pkg/kubelet/kuberuntime
chmod -R u+w vendor
if ! patch -d "$kr" --forward --dry-run --quiet kuberuntime_manager.go <"$patchdir/containerChanged.patch" >/dev/null; then
	echo "k8s.io/kubernetes@$version: pkg/kubelet/kuberuntime/kuberuntime_manager.go no longer matches hack/kubelet/$series/containerChanged.patch" >&2
	patch -d "$kr" --forward --dry-run kuberuntime_manager.go <"$patchdir/containerChanged.patch" >&2 || true
	exit 1
fi
patch -d "$kr" --forward --quiet kuberuntime_manager.go <"$patchdir/containerChanged.patch"
# The added file carries "//go:build ignore" so that kubelift's own module
# skips it.
sed '/^\/\/go:build ignore$/d' "$patchdir/kubelift_hashskip.go" >"$kr/kubelift_hashskip.go"
export GOFLAGS=-mod=vendor
ld=$KUBE_LDFLAGS
export CGO_ENABLED=0
if [ -z "$built" ]; then
	echo "building kubelet $version with kubelift's hash-skip patch" >&2
	go build -trimpath -ldflags "-s -w $ld" -o "$out/.kubelet.partial" k8s.io/kubernetes/cmd/kubelet
	mv "$out/.kubelet.partial" "$out/kubelet"
	printf '%s\n' "$key" >"$out/kubelet.key"
fi
# The tests run on the copy in $work: a sandbox waiting for the kubelet
# need not wait for them.
exec 9>&-
if [ "$runtests" = "--test" ]; then
	echo "running upstream's pkg/kubelet/kuberuntime tests on the patched copy" >&2
	cp "$KUBE_SRC"/pkg/kubelet/kuberuntime/*_test.go "$kr/"
	sed '/^\/\/go:build ignore$/d' "$patchdir/kubelift_hashskip_test.go" >"$kr/kubelift_hashskip_test.go"
	chmod -R u+w "$kr"
	go test -trimpath -count=1 -v -ldflags "$ld" "$kuberuntime" 2>&1 | grep -E '^(--- |ok|FAIL|PASS)' >&2
fi
built_note "kubelet $version with the hash-skip patch${built:+ (cached)}${runtests:+ and its tests}: ${SECONDS}s"
echo "$out/kubelet"
