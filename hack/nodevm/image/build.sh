#!/usr/bin/env bash
# build.sh OUTDIR: build the node VM's image into OUTDIR (hack/nodevm.sh image calls it
# on a temp dir and renames that into the cache). Only Debian 12's packages: mmdebstrap
# installs the list in ./packages into OUTDIR/tree, ./customize.sh shapes it, and
# mkfs.ext4 -d copies the tree into a raw ext4 image (no loop mount needed). Leaves in
# OUTDIR: rootfs.img, vmlinuz, initrd.img (the guest's kernel and initrd, booted
# directly), manifest (every installed package and version) and packages (the list).
# NODEVM_MIRROR (http://deb.debian.org) picks the mirror.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$1
mirror=${NODEVM_MIRROR:-http://deb.debian.org}
# The root file system: the tree plus room for what tests unpack (images, containers).
size=8G

mkdir -p "$out"
tree=$out/tree
pkgs=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/packages" | tr -s ' \n' ',,' | sed 's/,$//')
mmdebstrap --variant=minbase --include="$pkgs" \
	--aptopt='Acquire::Languages "none"' \
	--customize-hook="$here/customize.sh \"\$1\"" \
	bookworm "$tree" \
	"deb $mirror/debian bookworm main" \
	"deb $mirror/debian bookworm-updates main" \
	"deb $mirror/debian-security bookworm-security main"

# Identity and name resolution (mmdebstrap puts the host's files there while it runs):
# no network but loopback (qemu runs with -nic none), and a resolver that refuses at
# once rather than one that times out.
echo crisp-node > "$tree/etc/hostname"
cat > "$tree/etc/hosts" <<'HOSTS'
127.0.0.1	localhost
127.0.1.1	crisp-node
::1	localhost ip6-localhost ip6-loopback
HOSTS
rm -f "$tree/etc/resolv.conf"
echo 'nameserver 127.0.0.1' > "$tree/etc/resolv.conf"

vmlinuz=$(ls "$tree"/boot/vmlinuz-* | sort -V | tail -1)
kver=${vmlinuz##*/vmlinuz-}
install -m 0644 "$vmlinuz" "$out/vmlinuz"
install -m 0644 "$tree/boot/initrd.img-$kver" "$out/initrd.img"
echo "$kver" > "$out/kernel-version"
chroot "$tree" dpkg-query -W -f '${Package} ${Version}\n' > "$out/manifest"
cp "$here/packages" "$out/packages"

truncate -s "$size" "$out/rootfs.img"
mkfs.ext4 -q -F -L crisp-node -d "$tree" "$out/rootfs.img"
rm -rf --one-file-system "$tree"
