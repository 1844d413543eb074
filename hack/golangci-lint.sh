#!/usr/bin/env bash
# Builds golangci-lint for `make lint`, which checks the packages' import rules
# (depguard in .golangci.yml) and runs the linters containerd and CRI-O use.
#
# The version is pinned so that a lint result does not change under a clean tree: a newer
# golangci-lint brings new checks and new findings. It comes from golangci-lint's Go
# module through the module proxy (`go install pkg@version` outside any module, so its
# own go.mod and go.sum decide the dependencies) and is cached in $GOLANGCI_LINT_CACHE
# (default /var/cache/crisp/golangci-lint-v$VERSION); the script does nothing when the
# cached binary reports the right version. The first build takes ~2 minutes on 2 cores
# with an empty Go build cache (plus the module downloads). GOLANGCI_LINT_CACHE is also
# golangci-lint's own variable for its analysis cache: make lint unsets it for the run.
set -euo pipefail

VERSION=2.15.0
CACHE=${GOLANGCI_LINT_CACHE:-/var/cache/crisp/golangci-lint-v$VERSION}
BIN=$CACHE/bin
PKG=github.com/golangci/golangci-lint/v2/cmd/golangci-lint

export PATH="$PATH:/usr/local/go/bin"
# The output is read whole before grep: with pipefail, `cmd | grep -q` fails when grep
# exits before cmd wrote its last line.
have() {
	local out
	[ -x "$BIN/golangci-lint" ] && out=$("$BIN/golangci-lint" version 2>/dev/null) &&
		grep -q "version $VERSION " <<<"$out"
}
if have; then
	exit 0
fi
if ! mkdir -p "$BIN" 2>/dev/null; then
	echo "hack/golangci-lint.sh: cannot write $BIN: golangci-lint $VERSION not built (set GOLANGCI_LINT_CACHE)" >&2
	exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Outside any module, so that `go install pkg@version` builds golangci-lint's own go.mod.
cd "$work"
# The version is stamped as golangci-lint's release does (goreleaser's main.version),
# so that `golangci-lint version` reports it and have() finds it.
GOBIN="$BIN" CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local \
	go install -trimpath -ldflags "-s -w -X main.version=$VERSION" \
	"$PKG@v$VERSION" >"$work/build.log" 2>&1 || {
	tail -50 "$work/build.log" >&2
	exit 1
}
have || {
	echo "hack/golangci-lint.sh: built golangci-lint does not report $VERSION:" >&2
	"$BIN/golangci-lint" version >&2 || true
	exit 1
}
