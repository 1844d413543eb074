package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// leakSnapshot counts everything an env's pods and criserver hold on the node, so that
// a test can check that a run (with kills, restarts, faults) left everything as it
// found it: take one before, one after, and compare with assertSame.
//
// Counts are keyed by a short name ("shims", "mounts", "cgroup/memory", "files/root/
// images", ...); the objects behind a count are kept for the error message.
type leakSnapshot struct {
	taken  time.Time
	counts map[string]int
	// what lists the objects behind each count (names, paths, rules), for messages.
	what map[string][]string
	// criserver's process figures; pid 0 when it was not running.
	pid     int
	fds     int
	threads int
	rssKiB  int
}

// Tolerances for criserver's own figures: its caches, Go's heap and its idle threads
// may grow a little with work done, without being a leak.
const (
	leakFDSlack      = 4
	leakThreadSlack  = 8
	leakRSSSlackKiB  = 15 << 10 // 15 MiB ...
	leakRSSSlackFrac = 0.30     // ... or 30 %, whichever is more
)

// leakSnapshot counts what the env holds right now. It never fails the test: what
// cannot be read counts as nothing.
func (e *env) leakSnapshot(t *testing.T) leakSnapshot {
	t.Helper()
	s := leakSnapshot{taken: time.Now(), counts: map[string]int{}, what: map[string][]string{}}
	add := func(key string, items []string) {
		sort.Strings(items)
		s.counts[key] = len(items)
		s.what[key] = items
	}
	add("shim+pause processes", e.shimProcesses())
	add("mounts", mountsUnder(e.dir))
	add("netns pins", leakDirNames(filepath.Join(e.state, "netns")))
	add("veths", e.vethsOnBridge())
	add("ipam reservations", e.ipamReservations())
	add("iptables rules", e.leakIptablesRules())
	for ctrl, dirs := range e.leakCgroupTree() {
		add("cgroups/"+ctrl, dirs)
	}
	add("cgroup processes", e.leakCgroupProcs())
	for key, files := range leakFiles(e.root, "root") {
		add(key, files)
	}
	for key, files := range leakFiles(e.state, "state") {
		add(key, files)
	}
	// The warm spare shims are expected (a new one replaces each one a pod takes):
	// bounded by their own count, and not counted with the pods' objects. Listed
	// last, so that a spare that started while the rest was read is known as one.
	spares := e.warmSpares()
	add("warm spares beyond one per handler", spareExcess(spares))
	for key, items := range s.what {
		if key == "shim+pause processes" || strings.HasPrefix(key, "files/state/") {
			add(key, withoutSpares(items, spares))
		}
	}
	if e.cmd != nil && e.cmd.Process != nil {
		s.pid = e.cmd.Process.Pid
		if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.pid)); err == nil {
			s.fds = len(fds)
		}
		s.threads = leakProcStatus(s.pid, "Threads")
		s.rssKiB = leakProcStatus(s.pid, "VmRSS")
	}
	return s
}

// leaks lists what after holds beyond s (before): node objects must be back to their
// count (or fewer: a restart may tidy up what was there before, see fewer);
// criserver's fds, threads and RSS within their tolerance (compared only when
// criserver ran at both snapshots).
func (s leakSnapshot) leaks(after leakSnapshot) []string {
	var out []string
	keys := map[string]bool{}
	for k := range s.counts {
		keys[k] = true
	}
	for k := range after.counts {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		if b, a := s.counts[k], after.counts[k]; a > b {
			out = append(out, fmt.Sprintf("%s: %d before, %d after; new: %s; gone: %s",
				k, b, a, leakClip(leakMinus(after.what[k], s.what[k])), leakClip(leakMinus(s.what[k], after.what[k]))))
		}
	}
	if s.pid != 0 && after.pid != 0 {
		if after.fds > s.fds+leakFDSlack {
			out = append(out, fmt.Sprintf("criserver fds: %d before, %d after (slack %d)", s.fds, after.fds, leakFDSlack))
		}
		if after.threads > s.threads+leakThreadSlack {
			out = append(out, fmt.Sprintf("criserver threads: %d before, %d after (slack %d)", s.threads, after.threads, leakThreadSlack))
		}
		slack := max(leakRSSSlackKiB, int(float64(s.rssKiB)*leakRSSSlackFrac))
		if after.rssKiB > s.rssKiB+slack {
			out = append(out, fmt.Sprintf("criserver RSS: %d KiB before, %d KiB after (slack %d KiB)", s.rssKiB, after.rssKiB, slack))
		}
	}
	return out
}

// fewer lists the counts that went down between s and after: not leaks (criserver may
// remove at start what an earlier run left, e.g. an empty state_dir/exec), but worth
// a line in the test's log.
func (s leakSnapshot) fewer(after leakSnapshot) []string {
	var out []string
	for k, b := range s.counts {
		if a := after.counts[k]; a < b {
			out = append(out, fmt.Sprintf("%s: %d before, %d after; gone: %s", k, b, a, leakClip(leakMinus(s.what[k], after.what[k]))))
		}
	}
	sort.Strings(out)
	return out
}

