# kubelift. On a fresh Debian machine: `make demo`, `make test`.
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/kubelift/kubelift/internal/buildinfo.Version=$(VERSION)
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian packages the tests, the demo and the benchmarks run for real.
DEB_PACKAGES := docker-registry skopeo apache2-utils openssl tar coreutils time etcd-server iproute2 patch util-linux \
	openssh-server openssh-client curl etcd-client shellcheck \
	gcc libc6-dev libseccomp-dev pkg-config containernetworking-plugins iptables conntrack chromium-headless-shell
TOOLS   := $(CURDIR)/bin/tools
CRANE_VERSION := v0.22.1

.PHONY: all build deps tools lint test test-race demo demo-kubeadm bench bench-scale kubernetes kubelet hash-vectors clean sandbox-up sandbox-down sandbox-status

all: build

# Static (no cgo): the upgrade program runs on any admin machine, and is
# the agent's image (bundle create --agent), which holds nothing else.
build:
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/...

INOTIFY_INSTANCES = 1024

deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
	@# Two clusters side by side (make test runs two sandboxes at once) need
	@# more inotify instances than Linux's default 128 per user: every
	@# kubelet, API server, controller manager and containerd watches files
	@# (kind gives the same advice for several clusters on one host).
	@if [ "$$(cat /proc/sys/fs/inotify/max_user_instances)" -lt $(INOTIFY_INSTANCES) ]; then \
		echo "raising fs.inotify.max_user_instances to $(INOTIFY_INSTANCES) (several clusters on one host)"; \
		$(SUDO) sysctl -qw fs.inotify.max_user_instances=$(INOTIFY_INSTANCES); \
	fi

tools: $(TOOLS)/crane

$(TOOLS)/crane:
	GOBIN=$(TOOLS) $(GO) install github.com/google/go-containerregistry/cmd/crane@$(CRANE_VERSION)

# Compiles collect their garbage less often (hack/lib.sh says what it
# saves): for go vet, kubelift's programs and the unit tests. The story
# packages run the product as users do, at Go's defaults.
GOGC_BUILD := GOGC=$${GOGC:-400} GOMEMLIMIT=$${GOMEMLIMIT:-4GiB}

