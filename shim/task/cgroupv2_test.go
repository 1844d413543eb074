package task

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/crisp-runtime/crisp/internal/cgstats"
	"github.com/crisp-runtime/crisp/internal/cgstats/v2test"
)

// memoryEvents is memory.events as a v2 kernel writes it.
func memoryEvents(max, oom, oomKill int) string {
	return fmt.Sprintf("low 0\nhigh 0\nmax %d\noom %d\noom_kill %d\noom_group_kill 0\n", max, oom, oomKill)
}

// TestOOMWatchV2 drives the v2 OOM watch over a memory.events file in a v2 node's
// layout: the kernel's notification of a change to memory.events is an inotify
// IN_MODIFY, which a write to a plain file also produces. A kill is an oom_kill count
// above the one at the container's start; other memory events (max, oom without a
// kill) are not.
func TestOOMWatchV2(t *testing.T) {
	for _, tc := range []struct {
		name   string
		start  string   // memory.events when the watch starts
		writes []string // what the kernel writes next, in order
		kill   bool     // onKill must have run (once) after the last write
	}{
		{"kill", memoryEvents(0, 0, 0), []string{memoryEvents(3, 1, 1)}, true},
		{"limit hit, reclaimed, no kill", memoryEvents(0, 0, 0), []string{memoryEvents(5, 0, 0), memoryEvents(9, 1, 0)}, false},
		// The counter is hierarchical and cumulative: kills before the start (an earlier
		// container in the cgroup) are not this container's.
		{"kills before the start", memoryEvents(4, 2, 2), []string{memoryEvents(6, 2, 2)}, false},
		{"kill after earlier kills", memoryEvents(4, 2, 2), []string{memoryEvents(6, 2, 2), memoryEvents(7, 3, 3)}, true},
		{"two kills report once", memoryEvents(0, 0, 0), []string{memoryEvents(1, 1, 1), memoryEvents(2, 2, 2)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := v2test.New(t)
			dir := node.Mkdir("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/crisp-c1.scope")
			node.Write(dir, map[string]string{"memory.events": tc.start})
			var kills atomic.Int32
			w, err := watchOOMIn(dir, true, discard(), func() { kills.Add(1) })
			if err != nil {
				t.Fatal(err)
			}
			defer w.stop()
			if w.file != filepath.Join(dir, "memory.events") {
				t.Errorf("watching %s", w.file)
			}
			for _, content := range tc.writes {
				node.Write(dir, map[string]string{"memory.events": content})
			}
			want := int32(0)
			if tc.kill {
				want = 1
			}
			// The event is read by a goroutine: wait for the kill, or long enough that
			// a wrong one would have shown.
			deadline := time.Now().Add(500 * time.Millisecond)
			if tc.kill {
				deadline = time.Now().Add(5 * time.Second)
			}
			for time.Now().Before(deadline) && kills.Load() < want {
				time.Sleep(5 * time.Millisecond)
			}
			if tc.kill {
				time.Sleep(50 * time.Millisecond) // a second call would come now
			}
			if got := kills.Load(); got != want {
				t.Errorf("onKill ran %d times, want %d", got, want)
			}
			// check (what Wait/State/ContainerInfo use at exit) agrees.
			if got := w.check(); got != tc.kill {
				t.Errorf("check = %v, want %v", got, tc.kill)
			}
			// The cgroup removed after the exit: what was seen stays.
			if err := os.Remove(filepath.Join(dir, "memory.events")); err != nil {
				t.Fatal(err)
			}
			if got := w.check(); got != tc.kill {
				t.Errorf("check after the cgroup is gone = %v, want %v", got, tc.kill)
			}
		})
	}
}

// TestOOMWatchV2CheckWithoutEvent: a kill is seen at exit even when the inotify event
// has not been read yet (check reads the counter itself).
func TestOOMWatchV2CheckWithoutEvent(t *testing.T) {
	node := v2test.New(t)
	dir := node.Mkdir("/crisp/crisp-c1")
	node.Write(dir, map[string]string{"memory.events": memoryEvents(0, 0, 0)})
	w, err := watchOOMIn(dir, true, discard(), func() {})
	if err != nil {
		t.Fatal(err)
	}
	w.stop() // no event will be read
	node.Write(dir, map[string]string{"memory.events": memoryEvents(1, 1, 1)})
	if !w.check() {
		t.Error("check missed the kill")
	}
}

