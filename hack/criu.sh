#!/usr/bin/env bash
# Installs CRIU >= 4 as /usr/local/sbin/criu when the criu on PATH cannot work here.
#
# Why: checkpoint/restore goes through CRIU, and Debian 12's criu 3.17.1 fails its own
# `criu check` on kernels >= 6.x that map [vvar_vclock] next to [vvar] ("vdso:
# Unexpected rt vDSO area bounds"). Debian 13's criu 4.1.1 handles them but needs glibc
# 2.38, so it is built here from Debian's own source tarball, against Debian 12's
# libraries (build dependencies installed with apt-get). Takes 2-4 minutes on 2 cores;
# does nothing when a working criu is already on PATH.
set -euo pipefail

VERSION=4.1.1
URL="http://deb.debian.org/debian/pool/main/c/criu/criu_${VERSION}.orig.tar.xz"
SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
PREFIX=${PREFIX:-/usr/local}

if command -v criu >/dev/null && criu check >/dev/null 2>&1; then
	exit 0
fi
export DEBIAN_FRONTEND=noninteractive
deps=(curl gcc make pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler
	protobuf-compiler python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev
	libgnutls28-dev libnftables-dev uuid-dev)
if ! dpkg -s "${deps[@]}" >/dev/null 2>&1; then
	apt-get update -qq
	apt-get install -y -qq "${deps[@]}" >/dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -fsSL -o "$work/criu.tar.xz" "$URL"
echo "$SHA256  $work/criu.tar.xz" | sha256sum -c --quiet
tar -C "$work" -xf "$work/criu.tar.xz"
make -C "$work/criu-$VERSION" -j"$(nproc)" criu >"$work/build.log" 2>&1 || {
	tail -50 "$work/build.log" >&2
	exit 1
}
install -D -m 0755 "$work/criu-$VERSION/criu/criu" "$PREFIX/sbin/criu"
"$PREFIX/sbin/criu" check
