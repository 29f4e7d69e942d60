#!/usr/bin/env bash
# Builds the add-ons a cluster runs beside Kubernetes from the Go module
# proxy and caches them by version, static (CGO_ENABLED=0):
#   etcd     etcd, etcdctl and etcdutl: go.etcd.io/etcd/server/v3,
#            etcdctl/v3 and etcdutl/v3 at VERSION in a wrapper module
#            (their go.mod replaces the sibling go.etcd.io/etcd/* modules
#            by ../ paths, which `go install pkg@version` refuses), each
#            sibling replaced instead by the published version the release
#            requires (v3.5.N, v2.305.N; 3.6 has no client/v2 and takes
#            raft from go.etcd.io/raft/v3, no sibling: the same loop serves).
#            etcdutl is what an upgrade of a member uses offline (snapshot
#            restore, defrag), so the release archive carries it too.
#   coredns  coredns: `go install github.com/coredns/coredns@VERSION`.
#   cni      the CNI plugins a node's bridge network runs (bridge,
#            host-local, loopback, portmap): `go install` of each from
#            github.com/containernetworking/plugins@VERSION, with the
#            module's LICENSE and README.md beside them, as its release
#            archive has them.
# The version is a constant in each (etcd's api/v3/version.Version,
# CoreDNS's coremain.CoreVersion); the ldflags stamp the release's git
# commit where the proxy tells it, as the projects' own builds do (the
# CNI plugins' version, which is no constant, as build_linux.sh stamps
# it).
#
#   hack/build-addons.sh etcd v3.5.15
#   hack/build-addons.sh coredns v1.11.3
#   hack/build-addons.sh cni v1.5.1
#
# Binaries land in $KUBELIFT_ADDON_CACHE/NAME/VERSION/ (default
# ~/.cache/kubelift/addons); existing ones are kept. Prints the directory.
set -euo pipefail
# A build is background work: the tests that ask for it run sandboxes
# beside it whose pods and prober must not wait behind the compiler.
renice -n 10 -p $$ >/dev/null
. "$(dirname "$0")/lib.sh"
usage="usage: $0 etcd|coredns|cni VERSION"
name=${1:?$usage}
version=${2:?$usage}
case $name in
etcd) bins=(etcd etcdctl etcdutl) ;;
coredns) bins=(coredns) ;;
cni) bins=(bridge host-local loopback portmap) ;;
*) echo "$usage" >&2; exit 2 ;;
esac
cache=${KUBELIFT_ADDON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubelift/addons}
# absolute: the build cds into a work directory before it writes there
mkdir -p "$cache" && cache=$(CDPATH='' cd -- "$cache" && pwd)
out=$cache/$name/$version
mkdir -p "$out"
built() { local b; for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done; }
if built; then echo "$out"; exit 0; fi
# One build at a time per add-on and version: the second waits, then finds
# the first one's binaries (under fetch_only, nothing is built: no lock).
if fetch_only && fetched_before "$name-$version"; then echo "$out"; exit 0; fi
if ! fetch_only; then
	exec 9>"$out/.lock"
	flock 9
	if built; then echo "$out"; exit 0; fi
fi

