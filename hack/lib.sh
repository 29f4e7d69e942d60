# shellcheck shell=bash disable=SC2034 # sourced: the variables it sets are its callers'
# Shared by kubelift's build scripts: built_note, and how to build against
# k8s.io/kubernetes from the Go module proxy. Source it; then, in an empty
# directory:
#   kube_module VERSION
# makes a Go module there requiring k8s.io/kubernetes@VERSION with every
# staging module its go.mod replaces by a local path (./staging/...)
# replaced instead by the published v0.MINOR.PATCH, and sets
# KUBE_MINOR, KUBE_STAGING (v0.MINOR.PATCH), KUBE_SRC (the module's source
# in the module cache) and KUBE_LDFLAGS (version stamping).

# The compiler collects its garbage less often than Go's default (unless
# GOGC is set): building kube-apiserver v1.31.4 alone on 2 cores with an
# empty build cache took 526 CPU-seconds at GOGC=100 and 461 at 400
# (283 s and 245 s; the largest compile 1.5 and 1.6 GB), and client-go's
# packages 283 and 224. GOMEMLIMIT caps what a compile may take for it.
# A whole cold make test did not show it: the compiler's CPU by process
# accounting was 71.9 minutes at GOGC=400 against 71 before
# (docs/development.md).
export GOGC=${GOGC:-400} GOMEMLIMIT=${GOMEMLIMIT:-4GiB}

# built_note MESSAGE: what a build made and how long it took, on stderr
# and, under make test, in the run's build log ($KUBELIFT_BUILD_LOG, each
# line stamped with the time), which make test prints at its end: on a
# cold machine the run's time is mostly these builds.
built_note() {
	echo "$*" >&2
	if [ -n "${KUBELIFT_BUILD_LOG:-}" ]; then
		echo "$(date -u +%H:%M:%S) $*" >>"$KUBELIFT_BUILD_LOG"
	fi
}

# staging_version MODULE: KUBE_STAGING if the module proxy serves it,
# else the newest patch of the same minor below it that it serves (this
# machine's proxy lacks a few: k8s.io/endpointslice v0.31.14, v0.32.13),
# said on stderr; a patch of a staging module changes no API.
staging_version() {
	local m=$1 v
	if go mod download "$m@$KUBE_STAGING" >/dev/null 2>&1; then
		echo "$KUBE_STAGING"
		return
	fi
	v=$(go list -m -versions "$m" 2>/dev/null | tr ' ' '\n' | grep "^v0\.$KUBE_MINOR\.[0-9]*$" |
		awk -F. -v p="${KUBE_STAGING##*.}" '$3 < p' | sort -t. -k3,3n | tail -n1)
	if [ -z "$v" ]; then
		echo "$KUBE_STAGING" # let the build name what is missing
		return
	fi
	echo "$m $KUBE_STAGING is not served by the module proxy: building with $v" >&2
	echo "$v"
}

kube_module() {
	local version=$1 info gomod m
	KUBE_MINOR=${version#v1.}
	KUBE_MINOR=${KUBE_MINOR%%.*}
	KUBE_STAGING=v0.$KUBE_MINOR.${version##*.}
	go mod init kubelift.local/kube-build >/dev/null 2>&1
	info=$(go mod download -json "k8s.io/kubernetes@$version") || {
		echo "cannot download k8s.io/kubernetes@$version from the module proxy" >&2
		return 1
	}
	KUBE_SRC=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	gomod=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
	for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => \./staging/.*#\1#p' "$gomod"); do
		go mod edit -replace "$m=$m@$(staging_version "$m")"
	done
	go mod edit -require "k8s.io/kubernetes@$version"
	KUBE_LDFLAGS="-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$KUBE_MINOR -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
}
