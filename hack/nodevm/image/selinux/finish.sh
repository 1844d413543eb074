#!/bin/sh
# selinux/finish.sh TREE: labels the complete tree (build.sh runs it last, with nothing
# mounted in it) from the policy's file contexts, the container module's included:
# setfiles sets the security.selinux attributes even on a build host without SELinux,
# and mkfs.ext4 -d copies them into the image, so the guest needs no relabelling boot.
set -eu
tree=$1
# setfiles works on the files through /proc/self/fd: the tree's /proc is mounted for
# it (and kept out of the walk: -e).
mount -t proc proc "$tree/proc"
trap 'umount "$tree/proc"' EXIT
chroot "$tree" setfiles -F -e /proc /etc/selinux/default/contexts/files/file_contexts /
# setfiles reports no file it could not label: check one label made it.
label=$(python3 -c 'import os, sys; print(os.getxattr(sys.argv[1], "security.selinux").decode().rstrip("\0"))' \
	"$tree/etc/selinux/config")
case $label in
*:selinux_config_t:*) ;;
*) echo "finish.sh: /etc/selinux/config is labelled '$label', not selinux_config_t" >&2; exit 1 ;;
esac
