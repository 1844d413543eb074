#!/usr/bin/env bash
# deb.sh BINDIR VERSION OUTDIR: build crisp_<version>_<arch>.deb from the binaries
# `make build` left in BINDIR, with dpkg-deb (no debhelper: the package is three
# binaries, a unit, a config, docs and man pages; packaging/deb holds its control
# files and copyright). The man pages are made from docs/man/*.md with go-md2man
# (Debian's package of that name). Prints the path.
set -euo pipefail
bindir=$1 version=$2 outdir=$3
cd "$(dirname "$0")/.."
src=packaging/deb
if ! command -v go-md2man >/dev/null; then
	echo "deb.sh: go-md2man not found (apt-get install go-md2man): it makes the man pages" >&2
	exit 1
fi

# The Makefile's VERSION is semver (0.1.0, 0.1.0-dev+<commit>[.dirty]). In a Debian
# version a '-' starts the Debian revision, and a pre-release must sort before its
# release: '~' does both right (0.1.0~dev+abc < 0.1.0). '+' and '.' are valid as is.
debversion=${version//-/\~}
if ! dpkg --validate-version "$debversion" 2>/dev/null; then
	echo "deb.sh: $version gives no valid Debian version ($debversion)" >&2
	exit 1
fi
arch=$(dpkg --print-architecture)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage"
install -D -m 0755 "$bindir/criserver" "$stage/usr/bin/criserver"
install -D -m 0755 "$bindir/shim-runc" "$stage/usr/bin/shim-runc"
# containerd 2.x finds runtime_type io.containerd.crisp.v1 under this name on its PATH.
ln -s shim-runc "$stage/usr/bin/containerd-shim-crisp-v1"
# The WebAssembly sandboxer: the config's runtime handler "wasm".
install -D -m 0755 "$bindir/shim-wasm" "$stage/usr/bin/shim-wasm"
# Debian 12 packages ship units in /lib/systemd/system (merged /usr or not).
install -D -m 0644 contrib/systemd/crisp.service "$stage/lib/systemd/system/crisp.service"
install -D -m 0644 "$src/config.toml" "$stage/etc/crisp/config.toml"
# SELinux: crisp's file contexts (postinst installs them where SELinux is on) and the
# state directory systemd-tmpfiles creates, labelled, at boot.
install -D -m 0644 "$src/crisp.cil" "$stage/usr/share/crisp/selinux/crisp.cil"
install -D -m 0644 "$src/tmpfiles.conf" "$stage/usr/lib/tmpfiles.d/crisp.conf"
install -D -m 0644 "$src/crictl.yaml" "$stage/usr/share/doc/crisp/examples/crictl.yaml"
install -D -m 0644 README.md "$stage/usr/share/doc/crisp/README.md"
# Debian policy 12.5: the licence in machine-readable form, next to the docs.
install -D -m 0644 "$src/copyright" "$stage/usr/share/doc/crisp/copyright"
# Man pages, compressed as policy 12.1 asks: gzip -9n (no name or time stamp, so the
# same source gives the same bytes).
for page in criserver.8 shim-runc.8 shim-wasm.8 crisp-config.toml.5; do
	dir="$stage/usr/share/man/man${page##*.}"
	install -d -m 0755 "$dir"
	go-md2man -in "docs/man/$page.md" -out "$dir/$page"
	gzip -9n "$dir/$page"
	chmod 0644 "$dir/$page.gz"
done
# The shim's other name has the shim's page, as its binary is a link to the shim.
ln -s shim-runc.8.gz "$stage/usr/share/man/man8/containerd-shim-crisp-v1.8.gz"

install -d -m 0755 "$stage/DEBIAN"
sed -e "s/@VERSION@/$debversion/" -e "s/@ARCH@/$arch/" "$src/control.in" > "$stage/DEBIAN/control"
echo "Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)" >> "$stage/DEBIAN/control"
install -m 0644 "$src/conffiles" "$stage/DEBIAN/conffiles"
install -m 0755 "$src/postinst" "$src/prerm" "$src/postrm" "$stage/DEBIAN/"

mkdir -p "$outdir"
out="$outdir/crisp_${debversion}_${arch}.deb"
# --root-owner-group: files owned by root whoever builds (no fakeroot needed).
dpkg-deb --root-owner-group -Zxz --build "$stage" "$out" >/dev/null
echo "$out"
