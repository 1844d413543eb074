package cgstats

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	cg1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	cg2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs2"
	"github.com/opencontainers/cgroups/systemd"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/crisp-runtime/crisp/internal/cgstats/v2test"
	"github.com/crisp-runtime/crisp/internal/testutil"
)

const (
	podUID = "0c4f1ad3_5a7e_4b1e_9e43_2b1f0d6a7c11" // kubelet's systemd names use _ for -
	ctrID  = "5d3b5e8f0a2c"
	// podSlice is the cgroup_parent kubelet's systemd driver gives a Burstable pod.
	podSlice = "kubepods-burstable-pod" + podUID + ".slice"
	// podSliceDir is where systemd puts it: every dash-separated prefix is a parent.
	podSliceDir = "/kubepods.slice/kubepods-burstable.slice/" + podSlice
)

func readV2(t *testing.T, c *Cgroup) *cg2.Metrics {
	t.Helper()
	a, err := c.Read()
	if err != nil {
		t.Fatal(err)
	}
	if a.GetTypeUrl() != "io.containerd.cgroups.v2.Metrics" {
		t.Fatalf("type URL %q", a.GetTypeUrl())
	}
	var m cg2.Metrics
	if err := proto.Unmarshal(a.GetValue(), &m); err != nil {
		t.Fatal(err)
	}
	return &m
}

// TestReadV2 reads a container cgroup in a v2 node's layout (the systemd driver's
// scope in kubelet's pod slice) and checks every figure crisp passes on.
func TestReadV2(t *testing.T) {
	node := v2test.New(t)
	rel := podSliceDir + "/crisp-" + ctrID + ".scope"
	node.Write(node.Mkdir(rel), v2test.Busy)

	c, err := LoadV2(node.Root, rel)
	if err != nil {
		t.Fatal(err)
	}
	if c.Path() != rel {
		t.Errorf("Path = %q", c.Path())
	}
	m := readV2(t, c)
	for _, f := range []struct {
		name      string
		got, want uint64
	}{
		{"cpu.stat usage_usec", m.GetCPU().GetUsageUsec(), 2_500_000},
		{"cpu.stat user_usec", m.GetCPU().GetUserUsec(), 2_000_000},
		{"cpu.stat system_usec", m.GetCPU().GetSystemUsec(), 500_000},
		{"cpu.stat nr_periods", m.GetCPU().GetNrPeriods(), 100},
		{"cpu.stat nr_throttled", m.GetCPU().GetNrThrottled(), 5},
		{"cpu.stat throttled_usec", m.GetCPU().GetThrottledUsec(), 12345},
		{"cpu.pressure some total", m.GetCPU().GetPSI().GetSome().GetTotal(), 2000},
		{"memory.current", m.GetMemory().GetUsage(), 100 << 20},
		{"memory.max", m.GetMemory().GetUsageLimit(), 256 << 20},
		{"memory.peak", m.GetMemory().GetMaxUsage(), 128 << 20},
		{"memory.stat anon", m.GetMemory().GetAnon(), 60 << 20},
		{"memory.stat file", m.GetMemory().GetFile(), 40 << 20},
		{"memory.stat inactive_file", m.GetMemory().GetInactiveFile(), 30 << 20},
		{"memory.stat active_file", m.GetMemory().GetActiveFile(), 10 << 20},
		{"memory.stat pgfault", m.GetMemory().GetPgfault(), 1000},
		{"memory.stat pgmajfault", m.GetMemory().GetPgmajfault(), 7},
		{"memory.swap.current", m.GetMemory().GetSwapUsage(), 8 << 20},
		{"memory.swap.max", m.GetMemory().GetSwapLimit(), 64 << 20},
		{"memory.pressure some total", m.GetMemory().GetPSI().GetSome().GetTotal(), 1500},
		{"memory.pressure full total", m.GetMemory().GetPSI().GetFull().GetTotal(), 700},
		{"cpu.pressure full total", m.GetCPU().GetPSI().GetFull().GetTotal(), 900},
		{"io.pressure some total", m.GetIo().GetPSI().GetSome().GetTotal(), 3000},
		{"io.pressure full total", m.GetIo().GetPSI().GetFull().GetTotal(), 2500},
		{"memory.events max", m.GetMemoryEvents().GetMax(), 12},
		{"memory.events oom", m.GetMemoryEvents().GetOom(), 2},
		{"memory.events oom_kill", m.GetMemoryEvents().GetOomKill(), 1},
		{"pids.current", m.GetPids().GetCurrent(), 3},
		{"pids.max", m.GetPids().GetLimit(), 1024},
	} {
		if f.got != f.want {
			t.Errorf("%s = %d, want %d", f.name, f.got, f.want)
		}
	}
	if got := m.GetCPU().GetPSI().GetSome().GetAvg10(); got != 1.5 {
		t.Errorf("cpu.pressure some avg10 = %v, want 1.5", got)
	}
	if got := m.GetIo().GetPSI().GetFull().GetAvg60(); got != 0.04 {
		t.Errorf("io.pressure full avg60 = %v, want 0.04", got)
	}
	io := m.GetIo().GetUsage()
	if len(io) != 2 || io[0].GetMajor() != 8 || io[0].GetMinor() != 0 || io[0].GetRbytes() != 1<<20 ||
		io[0].GetWbytes() != 4096 || io[0].GetRios() != 10 || io[0].GetWios() != 1 ||
		io[1].GetMajor() != 253 || io[1].GetMinor() != 1 || io[1].GetRbytes() != 512 {
		t.Errorf("io.stat = %v", io)
	}
	// hugetlb and rdma cost a read per page size / device on every call and no CRI
	// field carries them: crisp leaves them out (v2Mask).
	if m.GetHugetlb() != nil || m.GetRdma() != nil {
		t.Errorf("hugetlb %v, rdma %v: not asked for", m.GetHugetlb(), m.GetRdma())
	}
}

