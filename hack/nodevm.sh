#!/usr/bin/env bash
# nodevm.sh: a real Kubernetes node to test crisp on, as a qemu guest: Debian 12 from
# Debian's packages only, systemd 252 as PID 1, cgroup v2 alone, 16 2 MiB hugepages,
# loopback only (no network device), and the LSM of its flavour (NODEVM_FLAVOUR):
#   apparmor (the default)  AppArmor on, as Debian boots
#   selinux                 SELinux enforcing with the reference policy
#                           (selinux-policy-default) and its container module, AppArmor
#                           off; the files labelled at build (nodevm/image/selinux/)
# `make test-node` uses it.
#
#   hack/nodevm.sh image      build the image unless cached; prints its cache dir
#   hack/nodevm.sh run DIR    boot a fresh guest, run DIR/run.sh in it, exit with its code
#   hack/nodevm.sh shell [DIR]  boot a fresh guest with its serial console on stdio
#   hack/nodevm.sh check      boot a fresh guest and run the smoke check (nodevm/check.sh)
#   hack/nodevm.sh prune      remove cached images other than the current one (a new
#                             image's build does it too), but those a guest runs on
#
# The image. nodevm/image/build.sh installs nodevm/image/packages and the flavour's
# nodevm/image/<flavour>/packages with mmdebstrap into a directory, shapes it with
# nodevm/image/customize.sh (root autologin on ttyS0, host name crisp-node, the runner
# unit) and the flavour's own scripts, and makes a raw ext4 image of it with mkfs.ext4
# -d. Each flavour's image is cached in $NODEVM_CACHE/nodevm-<flavour>-<key>/
# (/var/cache/crisp): rootfs.img, vmlinuz, initrd.img (booted directly, no
# bootloader), cmdline (the flavour's kernel arguments), manifest (package versions).
# The key hashes the files of nodevm/image/ and nodevm/image/<flavour>/, so a changed
# package list or customization builds a new image; a cached one is reused as is (the
# mirror moving on does not
# rebuild it: remove its directory for that). A build goes to a temp dir, must pass the
# smoke check in a guest, and only then is renamed into place: an interrupted or broken
# build is never taken for a cached one. Builds take $NODEVM_CACHE/nodevm.lock, so one
# runs at a time. Here: ~60-700 s cold (the mirror's speed), then ~20 s of smoke check.
#
# How the guest differs from a Debian 12 node installed the usual way: no network device
# (loopback only; /etc/resolv.conf points at 127.0.0.1), no bootloader (qemu loads the
# kernel), a fixed machine-id, root without a password, minbase plus the list (no
# Recommends, no "standard" task), the apt/dpkg/e2scrub/fstrim timers masked, kubeadm's
# modules-load.d and sysctl.d files (ip_forward = 1), busybox-static installed and the
# dynamic busybox only as /usr/local/bin/busybox-dynamic (the two packages conflict).
#
# The guest. Every boot gets a fresh qcow2 overlay on the cached image (removed after),
# so it starts from the clean image. 2 vCPUs (NODEVM_CPUS), 3 GiB (NODEVM_MEM, MiB),
# kernel command line `root=/dev/vda rw console=ttyS0,115200 hugepages=16 panic=10` and
# the flavour's (selinux: `security=selinux selinux=1 enforcing=1 apparmor=0`).
# The serial console is copied to DIR/out/serial.log.
#
# The command channel is a 9p share (qemu -virtfs, virtio-9p): the host's DIR is the
# guest's /mnt/host, read-write, files created as root. crisp-nodevm-run.service
# (After=multi-user.target) mounts it (under SELinux with context=...:nfs_t:s0: 9p
# carries no labels) and, when it holds run.sh, runs
# `bash ./run.sh` as root in /mnt/host with stdin /dev/null and env
# NODEVM_SHARE=/mnt/host NODEVM_OUT=/mnt/host/out; stdout and stderr go to out/run.log
# (readable on the host while it runs), the exit code to out/rc, then the guest powers
# off. The runner writes out/started (the guest's uptime) first: the host takes it as
# "booted". `run` clears DIR/out before the boot and writes out/nodevm.times
# (accel, boot_s: qemu start to the runner, total_s).
#
# `run` exits with run.sh's exit code, or 125 with a message and the tail of the serial
# log when the guest did not reach the runner in NODEVM_BOOT_TIMEOUT (300 s), ran past
# NODEVM_TIMEOUT (20m; counted from qemu's start; both take s, m or h suffixes) or went
# down without out/rc. qemu is killed by its PID on a timeout and on an interrupt.
#
# The accelerator. /dev/kvm exists on nested hosts whose KVM guests do not boot (here
# qemu aborts with -cpu host on MSR 0x10a, and hangs without a line on the console with
# other CPU models). Unless NODEVM_ACCEL=kvm|tcg says which, the first boot tries KVM (-cpu
# host) and gives it NODEVM_KVM_PROBE_TIMEOUT (40 s) to reach the runner; the result is
# remembered in $NODEVM_CACHE/nodevm-accel (with the host's kernel release: a new
# kernel probes again), and a failed probe boots again under TCG (-accel
# tcg,thread=multi -cpu max): ~15 s to the runner here, code in the guest 12-15x slower
# than on the host.
set -euo pipefail
hack=$(cd "$(dirname "$0")" && pwd)
src=$hack/nodevm/image
cache=${NODEVM_CACHE:-/var/cache/crisp}
accel_file=$cache/nodevm-accel
cpus=${NODEVM_CPUS:-2}
mem=${NODEVM_MEM:-3072}
cmdline='root=/dev/vda rw console=ttyS0,115200 hugepages=16 panic=10'
flavour=${NODEVM_FLAVOUR:-apparmor}

