#!/usr/bin/env bash
# Builds the sandbox's container runtime from the Go module proxy and caches
# it by version: containerd, its runc shim and ctr
# (github.com/containerd/containerd/v2, or github.com/containerd/containerd
# for a 1.x), runc (github.com/opencontainers/runc, cgo, with seccomp) and
# crictl (sigs.k8s.io/cri-tools), each with version ldflags so that
# --version prints the real version.
#
#   hack/build-runtime.sh [CONTAINERD_VERSION [RUNC_VERSION [CRICTL_VERSION]]]
#
# Binaries land in $KUBELIFT_RUNTIME_CACHE/containerd-V_runc-V_crictl-V/
# (default ~/.cache/kubelift/runtime/...); a complete directory is kept.
# Prints the directory.
set -euo pipefail
# A build is background work: the tests that ask for it run sandboxes
# beside it whose pods and prober must not wait behind the compiler.
renice -n 10 -p $$ >/dev/null
. "$(dirname "$0")/lib.sh"
containerd=${1:-v2.3.7}
runc=${2:-v1.5.2}
crictl=${3:-v1.34.0}
cache=${KUBELIFT_RUNTIME_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubelift/runtime}
# absolute: the build cds into a work directory before it writes there
mkdir -p "$cache" && cache=$(CDPATH='' cd -- "$cache" && pwd)
out=$cache/containerd-${containerd}_runc-${runc}_crictl-${crictl}
bins=(containerd containerd-shim-runc-v2 ctr runc crictl)
complete() { for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done; }
mkdir -p "$out"
if complete; then echo "$out"; exit 0; fi
# One build at a time (test packages run side by side); under fetch_only
# (hack/lib.sh) nothing is built: no lock.
if ! fetch_only; then
	exec 9>"$out/.lock"
	flock 9
	if complete; then echo "$out"; exit 0; fi
fi

work=$(mktemp -d)
# Compiled objects are not kept in the user's Go cache: the binaries are
# what is kept. There each release's objects came to gigabytes that
# later builds seldom reuse, and they filled the disk the tests run on.
# make test hands every build of its run one cache (KUBELIFT_BUILD_CACHE,
# removed when the run ends); alone, a build's goes with $work.
export GOCACHE=${KUBELIFT_BUILD_CACHE:-$work/go-build}
partial="$out/.partial.$$"
mkdir -p "$partial"
trap 'rm -rf "$work" "$partial"' EXIT

# module NAME MODULE@VERSION: an empty Go module in $work/NAME requiring
# MODULE@VERSION (each program its own, so their dependencies never mix);
# leaves the shell there.
module() {
	mkdir -p "$work/$1"
	cd "$work/$1"
	go mod init "kubelift.local/$1-build" >/dev/null 2>&1
	GOFLAGS=-mod=mod go get "$2" >/dev/null 2>&1 || GOFLAGS=-mod=mod go get "$2"
}

# containerd 1.x is the module without /v2 (its last line, 1.7, is what
# nodes run that Kubernetes after v1.35 no longer supports).
case $containerd in
v1.*) cmod=github.com/containerd/containerd ;;
*) cmod=github.com/containerd/containerd/v2 ;;
esac
tags=no_btrfs,urfave_cli_no_docs,osusergo,netgo,static_build

if fetch_only && fetched_before "runtime-$containerd-$runc-$crictl"; then echo "$out"; exit 0; fi
# gobuild CGO TAGS LDFLAGS PKG...: go build into $partial, or under
# fetch_only (hack/lib.sh) go list -deps of the same packages, tags and
# cgo setting: the modules the build would compile, downloaded, and
# nothing built.
gobuild() {
	local cgo=$1 tags=$2 ld=$3
	shift 3
	if fetch_only; then
		CGO_ENABLED=$cgo GOFLAGS=-mod=mod go list -deps -tags "$tags" "$@" >/dev/null
		return
	fi
	CGO_ENABLED=$cgo GOFLAGS=-mod=mod go build -trimpath -tags "$tags" -ldflags "$ld" -o "$partial/" "$@"
}

fetch_only || echo "building containerd $containerd, runc $runc, crictl $crictl" >&2
# containerd: no cgo (the btrfs snapshotter, which needs it, is not used);
# tags as containerd's Makefile sets them for a static build, the shim
# without gRPC, as there.
module containerd "$cmod@$containerd"
ld="-s -w -X $cmod/version.Version=$containerd -X $cmod/version.Revision=module-proxy"
gobuild 0 "$tags" "$ld" "$cmod/cmd/containerd" "$cmod/cmd/ctr"
gobuild 0 "$tags,no_grpc" "$ld" "$cmod/cmd/containerd-shim-runc-v2"

# runc: its nsenter is C (cgo), seccomp through libseccomp (Debian's -dev).
module runc "github.com/opencontainers/runc@$runc"
gobuild 1 seccomp,urfave_cli_no_docs "-s -w -X main.version=${runc#v} -X main.gitCommit=module-proxy" \
	github.com/opencontainers/runc

module crictl "sigs.k8s.io/cri-tools@$crictl"
gobuild 0 "" "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl" sigs.k8s.io/cri-tools/cmd/crictl
if fetch_only; then
	echo "fetched the modules of containerd $containerd, runc $runc, crictl $crictl" >&2
	echo "$out"
	exit 0
fi
for b in "${bins[@]}"; do mv "$partial/$b" "$out/$b"; done
built_note "built containerd $containerd, runc $runc, crictl $crictl in ${SECONDS}s"
echo "$out"