// TestReadV2Unlimited: "max" in memory.max and pids.max reads as MaxUint64 (what the
// controller takes for "no limit"); a cgroup without the memory controller enabled
// (no memory.* files) reads as empty rather than failing.
func TestReadV2Unlimited(t *testing.T) {
	node := v2test.New(t)
	dir := node.Mkdir("/crisp/crisp-" + ctrID)
	node.Write(dir, v2test.Busy)
	node.Write(dir, map[string]string{"memory.max": "max\n", "pids.max": "max\n"})
	c, err := LoadV2(node.Root, "/crisp/crisp-"+ctrID)
	if err != nil {
		t.Fatal(err)
	}
	m := readV2(t, c)
	if m.GetMemory().GetUsageLimit() != math.MaxUint64 || m.GetPids().GetLimit() != math.MaxUint64 {
		t.Errorf("memory limit %d, pids limit %d: want MaxUint64", m.GetMemory().GetUsageLimit(), m.GetPids().GetLimit())
	}

	bare := node.Mkdir("/crisp/crisp-bare")
	node.Write(bare, map[string]string{"cpu.stat": "usage_usec 7\n"})
	c, err = LoadV2(node.Root, "/crisp/crisp-bare")
	if err != nil {
		t.Fatal(err)
	}
	m = readV2(t, c)
	if m.GetCPU().GetUsageUsec() != 7 || m.GetMemory().GetUsage() != 0 || m.GetMemoryEvents() != nil {
		t.Errorf("cgroup without memory files: %v", m)
	}
	// No *.pressure files (a kernel without CONFIG_PSI): no PSI rather than zeros.
	if m.GetCPU().GetPSI() != nil || m.GetMemory().GetPSI() != nil || m.GetIo().GetPSI() != nil {
		t.Errorf("cgroup without pressure files has PSI: %v", m)
	}
}

