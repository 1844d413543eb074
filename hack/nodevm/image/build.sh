#!/usr/bin/env bash
# build.sh OUTDIR FLAVOUR: build the node VM's image of FLAVOUR (apparmor, selinux: a
# directory beside this script) into OUTDIR (hack/nodevm.sh image calls it on a temp
# dir and renames that into the cache). Only Debian 12's packages: mmdebstrap installs
# the lists ./packages and FLAVOUR/packages into OUTDIR/tree, ./customize.sh and then
# FLAVOUR/customize.sh (if any) shape it, FLAVOUR/finish.sh (if any) gets the finished
# tree, and mkfs.ext4 -d copies the tree, extended attributes included, into a raw ext4
# image (no loop mount needed). Leaves in OUTDIR: rootfs.img, vmlinuz, initrd.img (the
# guest's kernel and initrd, booted directly), cmdline (the flavour's kernel arguments),
# manifest (every installed package and version) and packages (the lists).
# NODEVM_MIRROR (http://deb.debian.org) picks the mirror.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$1
flavour=${2:?usage: build.sh OUTDIR FLAVOUR}
[ -f "$here/$flavour/packages" ] || { echo "build.sh: no flavour $flavour ($here/$flavour/packages)" >&2; exit 2; }
mirror=${NODEVM_MIRROR:-http://deb.debian.org}
# The root file system: the tree plus room for what tests unpack (images, containers).
size=8G

mkdir -p "$out"
tree=$out/tree
pkgs=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/packages" "$here/$flavour/packages" |
	tr -s ' \n' ',,' | sed 's/,$//')
hooks=(--customize-hook="$here/customize.sh \"\$1\"")
if [ -x "$here/$flavour/customize.sh" ]; then
	hooks+=(--customize-hook="$here/$flavour/customize.sh \"\$1\"")
fi
mmdebstrap --variant=minbase --include="$pkgs" \
	--aptopt='Acquire::Languages "none"' \
	"${hooks[@]}" \
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
# The guest's scripts (nodevm/check.sh, the node tests' harness) read which it is.
echo "$flavour" > "$tree/etc/crisp-nodevm-flavour"

vmlinuz=$(ls "$tree"/boot/vmlinuz-* | sort -V | tail -1)
kver=${vmlinuz##*/vmlinuz-}
install -m 0644 "$vmlinuz" "$out/vmlinuz"
install -m 0644 "$tree/boot/initrd.img-$kver" "$out/initrd.img"
echo "$kver" > "$out/kernel-version"
chroot "$tree" dpkg-query -W -f '${Package} ${Version}\n' > "$out/manifest"
cat "$here/packages" "$here/$flavour/packages" > "$out/packages"
sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/$flavour/cmdline" | tr -s ' \n' '  ' |
	sed 's/ $//' > "$out/cmdline"
if [ -x "$here/$flavour/finish.sh" ]; then "$here/$flavour/finish.sh" "$tree"; fi

truncate -s "$size" "$out/rootfs.img"
mkfs.ext4 -q -F -L crisp-node -d "$tree" "$out/rootfs.img"
rm -rf --one-file-system "$tree"
