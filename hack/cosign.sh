#!/usr/bin/env bash
# Builds the cosign CLI v2.6.5 for internal/image/remote/cosign_test.go, which signs
# images with cosign itself (its tag storage and its OCI 1.1 referrers mode) and pulls
# them under a sigstoreSigned signature policy: proof that crisp verifies what cosign
# writes. From the Go module proxy (`go install`, no cgo), cached in $COSIGN_CACHE
# (default /var/cache/crisp/cosign-v2.6.5); the script does nothing when the cached
# binary reports the right version. The first build takes ~12 minutes on 2 cores with an
# empty module cache (cosign pulls in the cloud KMS clients), ~4 with one.
# v2.6.5: the newest 2.x; cosign 3 writes sigstore bundles by default, which crisp does
# not read (docs/registries.md).
set -euo pipefail

VERSION=2.6.5
CACHE=${COSIGN_CACHE:-/var/cache/crisp/cosign-v$VERSION}
BIN=$CACHE/bin
export PATH="$PATH:/usr/local/go/bin"

have() {
	local out
	[ -x "$BIN/cosign" ] || return 1
	out=$("$BIN/cosign" version 2>/dev/null) && grep -q "v$VERSION" <<<"$out"
}
if have; then
	exit 0
fi
mkdir -p "$BIN"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
GOBIN="$work/bin" CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local \
	go install -trimpath -ldflags "-s -w -X sigs.k8s.io/release-utils/version.gitVersion=v$VERSION" \
	"github.com/sigstore/cosign/v2/cmd/cosign@v$VERSION" >"$work/build.log" 2>&1 || {
	tail -50 "$work/build.log" >&2
	exit 1
}
install -m 0755 "$work/bin/cosign" "$BIN/"
have || {
	echo "hack/cosign.sh: the built cosign does not report v$VERSION:" >&2
	"$BIN/cosign" version >&2 || true
	exit 1
}
