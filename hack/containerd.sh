#!/usr/bin/env bash
# Builds containerd 2.4.2, its runc shim and runc 1.5.2 for test/e2e/containerd_test.go,
# which runs crisp's shim under containerd 2.x (sandboxer "shim" and "podsandbox") and
# compares it with containerd's own runc shim, and for test/e2e/taskshim_test.go, which runs
# pods on containerd-shim-runc-v2 as a task-only runtime handler of crisp.
#
# Why built: Debian 12 packages containerd 1.6, which has no sandbox API. The binaries
# come from containerd's Go module through the module proxy (`go install`, no cgo, so
# neither libbtrfs nor libdevmapper headers are needed: the btrfs, devmapper and zfs
# snapshotters are left out, overlayfs is what the test uses) and are cached in
# $CONTAINERD_CACHE (default /var/cache/crisp/containerd-v2.4.2); the script does
# nothing when the cached binaries report the right version. The runc shim also needs a
# runc binary: Debian's `runc` package. The first build takes ~1.5 minutes on 2 cores (with
# an empty Go build cache; plus the module downloads). runc is built with cgo and the
# seccomp tag (Debian's libseccomp-dev), as its release binaries are; Debian's runc
# 1.1.5 stays the binary containerd's own tests use.
set -euo pipefail

VERSION=2.4.2
RUNC_VERSION=1.5.2
CACHE=${CONTAINERD_CACHE:-/var/cache/crisp/containerd-v$VERSION}
BIN=$CACHE/bin
PKG=github.com/containerd/containerd/v2

export PATH="$PATH:/usr/local/go/bin"
if [ "$(id -u)" -ne 0 ]; then
	# The test needs root and skips without it; so does installing runc and the cache.
	echo "hack/containerd.sh: not root, containerd $VERSION not built (test/e2e/containerd_test.go will skip)" >&2
	exit 0
fi
if ! command -v runc >/dev/null; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc >/dev/null
fi

# The outputs are read whole before grep: with pipefail, `cmd | grep -q` fails whenever
# grep exits at the first match before cmd wrote its last line (runc --version writes
# four), and the cache would be rebuilt and overwritten under running tests.
have() {
	local out
	[ -x "$BIN/containerd" ] && [ -x "$BIN/containerd-shim-runc-v2" ] && [ -x "$BIN/runc" ] || return 1
	out=$("$BIN/containerd" --version 2>/dev/null) && grep -q " v$VERSION " <<<"$out" || return 1
	out=$("$BIN/containerd-shim-runc-v2" -v 2>/dev/null) && grep -q "v$VERSION" <<<"$out" || return 1
	out=$("$BIN/runc" --version 2>/dev/null) && grep -q "^runc version $RUNC_VERSION$" <<<"$out"
}
if have; then
	exit 0
fi

mkdir -p "$BIN"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Outside any module, so that `go install pkg@version` builds containerd's own go.mod.
cd "$work"
ldflags="-s -w -X $PKG/version.Version=v$VERSION -X $PKG/version.Package=$PKG"
GOBIN="$work/bin" CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local \
	go install -trimpath -tags 'no_btrfs no_devmapper no_zfs urfave_cli_no_docs' -ldflags "$ldflags" \
	"$PKG/cmd/containerd@v$VERSION" "$PKG/cmd/containerd-shim-runc-v2@v$VERSION" >"$work/build.log" 2>&1 || {
	tail -50 "$work/build.log" >&2
	exit 1
}
GOBIN="$work/bin" CGO_ENABLED=1 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local \
	go install -trimpath -tags seccomp -ldflags "-s -w -X main.version=$RUNC_VERSION" \
	"github.com/opencontainers/runc@v$RUNC_VERSION" >"$work/build-runc.log" 2>&1 || {
	tail -50 "$work/build-runc.log" >&2
	exit 1
}
install -m 0755 "$work/bin/containerd" "$work/bin/containerd-shim-runc-v2" "$work/bin/runc" "$BIN/"
have || {
	echo "hack/containerd.sh: built binaries do not report v$VERSION:" >&2
	"$BIN/containerd" --version >&2 || true
	exit 1
}
