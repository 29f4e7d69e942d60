#!/usr/bin/env bash
# Prints, for each Kubernetes release after the first given, what the
# catalog records of it that can be read off the source at the tags (from
# the Go module proxy): the images kubeadm lists, the CNI version
# Kubernetes was built with, the kubelet flags it removed and the API
# resources it stops serving. Used to write manifests/catalog.yaml; nothing
# here is guessed.
#
#   hack/catalog-facts.sh v1.34.4 v1.35.4 v1.36.3 v1.37.2
#
# Removed kubelet flags: flags registered (fs.XxxVar(..., "name", ...)) in
# cmd/kubelet/app/options and pkg/kubelet/config/flags.go at the previous
# tag and not at this one; the control plane's the same way over its
# commands and the staging modules' options (a sum over all four
# components: a flag that went is then looked up by hand). Removed APIs: the types whose
# APILifecycleRemoved() in k8s.io/api's zz_generated.prerelease-lifecycle.go
# (at the last tag's staging version) returns this minor; the API server
# stops serving a type at that minor.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 VERSION VERSION..." >&2; exit 2; }

src() { go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'; }

kubelet_flags() {
	local dir=$1 f
	for f in cmd/kubelet/app/options/options.go cmd/kubelet/app/options/osflags_others.go pkg/kubelet/config/flags.go; do
		if [ -f "$dir/$f" ]; then cat "$dir/$f"; fi
	done |
		grep -ohE 'fs\.[A-Za-z0-9]+\([^"]*"[a-z0-9-]+"' | sed -E 's/.*"([a-z0-9-]+)"$/--\1/' | sort -u
}

# The control plane's flags: those registered in its commands' packages
# and in the staging modules they share (apiserver, controller-manager,
# cloud-provider options; component-base logs and feature gates).
server_flags() {
	local v=$1 dir staging m
	dir=$(src "k8s.io/kubernetes@$v")
	staging=v0.${v#v1.}
	{
		grep -rhoE --include=*.go --exclude=*_test.go '(fs|fss|flagset|flags)\.[A-Za-z0-9]+\([^"]*"[a-z0-9-]+"' \
			"$dir"/cmd/kube-apiserver "$dir"/cmd/kube-controller-manager "$dir"/cmd/kube-scheduler "$dir"/cmd/kube-proxy \
			"$dir"/pkg/kubeapiserver "$dir"/pkg/controlplane 2>/dev/null || true
		for m in apiserver:pkg/server/options controller-manager:options cloud-provider:options component-base:logs component-base:featuregate; do
			grep -rhoE --include=*.go --exclude=*_test.go '(fs|fss|flagset|flags)\.[A-Za-z0-9]+\([^"]*"[a-z0-9-]+"' \
				"$(src "k8s.io/${m%%:*}@$staging")/${m#*:}" 2>/dev/null || true
		done
	} | sed -E 's/.*"([a-z0-9-]+)"$/--\1/' | sort -u
}

last=${!#}
last_minor=${last#v1.}; last_minor=${last_minor%%.*}
api=$(src "k8s.io/api@v0.$last_minor.${last##*.}")
# "MINOR group/version/resource" for every type k8s.io/api says is removed.
removed=$(
	cd "$api"
	for f in $(find . -name zz_generated.prerelease-lifecycle.go | sort); do
		gv=${f#./}; gv=${gv%/zz_generated.prerelease-lifecycle.go}
		awk -v gv="$gv" '
			/^func \(in \*[A-Za-z0-9]+\) APILifecycleRemoved\(\)/ { t = $3; sub(/^\*/, "", t); sub(/\)$/, "", t) }
			/return [0-9]+, [0-9]+/ && t != "" { m = $3; print m, gv, t; t = "" }' "$f"
	done | grep -v 'List$'
)
group_of() { # k8s.io/api directory -> API group
	case $1 in
	core) echo "" ;;
	apps | batch | policy) echo "$1" ;;
	authentication | authorization | certificates | coordination | discovery | events | networking | node | rbac | resource | scheduling | storage | storagemigration | admissionregistration | apidiscovery | imagepolicy) echo "$1.k8s.io" ;;
	autoscaling) echo autoscaling ;;
	flowcontrol | apiserverinternal) echo "$1.apiserver.k8s.io" ;;
	*) echo "$1" ;;
	esac
}
prev=$1
shift
for v in "$@"; do
	minor=${v#v1.}; minor=${minor%%.*}
	old=$(src "k8s.io/kubernetes@$prev")
	new=$(src "k8s.io/kubernetes@$v")
	consts=$new/cmd/kubeadm/app/constants/constants.go
	echo "== $v (after $prev)"
	for c in PauseVersion DefaultEtcdVersion CoreDNSVersion; do
		printf '  %-20s %s\n' "$c" "$(sed -n "s/^[[:space:]]*$c = \"\(.*\)\"/\1/p" "$consts")"
	done
	printf '  %-20s %s\n' cni "$(awk '/name: "cni"/ { p = 1 } p && /version:/ { print $2; exit }' "$new/build/dependencies.yaml")"
	printf '  %-20s %s\n' removedKubeletFlags "$(comm -23 <(kubelet_flags "$old") <(kubelet_flags "$new") | tr '\n' ' ')"
	printf '  %-20s %s\n' removedServerFlags "$(comm -23 <(server_flags "$prev") <(server_flags "$v") | tr '\n' ' ')"
	printf '  %-20s' removedAPIs
	echo "$removed" | awk -v m="$minor" '$1 == m { print $2, $3 }' | while read -r gv t; do
		g=$(group_of "${gv%%/*}")
		# apidiscovery's types are discovery documents, not resources
		[ "${gv%%/*}" = apidiscovery ] && continue
		# resource: the type's plural as the API serves it
		r=$(echo "$t" | tr 'A-Z' 'a-z')
		case $r in *y) r=${r%y}ies ;; *s) r=${r}es ;; *) r=${r}s ;; esac
		printf ' %s/%s/%s' "$g" "${gv#*/}" "$r"
	done
	echo
	prev=$v
done
