#!/bin/bash
# node-run.sh: the run.sh of `make test-node` inside the node VM (hack/nodevm/test-node.sh
# puts it in the share with node.env, node.test, deb/ and old/). It installs the package
# with dpkg -i, sets the cgroup driver, restarts crisp, waits for its socket and runs
# the node tests from /root/node:
#   CRISP_NODE=1 CRISP_NODE_DRIVER=<driver> CRISP_NODE_DEB=/root/node/new/crisp_<v>.deb \
#   CRISP_E2E_WASM_MODULE=/root/node/hello.wasm CRISP_NODE_OLD_DEB=/root/node/old/crisp_<v>.deb ./node.test -test.v -test.timeout <t> \
#   -test.run <NODE_RUN>
# Its output is the runner's out/run.log; out/suite_s gets the suite's time, and a failure
# leaves out/journal-crisp.log, out/dmesg.log and out/failed-units.log. Under SELinux
# out/avc.log gets every AVC denial of the run, the kernel's and those systemd and D-Bus
# check (ausearch -m avc,user_avc), failed or not.
set -u
# NODE_DRIVER, NODE_DEB, NODE_OLD_DEB (file names), NODE_TEST_TIMEOUT, NODE_RUN.
. ./node.env
out=$NODEVM_OUT
node=/root/node
step() { echo "node-run: $(cut -d' ' -f1 /proc/uptime)s: $*"; }
logs() {
	journalctl -u crisp --no-pager -o short-monotonic > "$out/journal-crisp.log" 2>&1
	dmesg > "$out/dmesg.log" 2>&1
	systemctl --failed --no-pager > "$out/failed-units.log" 2>&1
}
avcs() {
	if [ -e /sys/fs/selinux/enforce ]; then
		ausearch -m avc,user_avc -i > "$out/avc.log" 2>&1
		step "$(grep -c "^type=\(USER_\)\?AVC" "$out/avc.log") AVC denials in the audit log (out/avc.log)"
	fi
}
fail() {
	step "FAIL: $*"
	systemctl status crisp --no-pager 2>&1 | head -20
	logs
	avcs
	exit 1
}

# The binary and the packages go to the guest's own disk: nothing runs from the share.
mkdir -p "$node/new" "$node/old"
cp node.test "$node/"
cp "deb/$NODE_DEB" "$node/new/"
cp "old/$NODE_OLD_DEB" "$node/old/"
if [ -d testdata ]; then cp -r testdata "$node/"; fi
# TestNodeCritest's critest and images (test-node.sh's prepare).
for f in critest critest-images hello.wasm; do if [ -e "$f" ]; then cp -r "$f" "$node/"; fi; done

# A discovery aid for policy work (test-node.sh): the domains in NODE_SELINUX_PERMISSIVE
# only log their denials, and dontaudit rules are off.
if [ -n "${NODE_SELINUX_PERMISSIVE:-}" ] && [ -e /sys/fs/selinux/enforce ]; then
	for d in $NODE_SELINUX_PERMISSIVE; do echo "(typepermissive $d)"; done > /root/permissive.cil
	step "permissive: $NODE_SELINUX_PERMISSIVE"
	semodule -i /root/permissive.cil || fail "semodule -i permissive.cil"
	# Denials the policy keeps quiet (dontaudit) are logged too.
	semodule -DB || fail "semodule -DB"
fi
step "dpkg -i $NODE_DEB"
dpkg -i "$node/new/$NODE_DEB" || fail "dpkg -i"
sed -i "s/^cgroup_driver = .*/cgroup_driver = \"$NODE_DRIVER\"/" /etc/crisp/config.toml
grep -qx "cgroup_driver = \"$NODE_DRIVER\"" /etc/crisp/config.toml ||
	fail "no cgroup_driver line in /etc/crisp/config.toml"
step "cgroup_driver = \"$NODE_DRIVER\"; systemctl restart crisp"
systemctl restart crisp || fail "systemctl restart crisp"
for _ in $(seq 240); do
	[ -S /run/crisp/crisp.sock ] && break
	sleep 0.5
done
[ -S /run/crisp/crisp.sock ] || fail "no /run/crisp/crisp.sock 120 s after the restart"
step "crisp is up: $(criserver --version 2>/dev/null | head -1)"

cd "$node"
args=(-test.v -test.timeout "$NODE_TEST_TIMEOUT")
if [ -n "$NODE_RUN" ]; then args+=(-test.run "$NODE_RUN"); fi
step "./node.test ${args[*]}"
t0=$(date +%s%N)
CRISP_NODE=1 CRISP_NODE_DRIVER=$NODE_DRIVER CRISP_NODE_DEB=$node/new/$NODE_DEB \
	CRISP_E2E_WASM_MODULE=$node/hello.wasm \
	CRISP_NODE_OLD_DEB=$node/old/$NODE_OLD_DEB \
	./node.test "${args[@]}"
rc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
printf '%d.%d\n' $(( ms / 1000 )) $(( ms % 1000 / 100 )) > "$out/suite_s"
step "node.test exited $rc"
if [ "$rc" != 0 ]; then logs; fi
avcs
exit "$rc"