log() { echo "nodevm: $*" >&2; }
die() { log "$*"; exit 1; }

# seconds 90|90s|20m|1h -> seconds
seconds() {
	case $1 in
	*h) echo $(( ${1%h} * 3600 )) ;;
	*m) echo $(( ${1%m} * 60 )) ;;
	*s) echo "${1%s}" ;;
	*) echo "$1" ;;
	esac
}
timeout=$(seconds "${NODEVM_TIMEOUT:-20m}")
boot_timeout=$(seconds "${NODEVM_BOOT_TIMEOUT:-300}")
kvm_probe=$(seconds "${NODEVM_KVM_PROBE_TIMEOUT:-40}")

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
fmt_s() { printf '%d.%d' $(( $1 / 1000 )) $(( $1 % 1000 / 100 )); } # ms -> s.d

# image_key FLAVOUR: that flavour's cache key: the files of nodevm/image/ and of its
# nodevm/image/FLAVOUR/, by name and content.
image_key() {
	[ -f "$src/$1/packages" ] || die "unknown flavour $1 (NODEVM_FLAVOUR: $(flavours | xargs))"
	(cd "$src" && find . "./$1" -maxdepth 1 -type f -print0 | LC_ALL=C sort -z |
		xargs -0 sha256sum) | sha256sum | cut -c1-16
}
# flavours: every flavour nodevm/image/ has, one a line.
flavours() {
	local d
	for d in "$src"/*/packages; do d=${d%/packages}; echo "${d##*/}"; done
}