// TestV2Gone: cgroup2 itself neither checks that a cgroup exists when loading it nor
// fails reading a removed one (every missing file reads as 0), so crisp checks: a
// container or pod whose cgroup is gone is NotFound/FailedPrecondition, not all zeros.
func TestV2Gone(t *testing.T) {
	node := v2test.New(t)
	if _, err := LoadV2(node.Root, "/crisp/crisp-none"); !errors.Is(err, ErrGone) {
		t.Errorf("load of a missing cgroup: %v, want ErrGone", err)
	}
	// A plain directory is no cgroup either.
	if err := os.MkdirAll(node.Root+"/plain", 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadV2(node.Root, "/plain"); !errors.Is(err, ErrGone) {
		t.Errorf("load of a directory without cgroup.procs: %v, want ErrGone", err)
	}

	dir := node.Mkdir("/crisp/crisp-" + ctrID)
	node.Write(dir, v2test.Busy)
	c, err := LoadV2(node.Root, "/crisp/crisp-"+ctrID)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if a, err := c.Read(); !errors.Is(err, ErrGone) {
		t.Errorf("read of a removed cgroup = %v, %v; want ErrGone", a, err)
	}
	if _, err := LoadV2(node.Root, "crisp/x"); err == nil || errors.Is(err, ErrGone) {
		t.Errorf("relative path: %v, want a plain error", err)
	}
}

// TestRelPath checks the cgroup crisp reads stats from against the path libcontainer's
// own v2 managers put the cgroup at (their Path needs neither dbus nor a v2 host), for
// both drivers, and the systemd slice expansion against systemd.ExpandSlice's rules.
func TestRelPath(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		systemd                  bool
		cgPath, slice, pfx, unit string
		want, wantErr            string
	}{
		{name: "cgroupfs", cgPath: "/kubepods/burstable/pod" + podUID + "/crisp-" + ctrID,
			want: "/kubepods/burstable/pod" + podUID + "/crisp-" + ctrID},
		{name: "cgroupfs default parent", cgPath: "/crisp/crisp-" + ctrID, want: "/crisp/crisp-" + ctrID},
		{name: "cgroupfs relative", cgPath: "crisp/x", wantErr: "not absolute"},
		{name: "cgroupfs empty", cgPath: "", wantErr: "not absolute"},
		{name: "systemd container scope", systemd: true, slice: podSlice, pfx: "crisp", unit: ctrID,
			want: podSliceDir + "/crisp-" + ctrID + ".scope"},
		{name: "systemd besteffort", systemd: true, slice: "kubepods-besteffort-pod" + podUID + ".slice", pfx: "crisp", unit: ctrID,
			want: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + podUID + ".slice/crisp-" + ctrID + ".scope"},
		{name: "systemd guaranteed", systemd: true, slice: "kubepods-pod" + podUID + ".slice", pfx: "crisp", unit: ctrID,
			want: "/kubepods.slice/kubepods-pod" + podUID + ".slice/crisp-" + ctrID + ".scope"},
		{name: "systemd default slice", systemd: true, slice: "system.slice", pfx: "crisp", unit: ctrID,
			want: "/system.slice/crisp-" + ctrID + ".scope"},
		{name: "systemd no slice", systemd: true, slice: "", pfx: "crisp", unit: ctrID,
			want: "/system.slice/crisp-" + ctrID + ".scope"},
		{name: "systemd root slice", systemd: true, slice: "-.slice", pfx: "crisp", unit: ctrID,
			want: "/crisp-" + ctrID + ".scope"},
		{name: "systemd unit is a slice", systemd: true, slice: "kubepods-burstable.slice", unit: podSlice,
			want: "/kubepods.slice/kubepods-burstable.slice/" + podSlice},
		{name: "systemd the slice itself", systemd: true, slice: podSlice, want: podSliceDir},
		// libcontainer names the scope "-x.scope" without a prefix and adds .scope to
		// a name that has it: crisp must read where libcontainer put the cgroup.
		{name: "systemd no prefix", systemd: true, slice: "system.slice", unit: "x",
			want: "/system.slice/-x.scope"},
		{name: "systemd name ends in .scope", systemd: true, slice: "system.slice", pfx: "crisp", unit: "x.scope",
			want: "/system.slice/crisp-x.scope.scope"},
		{name: "systemd double dash", systemd: true, slice: "kubepods--burstable.slice", pfx: "crisp", unit: ctrID, wantErr: "invalid slice name"},
		{name: "systemd leading dash", systemd: true, slice: "-kubepods.slice", pfx: "crisp", unit: ctrID, wantErr: "invalid slice name"},
		{name: "systemd not a slice", systemd: true, slice: "kubepods", pfx: "crisp", unit: ctrID, wantErr: "invalid slice name"},
		{name: "systemd slash", systemd: true, slice: "a/b.slice", pfx: "crisp", unit: ctrID, wantErr: "invalid slice name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RelPath(tc.systemd, tc.cgPath, tc.slice, tc.pfx, tc.unit)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("RelPath = %q, %v; want error %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("RelPath = %q, %v; want %q", got, err, tc.want)
			}
			if tc.systemd && tc.unit == "" {
				return // the pod's slice: crisp's metrics cgroup, not a libcontainer one
			}
			// What libcontainer does on a v2 node with the same config.
			cg := &cgroups.Cgroup{Resources: &cgroups.Resources{}}
			var lc string
			if tc.systemd {
				cg.Systemd, cg.Parent, cg.ScopePrefix, cg.Name = true, tc.slice, tc.pfx, tc.unit
				m, err := systemd.NewUnifiedManager(cg, "")
				if err != nil {
					t.Fatal(err)
				}
				lc = m.Path("")
			} else {
				cg.Path = tc.cgPath
				m, err := fs2.NewManager(cg, "")
				if err != nil {
					t.Fatal(err)
				}
				lc = m.Path("")
			}
			if lc != fs2.UnifiedMountpoint+tc.want && !(tc.want == "/" && lc == fs2.UnifiedMountpoint) {
				t.Errorf("libcontainer's v2 path is %q, crisp reads %q", lc, tc.want)
			}
		})
	}
}