// leakedObjects is how many node objects (not criserver's own figures) after holds
// beyond s: the "leaked objects" figure of the chaos tests.
func (s leakSnapshot) leakedObjects(after leakSnapshot) int {
	n := 0
	for k, a := range after.counts {
		if a > s.counts[k] {
			n += a - s.counts[k]
		}
	}
	return n
}

// assertSame fails the test for every difference leaks reports.
func (s leakSnapshot) assertSame(t *testing.T, after leakSnapshot) {
	t.Helper()
	for _, l := range s.leaks(after) {
		t.Errorf("leak: %s", l)
	}
	for _, l := range s.fewer(after) {
		t.Logf("fewer than before (not a leak): %s", l)
	}
}

// String summarises the snapshot in one line (non-zero counts only).
func (s leakSnapshot) String() string {
	var parts []string
	for k, n := range s.counts {
		if n != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", k, n))
		}
	}
	sort.Strings(parts)
	if s.pid != 0 {
		parts = append(parts, fmt.Sprintf("criserver fds=%d threads=%d rss=%dKiB", s.fds, s.threads, s.rssKiB))
	}
	return strings.Join(parts, " ")
}

// assertNoLeaks waits up to within for the env to be back to before (a shim exits,
// the kernel frees a veth or a cgroup, a closed client's fd is released a little after
// the call that caused it returned), then asserts it is. It returns the last snapshot.
func (e *env) assertNoLeaks(t *testing.T, before leakSnapshot, within time.Duration) leakSnapshot {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		after := e.leakSnapshot(t)
		if len(before.leaks(after)) == 0 || time.Now().After(deadline) {
			before.assertSame(t, after)
			return after
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leakCgroupTree lists, per v1 controller and "unified", the cgroup directories below the
// env's cgroup parent (recursively: pod cgroups and the container cgroups in them).
// The parent itself is not counted: crisp creates it with the first pod.
func (e *env) leakCgroupTree() map[string][]string {
	out := map[string][]string{}
	for _, ctrl := range append(cgroupControllers(), "unified") {
		base := filepath.Join("/sys/fs/cgroup", ctrl, e.cgroup)
		var dirs []string
		_ = filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() && p != base {
				dirs = append(dirs, strings.TrimPrefix(p, base+"/"))
			}
			return nil
		})
		out[ctrl] = dirs
	}
	return out
}

// leakCgroupProcs lists the processes still in any cgroup below the env's cgroup parent
// (pause and container processes), by the pids controller, or memory without it.
func (e *env) leakCgroupProcs() []string {
	ctrl := "pids"
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctrl)); err != nil {
		ctrl = "memory"
	}
	base := filepath.Join("/sys/fs/cgroup", ctrl, e.cgroup)
	seen := map[string]bool{}
	var out []string
	_ = filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		data, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		for _, pid := range strings.Fields(string(data)) {
			if !seen[pid] {
				seen[pid] = true
				cmd, _ := os.ReadFile("/proc/" + pid + "/cmdline")
				out = append(out, pid+":"+strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")))
			}
		}
		return nil
	})
	return out
}

var leakCNIChain = regexp.MustCompile(`\bCNI-(DN-|SN-)?[0-9a-f]{16,}\b`)

// leakIptablesRules lists the iptables rules (every table) that belong to the env's pods:
// the rules naming an address of its subnet, the per-pod chains CNI plugins make for
// them (CNI-<hash>, CNI-DN-<hash>) with every rule in or jumping to those chains. Rules
// of other envs (other subnets) and the shared chains CNI plugins create once
// (CNI-HOSTPORT-*) are not counted, so tests running at the same time do not disturb
// the count.
func (e *env) leakIptablesRules() []string {
	out, err := exec.Command("iptables-save").Output()
	if err != nil {
		return []string{"iptables-save failed: " + err.Error()}
	}
	prefix := leakSubnetPrefix(e.subnet)
	lines := strings.Split(string(out), "\n")
	chains := map[string]bool{}
	for _, l := range lines {
		if prefix != "" && strings.Contains(l, prefix) {
			for _, c := range leakCNIChain.FindAllString(l, -1) {
				chains[c] = true
			}
		}
	}
	var rules []string
	table := ""
	for _, l := range lines {
		if strings.HasPrefix(l, "*") {
			table = l[1:]
			continue
		}
		if strings.HasPrefix(l, "#") || l == "" || l == "COMMIT" {
			continue
		}
		mine := prefix != "" && strings.Contains(l, prefix)
		for _, c := range leakCNIChain.FindAllString(l, -1) {
			if chains[c] {
				mine = true
			}
		}
		if mine {
			rules = append(rules, table+" "+l)
		}
	}
	return rules
}

// leakSubnetPrefix turns "10.201.33.0/24" into "10.201.33." (the env subnets are /24s).
func leakSubnetPrefix(cidr string) string {
	ip, _, _ := strings.Cut(cidr, "/")
	if i := strings.LastIndexByte(ip, '.'); i > 0 {
		return ip[:i+1]
	}
	return ""
}

