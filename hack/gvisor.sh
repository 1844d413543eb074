#!/usr/bin/env bash
# Builds gVisor's runsc and its containerd shim (containerd-shim-runsc-v1) for running
# pods on gVisor as a task-only runtime handler of crisp (sandbox_mode = "task"; see
# docs/gvisor.md for the handler's config and what was found running it).
#
# Source: gVisor's Go module, gvisor.dev/gvisor at a pinned pseudo-version of its `go`
# branch (the module has no tags; `go list -m gvisor.dev/gvisor@latest` names the
# newest), fetched through the module proxy. Both binaries are pure Go
# (CGO_ENABLED=0) and go to $GVISOR_CACHE (default /var/cache/crisp/gvisor-<version>)/bin;
# the script does nothing when they are there, built from this version with this
# patch, and prints the bin dir either way. A cold build (empty module and build
# caches) took 2 minutes on 2 cores, 1.5 minutes with the modules downloaded; the
# first `go install` of both on this VM, module downloads included, 3.5 minutes.
#
# One patch, applied to a writable copy of the module (the module cache is read-only)
# before building from it as the main module (its own go.mod and go.sum, as
# `go install gvisor.dev/gvisor/...@version` would build):
#
#   pkg/shim/v1/manager.go, manager.Start: after starting the shim daemon, gVisor's
#   `containerd-shim-runsc-v1 start` writes -999 to the daemon's
#   /proc/PID/oom_score_adj and fails the start on any error. Linux refuses a value
#   below the target's oom_score_adj_min (inherited from its parent, 0 unless a
#   holder of CAP_SYS_RESOURCE lowered it) with EACCES unless the writer has
#   CAP_SYS_RESOURCE. Machines whose root lacks that capability (this VM: its
#   bounding set has no CAP_SYS_RESOURCE) can never start the shim, under crisp or
#   containerd alike. The patch keeps -999 where the kernel allows it and, when the
#   write is refused for permission, falls back to what containerd's runc shim does
#   unconditionally: shim.AdjustOOMScore, the parent's (the runtime's) score + 1.
#   Nothing else changes. See docs/gvisor.md for the strace and the kernel's rule.
set -euo pipefail

VERSION=v0.0.0-20260905035102-160fafc42237
MOD=gvisor.dev/gvisor
CACHE=${GVISOR_CACHE:-/var/cache/crisp/gvisor-$VERSION}
BIN=$CACHE/bin

# The patch (see above), as `patch -p1` applies it in the module's root.
PATCH=$(
	cat <<'EOF'
--- a/pkg/shim/v1/manager.go
+++ b/pkg/shim/v1/manager.go
@@ -192,7 +192,14 @@
 		return shim.BootstrapParams{}, err
 	}
 	if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil {
-		return shim.BootstrapParams{}, fmt.Errorf("failed to set OOM Score on shim: %w", err)
+		// crisp hack/gvisor.sh: without CAP_SYS_RESOURCE Linux refuses a score below
+		// the daemon's oom_score_adj_min (EACCES); do as containerd's runc shim does.
+		if !os.IsPermission(err) {
+			return shim.BootstrapParams{}, fmt.Errorf("failed to set OOM Score on shim: %w", err)
+		}
+		if err := shim.AdjustOOMScore(cmd.Process.Pid); err != nil {
+			return shim.BootstrapParams{}, fmt.Errorf("failed to set OOM Score on shim: %w", err)
+		}
 	}
 	cu.Release()
 	return shim.BootstrapParams{Version: 2, Address: address, Protocol: "ttrpc"}, nil
EOF
)
# What the cached binaries must have been built from.
STAMP="$MOD@$VERSION patch sha256:$(printf '%s\n' "$PATCH" | sha256sum | cut -d' ' -f1)"

export PATH="$PATH:/usr/local/go/bin"
if [ "$(id -u)" -ne 0 ]; then
	# runsc and its shim need root; so does the cache.
	echo "hack/gvisor.sh: not root, gVisor $VERSION not built" >&2
	exit 0
fi

# (Outputs are read whole first: grep -q quitting early would fail the pipe.)
have() {
	[ -x "$BIN/runsc" ] && [ -x "$BIN/containerd-shim-runsc-v1" ] &&
		[ "$(cat "$BIN/STAMP" 2>/dev/null)" = "$STAMP" ] &&
		grep -q "^runsc version $VERSION$" <<<"$("$BIN/runsc" --version 2>/dev/null)" &&
		grep -q "Version: *$VERSION$" <<<"$("$BIN/containerd-shim-runsc-v1" -v 2>/dev/null)"
}
if have; then
	echo "$BIN"
	exit 0
fi

mkdir -p "$BIN"
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
# Outside any module, so that the download names the module by its version alone.
cd "$work"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
dir=$(go mod download -json "$MOD@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ ! -f "$dir/go.mod" ]; then
	echo "hack/gvisor.sh: go mod download $MOD@$VERSION gave no module dir" >&2
	exit 1
fi
cp -r "$dir" "$work/src"
chmod -R u+w "$work/src"
printf '%s\n' "$PATCH" | patch -s --fuzz=0 -p1 -d "$work/src" || {
	echo "hack/gvisor.sh: the OOM score patch does not apply to $MOD@$VERSION" >&2
	exit 1
}
cd "$work/src"
go build -trimpath -ldflags "-s -w -X $MOD/runsc/version.version=$VERSION" \
	-o "$work/bin/runsc" ./runsc >"$work/build.log" 2>&1 &&
	go build -trimpath -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$VERSION" \
		-o "$work/bin/containerd-shim-runsc-v1" ./shim >>"$work/build.log" 2>&1 || {
	tail -50 "$work/build.log" >&2
	exit 1
}
install -m 0755 "$work/bin/runsc" "$work/bin/containerd-shim-runsc-v1" "$BIN/"
printf '%s\n' "$STAMP" >"$BIN/STAMP"
have || {
	echo "hack/gvisor.sh: built binaries do not report $VERSION:" >&2
	"$BIN/runsc" --version >&2 || true
	"$BIN/containerd-shim-runsc-v1" -v >&2 || true
	exit 1
}
echo "$BIN"
