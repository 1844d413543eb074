#!/usr/bin/env bash
# test-node.sh NODE_DIR OLD_REV: the node VM half of `make test-node`. NODE_DIR holds
# what the Makefile built: deb/crisp_<version>_<arch>.deb (make deb) and node.test
# (go test -c of NODE_PKG, ./test/e2e, whose tests NODE_RUN, ^TestNode, picks). OLD_REV is
# the commit whose package the upgrade tests start from (nodevm/old-deb.sh builds and
# caches it; its version must sort below this one).
#
# For each flavour of the guest in NODE_FLAVOURS ("apparmor selinux": hack/nodevm.sh's
# NODEVM_FLAVOUR) and each of its cgroup drivers (apparmor: NODE_DRIVERS, "systemd
# cgroupfs"; selinux: systemd, the driver of the nodes that enforce SELinux) it boots a
# fresh guest (hack/nodevm.sh run) on the share NODE_DIR/run-<flavour>-<driver>/: node.test, node.env,
# deb/<the package>, old/<the old package>, run.sh = nodevm/node-run.sh, hello.wasm (the
# wasm tests' module, built here for wasip1: the guest has no compiler), and testdata/
# when NODE_PKG has one. Inside, /mnt/host is that share; node-run.sh copies the files
# to /root/node and runs node.test there (see it for the environment). Each guest gets
# NODE_TEST_TIMEOUT (25m) for the suite and 5 minutes more for its boot and the install
# (NODEVM_TIMEOUT). The flavours' images are built first (one at a time), then the
# guests run at once (NODE_PARALLEL=0: one after the other). On
# this 2-core host each of two TCG guests runs at half speed (2 vCPUs each), so CPU-bound
# work takes as long in total either way (two driver runs of a fixed CPU load: 71 s at
# once, 79 s in turn), but boots, installs and every wait in the tests overlap: the
# node suite took 234 s at once and 330 s in turn (and, with two tests waiting out
# 120 s timeouts, 374 s against 641 s). Prints per
# flavour and driver the boot time, the suite's time and its PASS/FAIL/SKIP counts;
# fails if any run failed. Logs stay in NODE_DIR/run-<flavour>-<driver>/out/: run.log,
# serial.log and, after a failure, journal-crisp.log, dmesg.log, failed-units.log (and
# under SELinux audit.log).
set -euo pipefail
dir=$(cd "${1:?usage: test-node.sh NODE_DIR OLD_REV}" && pwd)
old_rev=${2:?usage: test-node.sh NODE_DIR OLD_REV}
hack=$(cd "$(dirname "$0")/.." && pwd)
repo=$(cd "$hack/.." && pwd)
flavours=${NODE_FLAVOURS:-apparmor selinux}
drivers=${NODE_DRIVERS:-systemd cgroupfs}
test_timeout=${NODE_TEST_TIMEOUT:-25m}
parallel=${NODE_PARALLEL:-1}
pkg=${NODE_PKG:-./test/e2e}
run=${NODE_RUN-^TestNode}
# NODE_SELINUX_PERMISSIVE: SELinux domains (container_engine_t ...) the SELinux guest
# makes permissive before the tests, to see every denial of a policy change in one run
# (out/avc.log) rather than the first; never set by `make test`.

log() { echo "test-node: $*" >&2; }
die() { log "$*"; exit 1; }
t_start=$(date +%s)

debs=("$dir"/deb/crisp_*.deb)
[ ${#debs[@]} -eq 1 ] && [ -f "${debs[0]}" ] || die "want one package in $dir/deb, found: ${debs[*]}"
deb=${debs[0]}
[ -x "$dir/node.test" ] || die "$dir/node.test: not built"
old_deb=$("$hack/nodevm/old-deb.sh" "$old_rev")
version=$(dpkg-deb -f "$deb" Version)
old_version=$(dpkg-deb -f "$old_deb" Version)
dpkg --compare-versions "$old_version" lt "$version" ||
	die "the old package's version $old_version ($old_rev) does not sort below $version"
log "package $version, upgrades from $old_version ($old_rev)"

# runs: every guest to boot, as <flavour>-<driver>.
runs=()
for f in $flavours; do
	case $f in
	apparmor) for d in $drivers; do runs+=("$f-$d"); done ;;
	selinux) runs+=("$f-systemd") ;;
	*) die "NODE_FLAVOURS: unknown flavour $f (apparmor, selinux)" ;;
	esac
	NODEVM_FLAVOUR=$f "$hack/nodevm.sh" image >/dev/null
done

