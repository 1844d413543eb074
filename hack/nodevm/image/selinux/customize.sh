#!/bin/sh
# selinux/customize.sh ROOT: the SELinux flavour's part of the image (build.sh runs it
# after ../customize.sh, with ROOT's /proc, /sys and /dev mounted). The reference
# policy's container module, which Debian ships only as source, is built with
# selinux-policy-dev's Makefile and put in the policy store with semodule -n (no load:
# the build host need not run SELinux); the guest's kernel then loads the policy with
# it at boot. The files are labelled later, when the tree is complete (finish.sh).
set -eu
root=$1

cat > "$root/etc/selinux/config" <<'CONFIG'
# The node VM boots enforcing (the kernel command line also says enforcing=1).
SELINUX=enforcing
SELINUXTYPE=default
CONFIG

chroot "$root" sh -eu <<'BUILD'
d=$(mktemp -d)
cd "$d"
m=selinux-policy-src/policy/modules/services
# The .te and .fc: the interface (.if) is in selinux-policy-dev's headers already.
tar -xf /usr/src/selinux-policy-src.tar.zst "$m/container.te" "$m/container.fc"
cp "$m"/container.te "$m"/container.fc .
make -s -f /usr/share/selinux/devel/Makefile container.pp
semodule -n -i container.pp
cd /
rm -rf "$d"
semodule -n -l | grep -qx container
BUILD
