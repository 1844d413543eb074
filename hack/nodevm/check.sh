#!/bin/bash
# check.sh: the node VM's smoke check, run inside the guest as run.sh (hack/nodevm.sh
# runs it on every new image before caching it, and on `hack/nodevm.sh check`). Fails
# unless the guest is what crisp's node tests need: systemd as PID 1 with the boot
# finished and no failed unit, cgroup v2 alone, the flavour's LSM (/etc/crisp-nodevm-flavour:
# apparmor: AppArmor on with profiles loaded; selinux: SELinux enforcing, the container
# module loaded, the files labelled, AppArmor off), 2 MiB hugepages reserved, loopback
# up, kubeadm's sysctls, the 9p share writable.
set -u
fail=0
check() { # check NAME COMMAND...: prints NAME ok/FAIL
	if "${@:2}"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi
}
# The runner starts after multi-user.target; a few units may still be finishing.
for _ in $(seq 120); do
	state=$(systemctl is-system-running 2>/dev/null)
	case $state in running|degraded) break ;; esac
	sleep 0.5
done

echo "kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print int($2/1024) " MiB"}' /proc/meminfo)"
echo "uptime at check: $(cut -d' ' -f1 /proc/uptime)s"
systemd-analyze 2>/dev/null | head -1
check "systemd is PID 1" test "$(cat /proc/1/comm)" = systemd
check "system running (is-system-running: $state)" test "$state" = running
[ "$state" = running ] || systemctl --failed --no-pager
check "cgroup v2 only at /sys/fs/cgroup" test "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs
echo "cgroup controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
for c in cpu memory pids io hugetlb cpuset; do
	check "cgroup controller $c" grep -qw "$c" /sys/fs/cgroup/cgroup.controllers
done
flavour=$(cat /etc/crisp-nodevm-flavour 2>/dev/null)
echo "flavour $flavour; LSMs: $(cat /sys/kernel/security/lsm 2>/dev/null)"
case $flavour in
apparmor)
	check "AppArmor enabled (aa-enabled)" aa-enabled -q
	n=$(wc -l < /sys/kernel/security/apparmor/profiles 2>/dev/null || echo 0)
	check "AppArmor profiles loaded ($n)" test "$n" -gt 0
	;;
selinux)
	sestatus 2>&1 | sed 's/^/  /'
	check "SELinux enforcing (getenforce)" test "$(getenforce 2>/dev/null)" = Enforcing
	check "the container module loaded" sh -c 'semodule -l | grep -qx container'
	check "container_t in the policy (seinfo)" sh -c 'seinfo -t container_t 2>/dev/null | grep -qw container_t'
	check "the root labelled (root_t)" sh -c 'stat -c %C / | grep -q :root_t:'
	check "/etc/passwd labelled (etc_t)" sh -c 'stat -c %C /etc/passwd | grep -q :etc_t:'
	check "the share labelled nfs_t" sh -c 'stat -c %C "$NODEVM_SHARE" | grep -q :nfs_t:'
	check "auditd running" systemctl -q is-active auditd.service
	check "AppArmor off" test ! -e /sys/kernel/security/apparmor/profiles
	;;
*) check "a known flavour ($flavour)" false ;;
esac
check "16 hugepages of 2 MiB" grep -q '^HugePages_Total: *16$' /proc/meminfo
check "loopback up" sh -c "ip -o addr show dev lo | grep -q 'inet 127.0.0.1/8'"
check "9p share writable" sh -c 'echo ok > "$NODEVM_OUT/check.w" && rm "$NODEVM_OUT/check.w"'
check "net.ipv4.ip_forward = 1" test "$(sysctl -n net.ipv4.ip_forward)" = 1
check "br_netfilter loaded" test -d /sys/module/br_netfilter
check "hostname crisp-node" test "$(hostname)" = crisp-node
check "busybox-static" sh -c '/bin/busybox --list | grep -qx sh && ! ldd /bin/busybox >/dev/null 2>&1'
check "busybox (dynamic)" sh -c 'ldd /usr/local/bin/busybox-dynamic | grep -q libc'
check "CNI plugins" test -x /usr/lib/cni/bridge
check "dbus" systemctl -q is-active dbus.service
exit $fail
