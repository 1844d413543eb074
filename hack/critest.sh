#!/usr/bin/env bash
# Builds critest, the CRI validation suite of cri-tools, for test/e2e/containerd_critest_test.go,
# which runs it through containerd 2.4.2's CRI socket once per runtime handler (runc,
# crisp-pod, crisp-shim) and compares the results.
#
# critest is a ginkgo test binary (cri-tools' Makefile builds it with
# `go test -c ./cmd/critest`), so `go install pkg@version` cannot build it: the module's
# source comes from the Go module proxy (`go mod download`), is copied out of the
# read-only module cache and built there with its own go.mod and go.sum, as cri-tools'
# release does, without cgo. The binary is cached in $CRITEST_CACHE (default
# /var/cache/crisp/critest-v$VERSION); the script does nothing when the cached binary
# reports the right version. The first build takes ~2 minutes on 2 cores with an empty
# Go build cache (plus the module downloads).
set -euo pipefail

VERSION=1.36.0
CACHE=${CRITEST_CACHE:-/var/cache/crisp/critest-v$VERSION}
BIN=$CACHE/bin
MOD=sigs.k8s.io/cri-tools

export PATH="$PATH:/usr/local/go/bin"
# The output is read whole before grep: with pipefail, `cmd | grep -q` fails when grep
# exits before cmd wrote its last line.
have() {
	local out
	[ -x "$BIN/critest" ] && out=$("$BIN/critest" --version 2>/dev/null) &&
		grep -q "^critest version: $VERSION$" <<<"$out"
}
if have; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ] && ! mkdir -p "$BIN" 2>/dev/null; then
	echo "hack/critest.sh: cannot write $BIN (not root): critest $VERSION not built" >&2
	exit 0
fi

mkdir -p "$BIN"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
src=$(GOFLAGS=-mod=mod go mod download -json "$MOD@v$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$src" ] || [ ! -f "$src/go.mod" ]; then
	echo "hack/critest.sh: go mod download $MOD@v$VERSION gave no source dir" >&2
	exit 1
fi
cp -r "$src" "$work/src"
chmod -R u+w "$work/src"
cd "$work/src"
CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local \
	go test -c -mod=mod -trimpath -ldflags "-s -w -X $MOD/pkg/version.Version=$VERSION" \
	-o "$work/critest" ./cmd/critest >"$work/build.log" 2>&1 || {
	tail -50 "$work/build.log" >&2
	exit 1
}
install -m 0755 "$work/critest" "$BIN/critest"
have || {
	echo "hack/critest.sh: built critest does not report $VERSION:" >&2
	"$BIN/critest" --version >&2 || true
	exit 1
}