# State of the one guest (or image build) this process runs at a time; cleanup()
# undoes it.
qpid= work= bpid= btmp=
cleanup() {
	stop_qemu
	if [ -n "$work" ]; then rm -rf "$work"; fi
	work=
	if [ -n "$bpid" ]; then
		# build.sh runs in its own process group (setsid): mmdebstrap gets the signal
		# too and unmounts what it mounted in the tree.
		kill -TERM -- "-$bpid" 2>/dev/null || true
		wait "$bpid" 2>/dev/null || true
		bpid=
	fi
	if [ -n "$btmp" ]; then remove_tree "$btmp"; fi
	btmp=
}
# remove_tree DIR: rm -rf that never follows a mount out of DIR's file system (a build
# killed mid-way may leave the tree's /proc, /sys or /dev mounted).
remove_tree() {
	local m
	awk -v d="$1/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
		while read -r m; do umount -l "$m" 2>/dev/null || true; done
	rm -rf --one-file-system "$1"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

qemu_alive() {
	[ -n "$qpid" ] && kill -0 "$qpid" 2>/dev/null &&
		[ "$(awk '{print $3}' "/proc/$qpid/stat" 2>/dev/null)" != Z ]
}

# stop_qemu: SIGTERM to our qemu, SIGKILL if it is still there 10 s later.
stop_qemu() {
	[ -n "$qpid" ] || return 0
	if qemu_alive; then
		kill -TERM "$qpid" 2>/dev/null || true
		for _ in $(seq 20); do qemu_alive || break; sleep 0.5; done
		if qemu_alive; then kill -KILL "$qpid" 2>/dev/null || true; fi
	fi
	wait "$qpid" 2>/dev/null || true
	qpid=
}

# qemu_args ACCEL IMGDIR OVERLAY SHARE APPEND: the guest's command line in ${qargs[@]}.
qemu_args() {
	local acc
	case $1 in
	kvm) acc=(-accel kvm -cpu host) ;;
	tcg) acc=(-accel tcg,thread=multi -cpu max) ;;
	*) die "unknown accelerator $1 (NODEVM_ACCEL=kvm|tcg)" ;;
	esac
	qargs=(qemu-system-x86_64 -name crisp-nodevm -machine q35 "${acc[@]}"
		-smp "$cpus" -m "$mem" -nodefaults -no-user-config -display none -vga none
		-no-reboot -nic none
		-kernel "$2/vmlinuz" -initrd "$2/initrd.img" -append "$cmdline $(cat "$2/cmdline") $5"
		-drive "file=$3,format=qcow2,if=virtio,cache=unsafe,discard=unmap"
		-virtfs "local,path=$4,mount_tag=host,security_model=none,id=host"
		-device virtio-rng-pci)
}

# boot ACCEL IMGDIR SHARE BOOTLIMIT: boots a guest on a fresh overlay and waits for it
# to power off. Sets outcome (done: powered off after the runner started; noboot: no
# runner within BOOTLIMIT s; timeout: running past NODEVM_TIMEOUT; down: powered off or
# crashed before the runner), boot_ms and total_ms.
boot() {
	local accel=$1 imgdir=$2 share=$3 limit=$4 out=$3/out t0 el
	rm -rf "$out"
	mkdir -p "$out"
	rm -f "$work/overlay.qcow2"
	qemu-img create -q -f qcow2 -F raw -b "$imgdir/rootfs.img" "$work/overlay.qcow2"
	qemu_args "$accel" "$imgdir" "$work/overlay.qcow2" "$share" ""
	t0=$(now_ms)
	"${qargs[@]}" -serial "file:$out/serial.log" </dev/null >"$out/qemu.log" 2>&1 &
	qpid=$!
	boot_ms= outcome=
	while qemu_alive; do
		el=$(( $(now_ms) - t0 ))
		if [ -z "$boot_ms" ] && [ -e "$out/started" ]; then
			boot_ms=$el
			log "guest reached the runner in $(fmt_s "$el") s ($accel)"
		fi
		if [ -z "$boot_ms" ] && [ "$el" -gt $(( limit * 1000 )) ]; then
			outcome=noboot
			break
		fi
		if [ "$el" -gt $(( timeout * 1000 )) ]; then
			outcome=timeout
			break
		fi
		sleep 0.5
	done
	stop_qemu
	total_ms=$(( $(now_ms) - t0 ))
	if [ -z "$outcome" ]; then
		if [ -z "$boot_ms" ] && [ -e "$out/started" ]; then boot_ms=$total_ms; fi
		if [ -n "$boot_ms" ]; then outcome=done; else outcome=down; fi
	fi
	rm -f "$work/overlay.qcow2"
	printf 'accel=%s\nboot_s=%s\ntotal_s=%s\noutcome=%s\n' "$accel" \
		"$( [ -n "$boot_ms" ] && fmt_s "$boot_ms")" "$(fmt_s "$total_ms")" "$outcome" \
		> "$out/nodevm.times"
}

