# crisp: build, run and test. Builds need cgo (libcontainer's nsenter) and the
# seccomp tag with Debian's libseccomp-dev. grpcnotrace leaves gRPC's x/net/trace (and
# the html/template it pulls in) out of criserver: 19.6 -> 15.9 MB, idle RSS -2.6 MiB.
# nri_no_wasm leaves the NRI library's WebAssembly plugin runtime (wazero) out: NRI
# plugins are executables and socket clients only; NRI costs criserver 1.8 MB with the
# tag, 4.4 MB without (21.9 -> 23.7 / 26.3 MB stripped).
GO        ?= go
PREFIX    ?= /usr/local
BINDIR    ?= bin
TAGS      ?= seccomp grpcnotrace nri_no_wasm
UNITDIR   ?= /etc/systemd/system
# VERSION is a semantic version, as the CRI's runtime_version must be: the release in
# internal/version/VERSION on its tag v<release> in a clean tree (0.1.0), else
# <release>-dev+<commit> with .dirty for uncommitted changes (0.1.0-dev+4a6c72a1b2c3.dirty),
# and <release>-dev outside git. A VERSION= given to make must be semver too.
VERSION   ?= $(shell r=$$(cat internal/version/VERSION); \
	if ! c=$$(git rev-parse --short=12 HEAD 2>/dev/null); then echo "$$r-dev"; exit 0; fi; \
	d=$$(git --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null | head -c1); \
	d=$${d:+.dirty}; \
	if [ -z "$$d" ] && [ "$$(git rev-parse -q --verify "refs/tags/v$$r^{commit}")" = "$$(git rev-parse HEAD)" ]; \
	then echo "$$r"; else echo "$$r-dev+$$c$$d"; fi)
LDFLAGS   := -s -w -X github.com/crisp-runtime/crisp/internal/version.Version=$(VERSION)
GOBUILD   := CGO_ENABLED=1 $(GO) build -trimpath -tags '$(TAGS)' -ldflags '$(LDFLAGS)'
# The shim is linked statically: every pod runs one shim and one pause process (the shim
# binary re-executed), and without the dynamic loader neither pays for relocating libc
# and libseccomp in private pages. osusergo and netgo keep glibc's NSS out of it.
SHIMBUILD := CGO_ENABLED=1 $(GO) build -trimpath -tags '$(TAGS) osusergo netgo' \
	-ldflags '$(LDFLAGS) -linkmode external -extldflags -static'
DEPS      := busybox-static containernetworking-plugins libseccomp-dev libc6-dev iproute2 iptables gcc make

.PHONY: all build criserver shim shim-wasm shimtest-bin shimtest install run test test-node unit e2e deps criu lint clean bench chaos containerd cosign gvisor deb critest critest-containerd

all: build

build: criserver shim shim-wasm shimtest-bin

# criserver and shim build one binary each; the tests build through these targets too,
# so that they run what `make build` ships.
criserver:
	$(GOBUILD) -o $(BINDIR)/criserver ./cmd/criserver

shim:
	$(SHIMBUILD) -o $(BINDIR)/shim-runc ./cmd/shim-runc

# shim-wasm: the WebAssembly sandboxer (docs/sandboxer.md), a RuntimeClass handler
# configured under [runtimes.wasm]; built like shim-runc (its pause is the same).
shim-wasm:
	$(SHIMBUILD) -o $(BINDIR)/shim-wasm ./cmd/shim-wasm

# crisp-shimtest: the shim conformance suite's command (docs/shim-conformance.md).
shimtest-bin:
	$(GOBUILD) -o $(BINDIR)/crisp-shimtest ./cmd/crisp-shimtest

# make shimtest SHIM=path [MODE=sandbox|task] [SHIMTESTFLAGS=...]: check a shim binary.
SHIM          ?= $(BINDIR)/shim-runc
MODE          ?= sandbox
SHIMTESTFLAGS ?=
shimtest: shimtest-bin
	$(BINDIR)/crisp-shimtest --shim $(SHIM) --mode $(MODE) $(SHIMTESTFLAGS)

install: build
	install -D -m 0755 $(BINDIR)/criserver $(DESTDIR)$(PREFIX)/bin/criserver
	install -D -m 0755 $(BINDIR)/shim-runc $(DESTDIR)$(PREFIX)/bin/shim-runc