case $test_timeout in
*m) guest_timeout=$(( ${test_timeout%m} + 5 ))m ;;
*) die "NODE_TEST_TIMEOUT: minutes please (25m)" ;;
esac

pids=()
stop_children() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
}
trap 'stop_children; exit 130' INT
trap 'stop_children; exit 143' TERM

prepare() { # prepare RUN: the share of that run's guest (RUN: <flavour>-<driver>)
	local s=$dir/run-$1
	rm -rf "$s"
	mkdir -p "$s/deb" "$s/old"
	ln "$dir/node.test" "$s/node.test" 2>/dev/null || cp "$dir/node.test" "$s/node.test"
	cp "$deb" "$s/deb/"
	cp "$old_deb" "$s/old/"
	cp "$hack/nodevm/node-run.sh" "$s/run.sh"
	if [ -d "$repo/$pkg/testdata" ]; then cp -r "$repo/$pkg/testdata" "$s/"; fi
	# TestNodeWasm's module (node-run.sh hands it over as CRISP_E2E_WASM_MODULE).
	(cd "$repo" && GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 GOFLAGS= "${GO:-go}" build -trimpath \
		-o "$s/hello.wasm" ./test/e2e/testdata/wasm/hello) || die "build the wasm tests' module"
	# TestNodeCritest: critest, and its images built here (the guest has no compiler).
	"$hack/critest.sh" && cp "${CRITEST_CACHE:-/var/cache/crisp/critest-v1.36.0}/bin/critest" "$s/"
	CRISP_CRITEST_IMAGES_EXPORT=$s/critest-images "$dir/node.test" -test.run '^TestCritestImagesExport$' \
		> "$s/critest-images.log" 2>&1 || die "critest's images: see $s/critest-images.log"
	printf 'NODE_DRIVER=%q\nNODE_DEB=%q\nNODE_OLD_DEB=%q\nNODE_TEST_TIMEOUT=%q\nNODE_RUN=%q\nNODE_SELINUX_PERMISSIVE=%q\n' \
		"${1#*-}" "${deb##*/}" "${old_deb##*/}" "$test_timeout" "$run" "${NODE_SELINUX_PERMISSIVE:-}" > "$s/node.env"
}

declare -A rc
for d in "${runs[@]}"; do
	prepare "$d"
	if [ "$parallel" = 1 ]; then
		log "$d: booting (output in $dir/run-$d.log)"
		NODEVM_FLAVOUR=${d%%-*} NODEVM_TIMEOUT=$guest_timeout \
			"$hack/nodevm.sh" run "$dir/run-$d" > "$dir/run-$d.log" 2>&1 &
		pids+=($!)
	else
		log "$d: booting"
		rc[$d]=0
		NODEVM_FLAVOUR=${d%%-*} NODEVM_TIMEOUT=$guest_timeout \
			"$hack/nodevm.sh" run "$dir/run-$d" || rc[$d]=$?
	fi
done
if [ "$parallel" = 1 ]; then
	i=0
	for d in "${runs[@]}"; do
		rc[$d]=0
		wait "${pids[$i]}" || rc[$d]=$?
		i=$(( i + 1 ))
		cat "$dir/run-$d.log" >&2
	done
	pids=()
fi

value() { sed -n "s/^$1=//p" "$2" 2>/dev/null; }
failed=0
printf '\n%-9s %-9s %-6s %8s %8s %6s %6s %6s\n' flavour driver result boot_s suite_s pass fail skip
for d in "${runs[@]}"; do
	out=$dir/run-$d/out
	count() { grep -cE "^[[:space:]]*--- $1:" "$out/run.log" 2>/dev/null || true; }
	res=PASS
	if [ "${rc[$d]}" != 0 ]; then res=FAIL failed=1; fi
	printf '%-9s %-9s %-6s %8s %8s %6s %6s %6s\n' "${d%%-*}" "${d#*-}" "$res" \
		"$(value boot_s "$out/nodevm.times")" \
		"$(cat "$out/suite_s" 2>/dev/null || echo -)" "$(count PASS)" "$(count FAIL)" "$(count SKIP)"
done
for d in "${runs[@]}"; do
	[ "${rc[$d]}" != 0 ] || continue
	out=$dir/run-$d/out
	echo
	echo "=== $d: FAILED (exit ${rc[$d]}); logs in $out"
	grep -E '^[[:space:]]*--- FAIL:' "$out/run.log" 2>/dev/null || true
	echo "--- last lines of $out/run.log:"
	tail -n 60 "$out/run.log" 2>/dev/null || true
done
log "done in $(( $(date +%s) - t_start )) s"
exit "$failed"