# pick_accel: the accelerator to boot with in $accel; probe=1 when KVM is to be tried.
pick_accel() {
	probe=0
	if [ -n "${NODEVM_ACCEL:-}" ]; then accel=$NODEVM_ACCEL; return; fi
	local a k
	if read -r a k 2>/dev/null < "$accel_file" && [ "$k" = "$(uname -r)" ]; then
		accel=$a
		return
	fi
	if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
		accel=kvm probe=1
	else
		accel=tcg
		remember_accel tcg "no usable /dev/kvm"
	fi
}
remember_accel() {
	mkdir -p "$cache"
	echo "$1 $(uname -r)" > "$accel_file.tmp.$$" && mv "$accel_file.tmp.$$" "$accel_file"
	log "accelerator: $1 ($2), remembered in $accel_file"
}

# guest IMGDIR SHARE: boots and runs SHARE/run.sh (the KVM probe included); sets
# outcome, boot_ms, total_ms, accel. Leaves no qemu and no overlay.
guest() {
	local imgdir=$1 share=$2
	pick_accel
	work=$(mktemp -d /var/tmp/nodevm.XXXXXX)
	if [ "$probe" = 1 ]; then
		log "trying KVM (the runner must start within ${kvm_probe} s)"
		boot kvm "$imgdir" "$share" "$kvm_probe"
		if [ "$outcome" = noboot ] || [ "$outcome" = down ]; then
			remember_accel tcg "a KVM guest did not reach the runner in ${kvm_probe} s"
			accel=tcg
		else
			remember_accel kvm "a KVM guest reached the runner in $(fmt_s "$boot_ms") s"
		fi
	fi
	if [ "$probe" = 0 ] || [ "$accel" = tcg ]; then
		boot "$accel" "$imgdir" "$share" "$boot_timeout"
	fi
	rm -rf "$work"
	work=
}

# result SHARE: run's exit: run.sh's code, or 125 and why.
result() {
	local out=$1/out why
	case $outcome in
	done)
		if [ -s "$out/rc" ]; then
			log "run.sh exited $(cat "$out/rc") (boot $(fmt_s "$boot_ms") s, total $(fmt_s "$total_ms") s, $accel)"
			return "$(cat "$out/rc")"
		fi
		why="the guest went down while run.sh ran (no out/rc)" ;;
	noboot) why="the guest did not reach the runner within $boot_timeout s ($accel)" ;;
	timeout) why="the guest ran past NODEVM_TIMEOUT ($timeout s): qemu killed" ;;
	down) why="the guest went down before reaching the runner (boot failure)" ;;
	esac
	log "FAILED: $why"
	log "last lines of the serial console ($out/serial.log):"
	tail -n 40 "$out/serial.log" >&2 2>/dev/null || true
	if [ -s "$out/run.log" ]; then
		log "last lines of run.sh's output ($out/run.log):"
		tail -n 20 "$out/run.log" >&2
	fi
	return 125
}

# prune: removes the cached images but each flavour's current one, unless a qemu boots
# from one.
prune() {
	local f d keep=" "
	for f in $(flavours); do keep+="$cache/nodevm-$f-$(image_key "$f") "; done
	for d in "$cache"/nodevm-*/; do
		d=${d%/}
		case $d in *.tmp.* | */nodevm-failed-check-*) continue ;; esac
		case $keep in *" $d "*) continue ;; esac
		if grep -qsF "$d/" /proc/[0-9]*/cmdline; then
			log "keeping $d: a guest is running on it"
			continue
		fi
		log "removing $d"
		rm -rf --one-file-system "$d"
	done
}

