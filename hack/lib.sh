# shellcheck shell=bash disable=SC2034 # sourced: the variables it sets are its callers'
# Shared by kubelift's build scripts: built_note, fetch_only, and how to build
# k8s.io/kubernetes from the Go module proxy. Source it; then
#   kube_tree VERSION DIR
# lays the release out in DIR as its repository is, to build its
# commands there (hack/build-kubernetes.sh, hack/build-kubelet.sh), and
#   kube_module VERSION
# makes, in an empty directory, a Go module of one's own that requires
# k8s.io/kubernetes@VERSION (hack/kubelet-hash-vectors.sh). Both set
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

# fetch_only: true under KUBELIFT_FETCH_ONLY=1, where a build script
# downloads the Go modules its build would compile (go list -deps of the
# same packages) and builds nothing, takes no lock and prints what it
# would. hack/prebuild.sh fetches every build's modules so, beside the
# first build: on a cold machine each build downloaded its own when it
# began, and the CPU stood idle for minutes between builds (FC24: 3.3
# CPU-minutes of it while etcd's, CoreDNS's and v1.30.14's were fetched).
fetch_only() { [ "${KUBELIFT_FETCH_ONLY:-}" = 1 ]; }

# fetched_before KEY: under make test (its KUBELIFT_BUILD_CACHE), true if
# this run has fetched KEY already, and KEY marked fetched otherwise: the
# prebuild names v1.31.4 and v1.30.14 in three builds each, and each
# fetch of a release lays out its tree again.
fetched_before() {
	[ -n "${KUBELIFT_BUILD_CACHE:-}" ] || return 1
	local d=$KUBELIFT_BUILD_CACHE/kubelift-fetched
	mkdir -p "$d"
	[ ! -e "$d/$1" ] || return 0
	: >"$d/$1"
	return 1
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

# kube_release VERSION: downloads k8s.io/kubernetes@VERSION and sets
# KUBE_MINOR, KUBE_STAGING, KUBE_SRC, KUBE_GOMOD (its go.mod in the module
# cache) and KUBE_LDFLAGS.
kube_release() {
	local version=$1 info
	KUBE_MINOR=${version#v1.}
	KUBE_MINOR=${KUBE_MINOR%%.*}
	KUBE_STAGING=v0.$KUBE_MINOR.${version##*.}
	KUBE_LDFLAGS="-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$KUBE_MINOR -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
	info=$(cd / && GOFLAGS='' go mod download -json "k8s.io/kubernetes@$version") || {
		echo "cannot download k8s.io/kubernetes@$version from the module proxy" >&2
		return 1
	}
	KUBE_SRC=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	KUBE_GOMOD=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
}

# kube_tree VERSION DIR: k8s.io/kubernetes at VERSION as its repository
# lays it out, in DIR (writable copies): the module's source, without its
# vendor/ and go.work, and under staging/src/k8s.io/ every module its
# go.mod replaces by a directory there, copied from the published
# v0.MINOR.PATCH (staging_version), its go.mod then requiring its staging
# siblings at v0.0.0 as the repository's do. Build there (GOWORK=off,
# GOFLAGS=-mod=mod) with -trimpath: a package's build cache key then
# names its module as k8s.io/kubernetes or NAME@v0.0.0 whatever the
# release, so two releases share every package whose source, and whose
# dependencies' export data, did not change (v1.31.4 and v1.31.14 differ
# in 72 files). Built from a module of one's own instead, every package
# of a release is keyed by the release's version, and each release
# compiled whole. A staging module the proxy does not serve at any
# patch of the minor (k8s.io/sample-apiserver) gets only a go.mod, said
# on stderr: no command imports it.
kube_tree() {
	local version=$1 dir=$2 m v info src staging sedscript=''
	kube_release "$version" || return 1
	mkdir -p "$dir"
	cp -R "$KUBE_SRC/." "$dir/"
	chmod -R u+w "$dir"
	rm -rf "$dir/vendor" "$dir/go.work" "$dir/go.work.sum"
	staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/k8s\.io/[^ ]*$#\1#p' "$dir/go.mod")
	for m in $staging; do
		v=$(cd / && GOFLAGS='' staging_version "$m")
		info=$(cd / && GOFLAGS='' go mod download -json "$m@$v") || :
		src=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
		mkdir -p "$dir/staging/src/$m"
		if [ -n "$src" ]; then
			cp -R "$src/." "$dir/staging/src/$m/"
		else
			echo "$m@$v: $(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Error": "\(.*\)",\{0,1\}$/\1/p' | head -c 200); only its go.mod is laid out (a command that imports it will fail naming it)" >&2
			printf 'module %s\n\ngo 1.22.0\n' "$m" >"$dir/staging/src/$m/go.mod"
		fi
		sedscript+="s#^\\([[:space:]]*\\(require \\)\\{0,1\\}\\)${m//./\\.} v0\\.[0-9][0-9.]*#\\1$m v0.0.0#;"
	done
	chmod -R u+w "$dir/staging"
	for m in $staging; do sed -i "$sedscript" "$dir/staging/src/$m/go.mod"; done
}

kube_module() {
	local version=$1 m
	kube_release "$version" || return 1
	go mod init kubelift.local/kube-build >/dev/null 2>&1
	for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => \./staging/.*#\1#p' "$KUBE_GOMOD"); do
		go mod edit -replace "$m=$m@$(staging_version "$m")"
	done
	go mod edit -require "k8s.io/kubernetes@$version"
}