// leakFiles walks dir and lists every file and directory below it, keyed by
// "files/<label>/<first path component>" ("files/<label>/images/snapshots",
// "files/<label>/cni/networks": two components below images/ and cni/), leaving out
// the metadata database (bbolt's file grows and never shrinks). It does not descend
// into mount points (a container's rootfs, the pod's shm): those count as mounts.
func leakFiles(dir, label string) map[string][]string {
	out := map[string][]string{}
	mounts := map[string]bool{}
	for _, m := range mountsUnder(dir) {
		mounts[m] = true
	}
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil
		}
		rel := strings.TrimPrefix(p, dir+"/")
		if strings.HasPrefix(rel, "meta.db") {
			return nil
		}
		parts := strings.SplitN(rel, "/", 3)
		key := "files/" + label + "/" + parts[0]
		if len(parts) > 1 && (parts[0] == "images" || parts[0] == "cni") {
			key += "/" + parts[1]
		}
		out[key] = append(out[key], rel)
		if d.IsDir() && mounts[p] {
			return filepath.SkipDir
		}
		return nil
	})
	return out
}

// leakDirNames lists the names in dir (nothing when it does not exist).
func leakDirNames(dir string) []string {
	entries, _ := os.ReadDir(dir)
	out := make([]string, 0, len(entries))
	for _, en := range entries {
		out = append(out, en.Name())
	}
	return out
}

// leakProcStatus reads a numeric field (kB for sizes) of /proc/PID/status; 0 if unknown.
func leakProcStatus(pid int, field string) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.Atoi(f[0])
				return n
			}
		}
	}
	return 0
}

// minus returns the items of a not in b (as multisets).
func leakMinus(a, b []string) []string {
	count := map[string]int{}
	for _, x := range b {
		count[x]++
	}
	var out []string
	for _, x := range a {
		if count[x] > 0 {
			count[x]--
			continue
		}
		out = append(out, x)
	}
	return out
}

func leakClip(items []string) string {
	if len(items) == 0 {
		return "-"
	}
	if len(items) > 8 {
		return strings.Join(items[:8], ", ") + fmt.Sprintf(" ... (%d more)", len(items)-8)
	}
	return strings.Join(items, ", ")
}

// TestE2EChaosLeakAccounting checks the leak accounting itself: a pod with a running
// container must show up in every count it should (so the chaos tests can catch a
// leak), and removing it must bring every count back.
func TestE2EChaosLeakAccounting(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	// Warm up once, so that what the first pod creates for good (the bridge, the cgroup
	// parent, IPAM's last_reserved_ip, criserver's idle threads) is in the baseline.
	warm := e.podConfig("warm")
	warmID := e.runPod(ctx, warm)
	warmCtr := e.runCtr(ctx, warmID, warm, ctrConfig("warm", img, "sleep", "1000"))
	if _, err := e.execSync(ctx, warmCtr, 10, "true"); err != nil {
		t.Fatalf("exec: %v", err)
	}
	e.stopRemove(ctx, t, warmID)

	before := e.leakSnapshot(t)
	t.Logf("baseline: %v", before)
	pod := e.podConfig("counted")
	// A host port: the portmap plugin's DNAT rules for it are the pod's own iptables
	// rules (crisp masquerades the whole subnet with one rule, so a pod without ports
	// adds none).
	pod.PortMappings = []*cri.PortMapping{{Protocol: cri.Protocol_TCP, ContainerPort: 8080, HostPort: 30000 + int32(time.Now().UnixNano()%20000)}}
	podID := e.runPod(ctx, pod)
	ctr := e.runCtr(ctx, podID, pod, ctrConfig("counted", img, "sleep", "1000"))
	if resp, err := e.execSync(ctx, ctr, 10, "echo", "hi"); err != nil || string(resp.Stdout) != "hi\n" {
		t.Fatalf("exec: %v %v", resp, err)
	}
	during := e.leakSnapshot(t)
	t.Logf("with a pod: %v", during)
	for _, key := range []string{"shim+pause processes", "mounts", "netns pins", "veths", "ipam reservations",
		"iptables rules", "cgroups/memory", "cgroups/unified", "cgroup processes"} {
		if during.counts[key] <= before.counts[key] {
			t.Errorf("a running pod does not show in %q: %d before, %d with the pod", key, before.counts[key], during.counts[key])
		}
	}
	for _, key := range []string{"files/state/sandboxes", "files/state/containers", "files/root/pods", "files/root/images/snapshots"} {
		if during.counts[key] <= before.counts[key] {
			t.Errorf("a running pod does not show in %q: %d before, %d with the pod", key, before.counts[key], during.counts[key])
		}
	}
	if len(before.leaks(during)) == 0 || before.leakedObjects(during) == 0 {
		t.Errorf("leak accounting sees no difference with a pod running")
	}
	if _, err := e.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: ctr, Timeout: 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: ctr}); err != nil {
		t.Fatal(err)
	}
	e.stopRemove(ctx, t, podID)
	after := e.assertNoLeaks(t, before, 5*time.Second)
	t.Logf("after removal: %v", after)
	// And across a restart of criserver (another process: its own figures compared).
	e.kill9()
	e.start()
	e.assertNoLeaks(t, before, 5*time.Second)
}