// TestOOMWatchReportsKillSeenAtExit: when the exit reads the counter before the event
// reader does (a container killed at once, as a memory hog is), the kill is still
// reported, once: containerd before 2.4 learns of it only from the TaskOOM event
// that onKill publishes (containerd 2.2.9 reported such a container as Error).
func TestOOMWatchReportsKillSeenAtExit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ownGone  bool // the container's memory.events is gone at exit (systemd scope)
		wantKill bool
	}{
		{"own counter", false, true},
		{"own counter gone, the pod's counted it", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := v2test.New(t)
			pod := node.Mkdir("/pod")
			node.Write(pod, map[string]string{"memory.events": memoryEvents(0, 0, 0)})
			dir := node.Mkdir("/pod/crisp-c1")
			node.Write(dir, map[string]string{"memory.events": memoryEvents(0, 0, 0)})
			var kills atomic.Int32
			w, err := watchOOMIn(dir, true, discard(), func() { kills.Add(1) })
			if err != nil {
				t.Fatal(err)
			}
			w.stop() // the event is never read: the exit sees the kill first
			node.Write(pod, map[string]string{"memory.events": memoryEvents(1, 1, 1)})
			if tc.ownGone {
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
			} else {
				node.Write(dir, map[string]string{"memory.events": memoryEvents(1, 1, 1)})
			}
			if got := w.checkExit(true); got != tc.wantKill {
				t.Fatalf("checkExit = %v, want %v", got, tc.wantKill)
			}
			w.checkExit(true)
			if got := kills.Load(); got != 1 {
				t.Errorf("onKill ran %d times, want once", got)
			}
		})
	}
}

// TestOOMWatchV2ScopeGoneAtExit: under the systemd driver the container's scope (and
// its memory.events) may be gone before the exit is checked, the event unread. The
// pod's memory.events, which counts its children's kills, then decides, but only for
// an init that died of SIGKILL.
func TestOOMWatchV2ScopeGoneAtExit(t *testing.T) {
	for _, tc := range []struct {
		name          string
		parentBefore  int // the pod's oom_kill at the container's start
		parentAtExit  int
		sigkill, want bool
	}{
		{"killed by the OOM killer", 1, 2, true, true},
		{"SIGKILL, no kill in the pod", 1, 1, true, false},
		{"exited by itself while a sibling was OOM-killed", 1, 2, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := v2test.New(t)
			pod := node.Mkdir("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice")
			node.Write(pod, map[string]string{"memory.events": memoryEvents(0, tc.parentBefore, tc.parentBefore)})
			dir := node.Mkdir("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/crisp-c1.scope")
			node.Write(dir, map[string]string{"memory.events": memoryEvents(0, 0, 0)})
			w, err := watchOOMIn(dir, true, discard(), func() {})
			if err != nil {
				t.Fatal(err)
			}
			w.stop() // the event is never read
			node.Write(pod, map[string]string{"memory.events": memoryEvents(0, tc.parentAtExit, tc.parentAtExit)})
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if got := w.checkExit(tc.sigkill); got != tc.want {
				t.Errorf("checkExit = %v, want %v", got, tc.want)
			}
		})
	}
	// With its own counter readable, the container's decides, not the pod's.
	node := v2test.New(t)
	pod := node.Mkdir("/pod")
	node.Write(pod, map[string]string{"memory.events": memoryEvents(0, 0, 0)})
	dir := node.Mkdir("/pod/crisp-c1")
	node.Write(dir, map[string]string{"memory.events": memoryEvents(0, 0, 0)})
	w, err := watchOOMIn(dir, true, discard(), func() {})
	if err != nil {
		t.Fatal(err)
	}
	w.stop()
	node.Write(pod, map[string]string{"memory.events": memoryEvents(0, 1, 1)})
	if w.checkExit(true) {
		t.Error("a sibling's kill counted although the container's own counter shows none")
	}
}

// TestOOMWatchV2NoMemoryController: without the memory controller enabled for the
// cgroup there is no memory.events; the watch fails (the caller logs it and goes on
// without one) instead of watching nothing.
func TestOOMWatchV2NoMemoryController(t *testing.T) {
	node := v2test.New(t)
	dir := node.Mkdir("/crisp/crisp-c1")
	if w, err := watchOOMIn(dir, true, discard(), func() {}); err == nil {
		w.stop()
		t.Fatal("watch of a cgroup without memory.events started")
	}
}

func u64(v uint64) *uint64 { return &v }
func i64(v int64) *int64   { return &v }