# containerd 2.x finds runtime_type io.containerd.crisp.v1 as this name on its PATH.
	ln -sfn shim-runc $(DESTDIR)$(PREFIX)/bin/containerd-shim-crisp-v1
# The WebAssembly sandboxer, the default configuration's handler "wasm".
	install -D -m 0755 $(BINDIR)/shim-wasm $(DESTDIR)$(PREFIX)/bin/shim-wasm
# The unit runs /usr/bin/criserver (the package's path): with another PREFIX its
# ExecStart is rewritten to the installed binary. UNITDIR is systemd's admin unit dir.
	install -d $(DESTDIR)$(UNITDIR)
	sed 's|/usr/bin/criserver|$(PREFIX)/bin/criserver|' contrib/systemd/crisp.service \
		> $(DESTDIR)$(UNITDIR)/crisp.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/crisp.service
# The unit reads /etc/crisp/config.toml: the package's default, never over an edited one.
	[ -e $(DESTDIR)/etc/crisp/config.toml ] || \
		install -D -m 0644 packaging/deb/config.toml $(DESTDIR)/etc/crisp/config.toml

# deb builds $(DEBDIR)/crisp_<version>_<arch>.deb (hack/deb.sh): criserver, shim-runc
# and shim-wasm, the containerd-shim-crisp-v1 link, the systemd unit,
# /etc/crisp/config.toml as a conffile, the copyright file and the man pages (made with
# go-md2man from docs/man); depends on containernetworking-plugins, iptables and
# libseccomp2.
DEBDIR   ?= $(BINDIR)
DEB_DEPS := go-md2man
deb: build
	@if ! dpkg -s $(DEB_DEPS) >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEB_DEPS); \
	fi
	hack/deb.sh $(BINDIR) '$(VERSION)' $(DEBDIR)

# deps installs the Debian packages crisp needs at run time and for its tests.
deps:
	@if ! dpkg -s $(DEPS) >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEPS); \
	fi

# criu installs CRIU >= 4, which checkpoint/restore needs (Debian 12's 3.17 fails on
# kernels >= 6.x); a no-op when a working criu is on PATH. Not part of `make run`:
# building it takes minutes and only checkpoints need it.
criu:
	hack/criu.sh

# containerd builds containerd 2.4.2 and its runc shim from the Go module proxy into
# /var/cache/crisp/containerd-v2.4.2 (CONTAINERD_CACHE) for test/e2e/containerd_test.go; a
# no-op when the cached binaries are there.
containerd:
	hack/containerd.sh

# cosign builds the cosign CLI v2.6.5 (hack/cosign.sh) into /var/cache/crisp/cosign-v2.6.5
# (COSIGN_CACHE) for internal/image/remote/cosign_test.go; a no-op when it is there.
cosign:
	hack/cosign.sh

# critest builds cri-tools' CRI validation suite (hack/critest.sh) into
# /var/cache/crisp/critest-v1.36.0 (CRITEST_CACHE); a no-op when the cached binary is there.
critest:
	hack/critest.sh

# critest-containerd runs critest through containerd 2.4.2 once per runtime handler
# (runc, crisp-pod, crisp-shim; root, 4-5 minutes) and fails when a spec that passes on runc
# does not pass on crisp's handlers (test/e2e/containerd_critest_test.go). critest's output and
# JSON reports go to CRITEST_OUT; CRITEST_HANDLERS and CRITEST_FOCUS (a ginkgo regexp)
# narrow the run.
CRITEST_OUT      ?= $(BINDIR)/critest
CRITEST_HANDLERS ?= runc crisp-pod crisp-shim
CRITEST_FOCUS    ?=
critest-containerd: deps containerd critest
	CRISP_CRITEST=1 CRISP_CRITEST_OUT='$(abspath $(CRITEST_OUT))' \
		CRISP_CRITEST_HANDLERS='$(CRITEST_HANDLERS)' CRISP_CRITEST_FOCUS='$(CRITEST_FOCUS)' \
		CGO_ENABLED=1 $(GO) test -tags '$(TAGS)' -count=1 -p 1 -timeout 120m \
		-run '^TestE2EContainerdCritest$$' -v ./test/e2e/

# gvisor builds runsc and containerd-shim-runsc-v1 (hack/gvisor.sh, two documented
# patches) into /var/cache/crisp/gvisor-<version> (GVISOR_CACHE) for test/e2e/gvisor_test.go;
# a no-op when the cached binaries are there.
gvisor:
	hack/gvisor.sh