# ensure_image: sets imgdir to the cached image, building it first if needed.
ensure_image() {
	local key tmp t0 build_ms rc
	key=$(image_key "$flavour")
	imgdir=$cache/nodevm-$flavour-$key
	if [ -f "$imgdir/rootfs.img" ]; then return 0; fi
	mkdir -p "$cache"
	exec 9>"$cache/nodevm.lock"
	flock 9
	if [ -f "$imgdir/rootfs.img" ]; then exec 9>&-; return 0; fi
	# Under the lock no build runs: any temp dir is a dead build's.
	for tmp in "$cache"/nodevm-*.tmp.*; do
		if [ -e "$tmp" ]; then log "removing $tmp (an interrupted build)"; remove_tree "$tmp"; fi
	done
	tmp=$imgdir.tmp.$$
	btmp=$tmp
	log "building the $flavour image (key $key) in $tmp"
	t0=$(now_ms)
	setsid "$src/build.sh" "$tmp" "$flavour" >"$cache/nodevm-build-$flavour.log" 2>&1 &
	bpid=$!
	rc=0
	wait "$bpid" || rc=$?
	bpid=
	if [ "$rc" != 0 ]; then
		tail -n 30 "$cache/nodevm-build-$flavour.log" >&2
		die "image build failed (log: $cache/nodevm-build-$flavour.log)"
	fi
	build_ms=$(( $(now_ms) - t0 ))
	log "image built in $(fmt_s "$build_ms") s; smoke check in a guest"
	local share=$tmp/check
	mkdir -p "$share"
	cp "$hack/nodevm/check.sh" "$share/run.sh"
	guest "$tmp" "$share"
	rc=0
	result "$share" || rc=$?
	cat "$share/out/run.log" >&2 2>/dev/null || true
	if [ "$rc" != 0 ]; then
		rm -rf "$cache/nodevm-failed-check-$flavour"
		mv "$share" "$cache/nodevm-failed-check-$flavour"
		die "the new image failed its smoke check (its output: $cache/nodevm-failed-check-$flavour/out)"
	fi
	printf 'build_s=%s\ncheck_boot_s=%s\naccel=%s\n' "$(fmt_s "$build_ms")" \
		"$(fmt_s "$boot_ms")" "$accel" > "$tmp/build.times"
	mv "$share/out/run.log" "$tmp/check.log"
	rm -rf "$share"
	mv -T "$tmp" "$imgdir"
	btmp=
	exec 9>&-
	log "image ready in $(fmt_s $(( $(now_ms) - t0 ))) s: $imgdir"
	prune
}

cmd=${1:-}
case $cmd in
image)
	ensure_image
	echo "$imgdir"
	;;
run)
	[ $# -eq 2 ] || die "usage: nodevm.sh run DIR"
	share=$(cd "$2" && pwd)
	[ -f "$share/run.sh" ] || die "$share/run.sh: no such file"
	ensure_image
	guest "$imgdir" "$share"
	rc=0
	result "$share" || rc=$?
	exit "$rc"
	;;
check)
	ensure_image
	share=$(mktemp -d /var/tmp/nodevm-check.XXXXXX)
	cp "$hack/nodevm/check.sh" "$share/run.sh"
	guest "$imgdir" "$share"
	rc=0
	result "$share" || rc=$?
	cat "$share/out/run.log" 2>/dev/null || true
	rm -rf "$share"
	exit "$rc"
	;;
shell)
	[ $# -le 2 ] || die "usage: nodevm.sh shell [DIR]"
	ensure_image
	pick_accel
	if [ "$probe" = 1 ]; then
		log "accelerator not probed yet: shell boots under TCG (run or check probes KVM)"
		accel=tcg
	fi
	work=$(mktemp -d /var/tmp/nodevm.XXXXXX)
	if [ $# -eq 2 ]; then share=$(cd "$2" && pwd); else share=$work/share; mkdir "$share"; fi
	mkdir -p "$share/out"
	qemu-img create -q -f qcow2 -F raw -b "$imgdir/rootfs.img" "$work/overlay.qcow2"
	qemu_args "$accel" "$imgdir" "$work/overlay.qcow2" "$share" nodevm.runner=off
	log "booting ($accel); the share is /mnt/host in the guest (run.sh is not run);"
	log "Ctrl-A X quits qemu, Ctrl-A C its monitor; console copied to $share/out/serial.log"
	"${qargs[@]}" -chardev "stdio,id=con,mux=on,signal=off,logfile=$share/out/serial.log" \
		-serial chardev:con -mon chardev=con,mode=readline
	;;
prune)
	prune
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