# Node scripts (internal/nodescript/scripts) run as root on every node:
# shellcheck-clean as POSIX sh, like every tracked shell script.
lint: deps
	shellcheck -s sh internal/nodescript/scripts/*.sh
	shellcheck -S warning $$(git ls-files '*.sh' | grep -v '^internal/nodescript/scripts/')
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GOGC_BUILD) $(GO) vet ./...
	cd pkg/hashskip && $(GOGC_BUILD) $(GO) vet ./...

# The host's Kubernetes paths are recorded before the tests and checked
# after them (hack/host-guard.sh): a test that writes one fails the run.
# The Kubernetes releases the tests build share one Go cache for the run,
# removed at its end (hack/build-kubernetes.sh); hack/disk-check.sh first
# refuses a disk without room for the run's peak. What the run built, and
# how long each build took, is printed at its end (KUBELIFT_BUILD_LOG:
# on a new machine most of the run's time).
#
# On a cold machine the builds are most of the run: hack/prebuild.sh
# builds every release the stories need, one after the other, niced, in
# the background from the start of the unit tests, so that the builds
# fill the time the unit tests and the waiting stories leave (a story
# that asks for a release meanwhile waits for that build; nothing is
# built twice); it downloads every build's Go modules first, beside the
# first build. kubelift's own programs are built once for every story
# ($$KUBELIFT_TEST_BIN). The story packages run two at a time, the
# longest first but kubeadmha (TEST_FIRST, below): the patch stories need the releases the
# prebuild makes first, and the kubeadm stories mostly wait on their
# clusters, leaving the CPU to the builds. Before them test/env/fleet,
# which needs no build: it runs while the first builds do, not in the
# run's last minutes, when the CPU is half idle. Three at a time was tried
# twice: the first time it filled the disk (40 GB above its start); the
# second (FC22) put the load average at 51 with three sandboxes up, the
# apply story's prober saw requests time out, and the niced builds, left
# a fraction of the CPU, had not built v1.32.13 58 minutes in
# (docs/development.md). The lint's go vet has vetted every package and
# its tests: go test does not vet them again (-vet=off: vet took 1.2
# CPU-minutes of a cold run, not 3.9), and links test binaries without
# DWARF (-ldflags=-w: a failing test's stack trace needs none).
# The unit tests run without the race detector: its build compiles every
# dependency a second time, instrumented (client-go, the API types, gRPC:
# 492 CPU-seconds against 64 without it, measured from one empty cache
# after the lint's), about four minutes of a cold run's CPU on 2 cores.
# make test-race runs them with it; run it after a
# change to anything that shares memory between goroutines (the
# runbook's nodes in flight, the stager, the lock's keeper, the waiter).
TEST_DISK_GB ?= 20
TEST_PARALLEL ?= 2
# test/stories/kubeadmha runs after the builds (after engine): started
# first, beside applyha's HA sandbox, a Kubernetes build and the kubeadm
# story's boot (load average 20 to 37 on 2 cores), its prober saw
# worker-1's pods miss the 2 s deadline in FC18, FC28 and stop 53's CI
# run, and in FC29 and FC30 with the CPU weighed two other ways between
# the sandboxes and the test processes (docs/sandbox.md); alone it
# passed with none.
# The prebuild runs in a process group of its own (bash's job control, so
# that an interrupted run can stop it whole) but in make's session: Linux's
# autogroup scheduling shares the CPU between sessions before nice values
# count, and in a session of its own (setsid) the niced builds took half
# the machine from the unit tests, or, niced as a session, waited behind
# every build a test started.
test: SHELL := /bin/bash
TEST_FIRST := env/fleet stories/applyha stories/kubeadm env/sandbox stories/apply stories/multihop \
	stories/agent stories/controller stories/drain stories/engine stories/kubeadmha env/simcluster stories/scale upstream stories/e2e
test: deps lint
	@hack/disk-check.sh $(TEST_DISK_GB)
	@guard=$$(mktemp); export KUBELIFT_BUILD_CACHE=$$(mktemp -d -t go-build-kubelift.XXXXXX); \
	export KUBELIFT_BUILD_LOG=$$(mktemp) KUBELIFT_TEST_BIN=$$(mktemp -d -t kubelift-bin.XXXXXX); prebuild_log=$$(mktemp); pb=; \
	trap '[ -z "$$pb" ] || kill -- -$$pb 2>/dev/null; rm -rf "$$KUBELIFT_BUILD_CACHE" "$$guard" "$$KUBELIFT_BUILD_LOG" "$$KUBELIFT_TEST_BIN" "$$prebuild_log"' EXIT; trap 'exit 130' INT TERM; \
	hack/host-guard.sh snapshot $$guard; rc=0; \
	CGO_ENABLED=0 $(GOGC_BUILD) $(GO) build -o $$KUBELIFT_TEST_BIN/ ./cmd/bundle ./cmd/upgrade ./test/env/sandbox/cmd/kubelift-sandbox || exit 1; \
	set -m; hack/prebuild.sh $$KUBELIFT_TEST_BIN/kubelift-sandbox >$$prebuild_log 2>&1 & pb=$$!; set +m; \
	echo "$$(date -u +%T) unit tests; the stories' releases build meanwhile (hack/prebuild.sh)"; \
	(cd pkg/hashskip && $(GOGC_BUILD) $(GO) test -vet=off -ldflags=-w -count=1 ./...) || rc=1; \
	$(GOGC_BUILD) $(GO) test -vet=off -ldflags=-w -count=1 ./cmd/... ./internal/... || rc=1; \
	echo "$$(date -u +%T) sandboxes and stories (test/)"; \
	pkgs=$$($(GO) list ./test/... | awk -v first="$(TEST_FIRST)" \
		'BEGIN { n = split(first, f, " "); for (i = 1; i <= n; i++) rank["github.com/kubelift/kubelift/test/" f[i]] = i } \
		{ r = ($$0 in rank) ? rank[$$0] : n + 1; print r, NR, $$0 }' | sort -n -k1,1 -k2,2 | cut -d " " -f 3); \
	$(GO) test -vet=off -ldflags=-w -count=1 -p $(TEST_PARALLEL) -timeout 45m $$pkgs || rc=1; \
	echo "$$(date -u +%T) done"; \
	if kill -0 $$pb 2>/dev/null; then kill -- -$$pb 2>/dev/null; wait $$pb; echo "hack/prebuild.sh was still building when the tests ended: stopped"; \
	elif ! wait $$pb; then echo "hack/prebuild.sh failed (each story built what it needed itself); its end:"; tail -n 20 $$prebuild_log | sed 's/^/  /'; fi; pb=; \
	if [ -s "$$KUBELIFT_BUILD_LOG" ]; then echo "built during this run (UTC):"; sed 's/^/  /' "$$KUBELIFT_BUILD_LOG"; fi; \
	hack/host-guard.sh check $$guard || rc=1; exit $$rc

# The unit tests (cmd/, internal/, pkg/hashskip) with the race detector,
# no sandbox: what make test leaves out to stay within the hour.
test-race: deps lint
	(cd pkg/hashskip && $(GOGC_BUILD) $(GO) test -race -vet=off -count=1 ./...)
	$(GOGC_BUILD) $(GO) test -race -vet=off -count=1 ./cmd/... ./internal/...

demo: deps build sandbox-up
	$(GO) run ./test/demo --sandbox $(SANDBOX_DIR)

# The same story on a kubeadm-built sandbox (kubeadm init and join, static
# control-plane pods), in a directory and on addresses of its own.
KUBEADM_SANDBOX_DIR ?= $(CURDIR)/.sandbox-kubeadm
demo-kubeadm: deps build bin/kubelift-sandbox
	$(SUDO) bin/kubelift-sandbox up --dir $(KUBEADM_SANDBOX_DIR) --kubeadm --name kk --subnet 10.79.0
	$(GO) run ./test/demo --sandbox $(KUBEADM_SANDBOX_DIR)

# The sandbox cluster (test/env/sandbox): state in $(SANDBOX_DIR); flags via
# SANDBOX_FLAGS, e.g. SANDBOX_FLAGS="--control-planes 3 --workers 2".
SANDBOX_DIR   ?= $(CURDIR)/.sandbox
SANDBOX_FLAGS ?=
bin/kubelift-sandbox: FORCE
	$(GO) build -o $@ ./test/env/sandbox/cmd/kubelift-sandbox
FORCE:

sandbox-up: deps bin/kubelift-sandbox
	$(SUDO) bin/kubelift-sandbox up --dir $(SANDBOX_DIR) $(SANDBOX_FLAGS)

sandbox-down: bin/kubelift-sandbox
	$(SUDO) bin/kubelift-sandbox down --dir $(SANDBOX_DIR)

sandbox-status: bin/kubelift-sandbox
	bin/kubelift-sandbox status --dir $(SANDBOX_DIR)

bench: deps build tools
	$(GO) run ./test/bench $(BENCH_FLAGS)

# The scale simulation (test/stories/scale: a real API server and controller
# manager, KWOK's Nodes, an SSH fleet on 127.x addresses): 1000 workers
# upgraded with --max-unavailable 50 and then 100, each against the ideal
# schedule. SCALE_FLAGS, e.g. SCALE_FLAGS="-nodes 5000 -batches 100".
SCALE_FLAGS ?=
bench-scale: deps build
	$(GO) run ./test/bench -only scale $(SCALE_FLAGS)

# Real Kubernetes binaries from the Go module proxy, cached by version
# (the tests build what they need through the same script).
kubernetes:
	hack/build-kubernetes.sh $(KUBE_VERSION) kube-apiserver

# The real kubelet with kubelift's hash-skip patch (hack/kubelet/v1.MINOR/),
# built from the Go module proxy; KUBELET_TEST=1 also runs upstream's
# pkg/kubelet/kuberuntime tests on the patched copy.
KUBE_VERSION ?= v1.31.4
kubelet:
	hack/build-kubelet.sh $(KUBE_VERSION) $(if $(KUBELET_TEST),--test)

# kubeletcompat's vectors from the real kubelet code at each tag (slow:
# builds k8s.io/kubernetes/pkg/kubelet/container; not run by make test).
hash-vectors:
	hack/kubelet-hash-vectors.sh v1.26.15 v1.28.15 v1.30.14 v1.31.4 v1.32.13 v1.33.13 v1.34.4 v1.35.4 v1.36.3 v1.37.2

clean: sandbox-down
	-$(SUDO) bin/kubelift-sandbox down --dir $(KUBEADM_SANDBOX_DIR)
	rm -rf bin .demo