# run starts criserver with its defaults (socket /run/crisp/crisp.sock).
run: deps build
	PATH="$(CURDIR)/$(BINDIR):$$PATH" $(BINDIR)/criserver

# test runs the unit tests and the end-to-end tests (the latter need root), then the
# node tests in the node VM (test-node below). SKIP_NODE=1 leaves the VM out.
# test runs lint, vet, every package's tests, then critest through containerd 2.4.2 on
# crisp's handlers against containerd's own (SKIP_CRITEST=1 leaves it out, ~5 min) and
# the node VM of each flavour in TEST_NODE_FLAVOURS (SKIP_NODE=1 leaves it out, ~20 min
# with critest in the guests). The end-to-end package alone takes ~20 min on this 2-core
# machine: its timeout leaves room. The SELinux guest runs in `make test-node`, not
# here: a third TCG guest on this 2-core host slowed the AppArmor guests' suites past
# their timeout, and its image adds ~11 min to a cold CI run.
TEST_NODE_FLAVOURS ?= apparmor
test: lint deps criu containerd gvisor critest
	CGO_ENABLED=1 $(GO) vet -tags '$(TAGS)' ./...
	CGO_ENABLED=1 $(GO) test -tags '$(TAGS)' -count=1 -p 1 -timeout 35m ./...
	@if [ -z "$(SKIP_CRITEST)" ]; then $(MAKE) --no-print-directory critest-containerd; fi
	@if [ -z "$(SKIP_NODE)" ]; then $(MAKE) --no-print-directory test-node NODE_FLAVOURS='$(TEST_NODE_FLAVOURS)'; fi

# test-node runs the node tests (NODE_RUN of NODE_PKG: e2e's TestNode*) on a real node
# (root; hack/nodevm.sh): a Debian 12 qemu guest from Debian's packages with systemd as
# PID 1 and cgroup v2, of each flavour in NODE_FLAVOURS: apparmor (AppArmor on, booted
# fresh for each cgroup driver in NODE_DRIVERS) and selinux (SELinux enforcing with the
# reference policy and its container module, the systemd driver), the package from
# `make deb` installed in it with dpkg -i. The upgrade tests start
# from the package of NODE_OLD_REV (298699c: the first commit with `make deb`), built
# from a temporary git worktree and cached by commit; the image is cached in
# /var/cache/crisp/nodevm-<flavour>-<key>. NODE_TEST_TIMEOUT (25m) bounds each suite; the guests
# run at once (NODE_PARALLEL=0: one after the other); results and logs in NODE_DIR
# (hack/nodevm/test-node.sh says which).
NODE_DIR          ?= $(BINDIR)/node
NODE_OLD_REV      ?= 298699c86fbac485b3a51c949490fc6261979132
NODE_FLAVOURS     ?= apparmor selinux
NODE_DRIVERS      ?= systemd cgroupfs
NODE_TEST_TIMEOUT ?= 25m
NODE_PKG          ?= ./test/e2e
NODE_RUN          ?= ^TestNode
NODE_PARALLEL     ?= 1
NODE_DEPS         := qemu-system-x86 qemu-utils mmdebstrap
test-node:
	@if ! dpkg -s $(NODE_DEPS) >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(NODE_DEPS); \
	fi
	rm -rf $(NODE_DIR)/deb $(NODE_DIR)/node.test
	$(MAKE) --no-print-directory deb BINDIR=$(NODE_DIR)/bin DEBDIR=$(NODE_DIR)/deb
	CGO_ENABLED=1 $(GO) test -c -tags '$(TAGS) node' -o $(NODE_DIR)/node.test $(NODE_PKG)
	NODE_FLAVOURS='$(NODE_FLAVOURS)' NODE_DRIVERS='$(NODE_DRIVERS)' NODE_TEST_TIMEOUT='$(NODE_TEST_TIMEOUT)' \
		NODE_PKG='$(NODE_PKG)' NODE_RUN='$(NODE_RUN)' NODE_PARALLEL='$(NODE_PARALLEL)' \
		NODE_SELINUX_PERMISSIVE='$(NODE_SELINUX_PERMISSIVE)' \
		hack/nodevm/test-node.sh $(NODE_DIR) $(NODE_OLD_REV)