work=$(mktemp -d)
# Compiled objects are not kept in the user's Go cache: the binaries are
# what is kept. There each release's objects came to gigabytes that
# later builds seldom reuse, and they filled the disk the tests run on.
# make test hands every build of its run one cache (KUBELIFT_BUILD_CACHE,
# removed when the run ends); alone, a build's goes with $work.
export GOCACHE=${KUBELIFT_BUILD_CACHE:-$work/go-build}
partial="$out/.partial.$$"
trap 'rm -rf "$work" "$partial"' EXIT
mkdir -p "$partial"
cd "$work"
# The release's commit, as the proxy recorded it (not always: then none).
commit() { go list -m -json "$1" 2>/dev/null | sed -n 's/^[[:space:]]*"Hash": "\(.*\)",*$/\1/p'; }
fetch_only || echo "building $name $version" >&2
case $name in
etcd)
	mods=(go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/etcdutl/v3)
	go mod init kubelift.local/addon-build >/dev/null 2>&1
	for m in "${mods[@]}"; do
		info=$(go mod download -json "$m@$version") || {
			echo "cannot download $m@$version from the module proxy" >&2
			exit 1
		}
		gomod=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
		for s in $(sed -n 's#^[[:space:]]*\(go\.etcd\.io/etcd/[^ ]*\) => \.\./.*#\1#p' "$gomod"); do
			v=$(sed -n "s#^[[:space:]]*$s \(v[^ ]*\).*#\1#p" "$gomod")
			[ -z "$v" ] || go mod edit -replace "$s=$s@$v"
		done
	done
	# the release's go line, so GODEBUG defaults are those etcd was built with
	go mod edit -go="$(sed -n 's/^go //p' "$gomod")"
	GOFLAGS=-mod=mod go get "${mods[@]/%/@$version}" >/dev/null 2>&1 || GOFLAGS=-mod=mod go get "${mods[@]/%/@$version}"
	if fetch_only; then
		CGO_ENABLED=0 GOFLAGS=-mod=mod go list -deps "${mods[@]}" >/dev/null
		echo "fetched the modules of $name $version" >&2
		echo "$out"
		exit 0
	fi
	sha=$(commit "go.etcd.io/etcd/etcdctl/v3@$version")
	ld="-s -w${sha:+ -X go.etcd.io/etcd/api/v3/version.GitSHA=${sha:0:9}}"
	CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ld" -o "$partial/" "${mods[@]}"
	# go build names each binary after the path element before /v3
	mv "$partial/server" "$partial/etcd"
	;;
coredns)
	if fetch_only; then
		# what go install MODULE@VERSION would download: the module's
		# own requirements, resolved in a module that requires only it
		go mod init kubelift.local/addon-build >/dev/null 2>&1
		GOFLAGS=-mod=mod go get "github.com/coredns/coredns@$version" >/dev/null 2>&1 || GOFLAGS=-mod=mod go get "github.com/coredns/coredns@$version"
		CGO_ENABLED=0 GOFLAGS=-mod=mod go list -deps github.com/coredns/coredns >/dev/null
		echo "fetched the modules of $name $version" >&2
		echo "$out"
		exit 0
	fi
	sha=$(commit "github.com/coredns/coredns@$version")
	ld="-s -w${sha:+ -X github.com/coredns/coredns/coremain.GitCommit=${sha:0:7}}"
	CGO_ENABLED=0 GOBIN=$partial go install -trimpath -ldflags "$ld" "github.com/coredns/coredns@$version"
	;;
cni)
	mod=github.com/containernetworking/plugins
	pkgs=("$mod/plugins/main/bridge@$version" "$mod/plugins/ipam/host-local@$version" "$mod/plugins/main/loopback@$version" "$mod/plugins/meta/portmap@$version")
	if fetch_only; then
		# what go install PKG@VERSION would download, as for coredns
		go mod init kubelift.local/addon-build >/dev/null 2>&1
		GOFLAGS=-mod=mod go get "$mod@$version" >/dev/null 2>&1 || GOFLAGS=-mod=mod go get "$mod@$version"
		CGO_ENABLED=0 GOFLAGS=-mod=mod go list -deps "${pkgs[@]%@*}" >/dev/null
		echo "fetched the modules of $name $version" >&2
		echo "$out"
		exit 0
	fi
	ld="-s -w -X $mod/pkg/utils/buildversion.BuildVersion=$version"
	CGO_ENABLED=0 GOBIN=$partial go install -trimpath -ldflags "$ld" "${pkgs[@]}"
	src=$(go mod download -json "$mod@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	install -m 0644 "$src/LICENSE" "$src/README.md" "$out/"
	;;
esac
for b in "${bins[@]}"; do mv "$partial/$b" "$out/$b"; done
built_note "built $name $version in ${SECONDS}s"
echo "$out"
