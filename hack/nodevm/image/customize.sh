#!/bin/sh
# customize.sh ROOT: mmdebstrap's customize hook for the node VM (hack/nodevm.sh image).
# Runs on the host after the packages are installed, with ROOT's /proc, /sys and /dev
# mounted; commands that must see the guest's files run with chroot. Everything this
# hook writes is part of the image's cache key (every file in hack/nodevm/image/).
set -eu
root=$1
here=$(dirname "$0")

# Identity. A fixed machine-id: every boot starts from the same clean image, and an
# empty one would make each boot systemd's "first boot" (ConditionFirstBoot units).
# /etc/hostname, /etc/hosts and /etc/resolv.conf are written by build.sh: mmdebstrap
# replaces them with the host's while it runs.
chroot "$root" systemd-machine-id-setup >/dev/null
cat > "$root/etc/fstab" <<'FSTAB'
# The root is the virtio disk qemu boots with (an overlay on the cached image).
/dev/vda	/	ext4	rw,errors=remount-ro	0	1
FSTAB

# root logs in without a password; the serial console logs it in by itself
# (hack/nodevm.sh shell).
chroot "$root" passwd -d root >/dev/null
mkdir -p "$root/etc/systemd/system/serial-getty@ttyS0.service.d"
cat > "$root/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf" <<'UNIT'
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --keep-baud 115200,57600,38400,9600 %I $TERM
UNIT

# The initrd needs only the root disk: virtio over PCI, ext4. A short list keeps it
# small (the guest unpacks it under TCG); 9p is loaded from the root by the runner.
sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
printf '%s\n' virtio_pci virtio_blk ext4 crc32c_generic >> "$root/etc/initramfs-tools/modules"
chroot "$root" update-initramfs -u -k all >/dev/null 2>&1

# What kubeadm's install docs have every node do ("Install and configure
# prerequisites"): overlay and br_netfilter loaded at boot, bridged traffic through
# iptables, IPv4 forwarding on (Debian's default is off; criserver check requires it).
printf '%s\n' overlay br_netfilter > "$root/etc/modules-load.d/k8s.conf"
cat > "$root/etc/sysctl.d/k8s.conf" <<'SYSCTL'
net.bridge.bridge-nf-call-iptables  = 1
net.bridge.bridge-nf-call-ip6tables = 1
net.ipv4.ip_forward                 = 1
SYSCTL

# Timers that would start background work in the middle of a test run (apt cannot
# reach a mirror anyway): masked. A real node runs them.
for t in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer \
	fstrim.timer; do
	ln -sf /dev/null "$root/etc/systemd/system/$t"
done

# The runner: with a 9p share tagged "host" holding run.sh, runs it and powers off.
install -m 0755 "$here/crisp-nodevm-runner" "$root/usr/local/sbin/crisp-nodevm-runner"
install -m 0644 "$here/crisp-nodevm-run.service" "$root/etc/systemd/system/crisp-nodevm-run.service"
chroot "$root" systemctl enable crisp-nodevm-run.service >/dev/null 2>&1

# busybox (dynamic) conflicts with busybox-static: its binary only, beside it.
chroot "$root" sh -c 'cd /tmp && apt-get download -q busybox >/dev/null && dpkg-deb -x busybox_*.deb /tmp/bb && install -m 0755 /tmp/bb/bin/busybox /usr/local/bin/busybox-dynamic && rm -rf /tmp/bb busybox_*.deb'
