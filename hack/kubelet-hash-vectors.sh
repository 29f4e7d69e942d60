#!/usr/bin/env bash
# Writes internal/kubeletcompat/testdata/vectors-VERSION.json: the hashes
# the real kubelet code (k8s.io/kubernetes/pkg/kubelet/container at the
# release tag) computes for testdata/containers.json. Run by
# `make hash-vectors`; the tests compare kubeletcompat against the output.
#
#   hack/kubelet-hash-vectors.sh v1.30.14 [v1.31.4 ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
testdata=$root/internal/kubeletcompat/testdata
. "$root/hack/lib.sh"
for version in "$@"; do
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	(
		cd "$work"
		kube_module "$version"
		cp "$root/hack/hashvectors/main.go" main.go
		sed -i 's#^//go:build ignore$##' main.go
		if [ "$KUBE_MINOR" -ge 27 ] && [ "$KUBE_MINOR" -lt 31 ]; then
			printf 'package main\n\nimport kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"\n\nvar hashWithoutResources = kubecontainer.HashContainerWithoutResources\n' > shim.go
		else
			printf 'package main\n\nimport v1 "k8s.io/api/core/v1"\n\nvar hashWithoutResources func(*v1.Container) uint64\n' > shim.go
		fi
		GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || GOFLAGS=-mod=mod go mod tidy
		GOFLAGS=-mod=mod go build -ldflags "-X k8s.io/component-base/version.gitVersion=$version" -o hashvectors .
		./hashvectors "$testdata/containers.json" > "$testdata/.vectors-$version.json.partial"
		mv "$testdata/.vectors-$version.json.partial" "$testdata/vectors-$version.json"
	)
	rm -rf "$work"
	echo "wrote $testdata/vectors-$version.json" >&2
done