# chaos runs the fault-injection suite (test/e2e/chaos_test.go and test/e2e/leaks_test.go; root)
# bigger than `make test` runs it: CHAOS_SCALE=5 means 6 clients cycling pods while
# criserver is killed 25 times, 10 shims killed, 30 kills during CreateContainer and
# 30 during PullImage, leak accounting after each. CHAOSFLAGS passes more flags, e.g.
# CHAOSFLAGS='-chaos.kills=100 -chaos.kill-max=20s' (see `go test ./test/e2e -args -h`).
CHAOS_SCALE ?= 5
chaos: deps
	CGO_ENABLED=1 $(GO) test -tags '$(TAGS)' -count=1 -p 1 -run 'TestE2EChaos' -v -timeout 60m ./test/e2e/ \
		-args -chaos.scale=$(CHAOS_SCALE) $(CHAOSFLAGS)

# bench compares crisp with Debian's containerd 1.6 on this machine (root; ~9 min):
# both runtimes get their own dirs under /run/crisp-bench, the same images from a
# registry inside the benchmark, the same CNI plugins and the same CRI requests.
# BENCHFLAGS passes flags, e.g. BENCHFLAGS='-cycles 20 -churn 20s -only crisp';
# '-density 110' for node density, '-soak' for the soak, '-only nri' for NRI's cost
# alone, '-only pull -pull' for the full pull benchmark against containerd 1.6 and
# 2.4 (see test/bench/doc.go). pigz: the pull floor's gzip, and containerd's unpigz.
BENCH_DEPS := containerd runc pigz $(DEPS)
bench: build
	@if ! dpkg -s $(BENCH_DEPS) >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BENCH_DEPS); \
	fi
	CGO_ENABLED=1 $(GO) test -c -tags '$(TAGS) bench' -o $(BINDIR)/crisp-bench ./test/bench
	cd test/bench && $(CURDIR)/$(BINDIR)/crisp-bench -test.run '^TestBench$$' -test.v -test.timeout 90m \
		-bin $(CURDIR)/$(BINDIR) -results $(CURDIR)/test/bench/results $(BENCHFLAGS)

# print-version prints the version the binaries get (see VERSION above).
.PHONY: print-version
print-version:
	@echo '$(VERSION)'

# unit runs every package's tests but the end-to-end tests and the benchmark (test/e2e,
# test/bench): no root needed, the tests that need it skip with the reason (as root they
# run: real namespaces, mounts and shims). UNIT_PKGS narrows it.
UNIT_PKGS ?= $$($(GO) list ./... | grep -v -e '/test/e2e$$' -e '/test/bench$$')
unit:
	CGO_ENABLED=1 $(GO) test -tags '$(TAGS)' -count=1 -timeout 10m $(UNIT_PKGS)

# e2e runs the end-to-end tests (test/e2e; root, real containers, ~15 minutes);
# E2E_RUN (a -run regexp) narrows them.
E2E_RUN     ?= .
E2E_TIMEOUT ?= 30m
e2e: deps
	CGO_ENABLED=1 $(GO) test -tags '$(TAGS)' -count=1 -p 1 -timeout $(E2E_TIMEOUT) \
		-run '$(E2E_RUN)' ./test/e2e/

# lint checks formatting, runs vet with every build tag (bench gates test/bench's
# runs, node is the node VM's build), then golangci-lint with .golangci.yml: the import
# rules between the layers (depguard) and containerd's linters. golangci-lint's version
# is pinned in hack/golangci-lint.sh, which builds it once into GOLANGCI_LINT_CACHE.
# That variable is also golangci-lint's own name for its analysis cache, so the run
# does not see it.
GOLANGCI_LINT_VERSION  = $(shell sed -n 's/^VERSION=//p' hack/golangci-lint.sh)
GOLANGCI_LINT_CACHE   ?= /var/cache/crisp/golangci-lint-v$(GOLANGCI_LINT_VERSION)
lint:
	gofmt -l . | (! grep .)
	CGO_ENABLED=1 $(GO) vet -tags '$(TAGS) bench node' ./...
	GOLANGCI_LINT_CACHE='$(GOLANGCI_LINT_CACHE)' hack/golangci-lint.sh
	env -u GOLANGCI_LINT_CACHE CGO_ENABLED=1 $(GOLANGCI_LINT_CACHE)/bin/golangci-lint run ./...

clean:
	rm -rf $(BINDIR)