// TestV2ResourceFiles follows a container's OCI resources (as crisp's internal/cri/spec makes
// them from the CRI's LinuxContainerResources, see internal/cri/spec's TestCgroupV2Resources)
// through the shim's libcontainer config into the files libcontainer's cgroup v2
// manager writes, in a v2 node's layout. libcontainer converts cpu shares to cpu.weight
// and memory+swap to memory.swap.max; crisp relies on that and must not do it twice.
func TestV2ResourceFiles(t *testing.T) {
	cgroups.TestMode = true // write plain files instead of requiring cgroupfs
	t.Cleanup(func() { cgroups.TestMode = false })
	for _, tc := range []struct {
		name string
		res  *specs.LinuxResources
		want map[string]string // file → content; "" = must not be written
	}{
		{"burstable: 250m request, 500m limit, 256Mi", &specs.LinuxResources{
			CPU:    &specs.LinuxCPU{Shares: u64(256), Quota: i64(50000), Period: u64(100000)},
			Memory: &specs.LinuxMemory{Limit: i64(256 << 20), Swap: i64(256 << 20)},
		}, map[string]string{
			"cpu.max": "50000 100000", "cpu.weight": "35", "memory.max": "268435456",
			// swap = limit: no swap at all
			"memory.swap.max": "0", "pids.max": "",
		}},
		{"default shares", &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(1024)}},
			map[string]string{"cpu.weight": "100", "cpu.max": "", "memory.max": ""}},
		{"besteffort: minimum shares", &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(2)}},
			map[string]string{"cpu.weight": "1"}},
		{"maximum shares", &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(262144)}},
			map[string]string{"cpu.weight": "10000"}},
		{"100m", &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(102), Quota: i64(10000)}},
			map[string]string{"cpu.weight": "17", "cpu.max": "10000 100000"}},
		{"unlimited quota", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(-1), Period: u64(100000)}},
			map[string]string{"cpu.max": "max 100000"}},
		{"swap limit above memory", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(128 << 20), Swap: i64(192 << 20)}},
			map[string]string{"memory.max": "134217728", "memory.swap.max": "67108864"}},
		{"unlimited swap", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(128 << 20), Swap: i64(-1)}},
			map[string]string{"memory.max": "134217728", "memory.swap.max": "max"}},
		{"pids", &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: i64(1024)}},
			map[string]string{"pids.max": "1024"}},
		{"pids unlimited", &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: i64(-1)}},
			map[string]string{"pids.max": "max"}},
		{"hugepages", &specs.LinuxResources{HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 4 << 20}, {Pagesize: "1GB", Limit: 0}}},
			map[string]string{"hugetlb.2MB.max": "4194304", "hugetlb.2MB.rsvd.max": "4194304", "hugetlb.1GB.max": "0"}},
		// kubelet's unified settings (memory.oom.group for a whole-container OOM kill,
		// memory.high from MemoryQoS) are written as they are.
		{"unified", &specs.LinuxResources{Unified: map[string]string{"memory.oom.group": "1", "memory.high": "201326592"}},
			map[string]string{"memory.oom.group": "1", "memory.high": "201326592"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &specs.Spec{
				Version: specs.Version,
				Root:    &specs.Root{Path: "rootfs"},
				Process: &specs.Process{Args: []string{"true"}, Cwd: "/"},
				Linux:   &specs.Linux{CgroupsPath: "kubepods-burstable-podx.slice:crisp:c1", Resources: tc.res},
			}
			cfg, err := libcontainerConfig("c1", t.TempDir(), spec)
			if err != nil {
				t.Fatal(err)
			}
			node := v2test.New(t)
			dir := node.Mkdir("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/crisp-c1.scope")
			r := cfg.Cgroups.Resources
			r.Devices, r.SkipDevices = nil, true // device rules are eBPF, not files
			m, err := fs2.NewManager(cfg.Cgroups, dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Set(r); err != nil {
				t.Fatal(err)
			}
			for file, want := range tc.want {
				if got := node.Read(dir, file); got != want {
					t.Errorf("%s = %q, want %q", file, got, want)
				}
			}
		})
	}
}

// TestContainerCgroupSystemd: the container's cgroupsPath from internal/cri/spec
// ("<pod slice>:crisp:<id>") makes libcontainer use the systemd driver with that slice,
// prefix and name, and the stats are read from the scope libcontainer makes.
func TestContainerCgroupSystemd(t *testing.T) {
	const pod = "kubepods-burstable-pod0c4f1ad3_5a7e_4b1e_9e43_2b1f0d6a7c11.slice"
	for _, tc := range []struct {
		cgPath  string
		systemd bool
		rel     string
	}{
		{pod + ":crisp:c1", true, "/kubepods.slice/kubepods-burstable.slice/" + pod + "/crisp-c1.scope"},
		{"system.slice:crisp:c1", true, "/system.slice/crisp-c1.scope"},
		{"/kubepods/burstable/podx/crisp-c1", false, "/kubepods/burstable/podx/crisp-c1"},
	} {
		spec := &specs.Spec{
			Version: specs.Version,
			Root:    &specs.Root{Path: "rootfs"},
			Process: &specs.Process{Args: []string{"true"}, Cwd: "/"},
			Linux:   &specs.Linux{CgroupsPath: tc.cgPath},
		}
		cfg, err := libcontainerConfig("c1", t.TempDir(), spec)
		if err != nil {
			t.Fatal(err)
		}
		cg := cfg.Cgroups
		if cg.Systemd != tc.systemd {
			t.Errorf("%s: systemd = %v", tc.cgPath, cg.Systemd)
		}
		// What container.cgroup does.
		rel, err := cgstats.RelPath(cg.Systemd, cg.Path, cg.Parent, cg.ScopePrefix, cg.Name)
		if err != nil || rel != tc.rel {
			t.Errorf("%s: stats from %q, %v; want %q", tc.cgPath, rel, err, tc.rel)
		}
		node := v2test.New(t)
		node.Write(node.Mkdir(tc.rel), v2test.Busy)
		c, err := cgstats.LoadV2(node.Root, rel)
		if err != nil {
			t.Errorf("%s: %v", tc.cgPath, err)
			continue
		}
		if _, err := c.Read(); err != nil {
			t.Errorf("%s: %v", tc.cgPath, err)
		}
	}
}
