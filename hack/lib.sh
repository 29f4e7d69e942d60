# shellcheck shell=bash disable=SC2034 # sourced: the variables it sets are its callers'
# Shared by kubelift's build scripts: how to build against k8s.io/kubernetes
# from the Go module proxy. Source it; then, in an empty directory:
#   kube_module VERSION
# makes a Go module there requiring k8s.io/kubernetes@VERSION with every
# staging module its go.mod replaces by a local path (./staging/...)
# replaced instead by the published v0.MINOR.PATCH, and sets
# KUBE_MINOR, KUBE_STAGING (v0.MINOR.PATCH), KUBE_SRC (the module's source
# in the module cache) and KUBE_LDFLAGS (version stamping).

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
		go mod edit -replace "$m=$m@$KUBE_STAGING"
	done
	go mod edit -require "k8s.io/kubernetes@$version"
	KUBE_LDFLAGS="-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$KUBE_MINOR -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
}