// TestLoadV2RealKernel runs LoadV2 and Read against the kernel's cgroup2 (on this
// hybrid host the unified hierarchy at /sys/fs/cgroup/unified holds no controller the
// v1 hierarchies have, but every v2 cgroup has cpu.stat and cgroup.procs): the CPU time
// of a process moved into a new cgroup is read from the kernel's own cpu.stat, and a
// cgroup removed with rmdir is ErrGone. Needs root and a cgroup2 mount; skipped
// otherwise.
func TestLoadV2RealKernel(t *testing.T) {
	mnt := "/sys/fs/cgroup/unified"
	if cgroups.IsCgroup2UnifiedMode() {
		mnt = UnifiedMountpoint
	}
	var st unix.Statfs_t
	testutil.RequiresRoot(t, "creates a cgroup under "+mnt)
	if unix.Statfs(mnt, &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Skip("needs a cgroup2 mount at " + mnt)
	}
	rel := "/crisp-cgstats-test-" + strconv.Itoa(os.Getpid())
	dir := mnt + rel
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(dir)
	spin := exec.Command("sh", "-c", "while :; do :; done")
	if err := spin.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = spin.Process.Kill()
		_ = spin.Wait()
	}()
	if err := os.WriteFile(dir+"/cgroup.procs", []byte(strconv.Itoa(spin.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	c, err := LoadV2(mnt, rel)
	if err != nil {
		t.Fatal(err)
	}
	var usage uint64
	for range 100 {
		if usage = readV2(t, c).GetCPU().GetUsageUsec(); usage >= 50_000 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if usage < 50_000 {
		t.Errorf("cpu.stat usage_usec = %d after a spinning process ran in the cgroup", usage)
	}
	if err := spin.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = spin.Wait()
	// The cgroup can be removed once the killed process is gone from it.
	for i := 0; ; i++ {
		if err := os.Remove(dir); err == nil {
			break
		} else if i == 100 {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.Read(); !errors.Is(err, ErrGone) {
		t.Errorf("read after rmdir: %v, want ErrGone", err)
	}
	if _, err := LoadV2(mnt, rel); !errors.Is(err, ErrGone) {
		t.Errorf("load after rmdir: %v, want ErrGone", err)
	}
}

// TestV1BlkioRecursiveRealKernel writes 8 MiB with O_DIRECT from a process in a child
// blkio cgroup and reads the parent with Load and Read, as the shim reads a pod's
// cgroup_parent: the bytes show on the parent (the _recursive throttle files), on the
// device of the file written. Linux (since 6.10) keeps cgroup v1 blkio statistics of
// a device only once some cgroup has had a throttle rule on it, so the test sets a
// rule no write reaches on the child first, and removes it. Needs root and the v1
// blkio hierarchy; skipped otherwise.
func TestV1BlkioRecursiveRealKernel(t *testing.T) {
	const blkio = "/sys/fs/cgroup/blkio"
	testutil.RequiresRoot(t, "creates cgroups under "+blkio)
	if _, err := os.Stat(blkio + "/blkio.throttle.io_service_bytes_recursive"); err != nil {
		t.Skip("needs the cgroup v1 blkio hierarchy with recursive throttle files")
	}
	scratch := t.TempDir()
	var st unix.Stat_t
	if err := unix.Stat(scratch, &st); err != nil {
		t.Fatal(err)
	}
	dev := strconv.FormatUint(uint64(unix.Major(st.Dev)), 10) + ":" + strconv.FormatUint(uint64(unix.Minor(st.Dev)), 10)
	if _, err := os.Stat("/sys/dev/block/" + dev); err != nil {
		t.Skipf("%s is on no block device (%s)", scratch, dev)
	}
	parent := "/crisp-cgstats-blkio-" + strconv.Itoa(os.Getpid())
	child := parent + "/ctr"
	if err := os.MkdirAll(blkio+child, 0o755); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = os.WriteFile(blkio+child+"/blkio.throttle.write_bps_device", []byte(dev+" 0"), 0)
		_ = os.Remove(blkio + child)
		_ = os.Remove(blkio + parent)
	}()
	if err := os.WriteFile(blkio+child+"/blkio.throttle.write_bps_device", []byte(dev+" 1099511627776"), 0); err != nil {
		t.Fatal(err)
	}
	dd := exec.Command("sh", "-c", `echo $$ > `+blkio+child+`/cgroup.procs && exec busybox dd if=/dev/zero of=`+scratch+`/f bs=1M count=8 oflag=direct`)
	if out, err := dd.CombinedOutput(); err != nil {
		t.Fatalf("dd: %v: %s", err, out)
	}
	c, err := Load(parent)
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Read()
	if err != nil {
		t.Fatal(err)
	}
	var m cg1.Metrics
	if err := proto.Unmarshal(a.GetValue(), &m); err != nil {
		t.Fatal(err)
	}
	var written, writes uint64
	for _, e := range m.GetBlkio().GetIoServiceBytesRecursive() {
		if e.GetOp() == "Write" && strconv.FormatUint(e.GetMajor(), 10)+":"+strconv.FormatUint(e.GetMinor(), 10) == dev {
			written = e.GetValue()
		}
	}
	for _, e := range m.GetBlkio().GetIoServicedRecursive() {
		if e.GetOp() == "Write" && strconv.FormatUint(e.GetMajor(), 10)+":"+strconv.FormatUint(e.GetMinor(), 10) == dev {
			writes = e.GetValue()
		}
	}
	t.Logf("parent %s on %s: %d bytes in %d writes", parent, dev, written, writes)
	if written < 8<<20 || written > 9<<20 || writes == 0 {
		t.Errorf("parent cgroup wrote %d bytes in %d operations on %s, want the child's 8 MiB", written, writes, dev)
	}
}
