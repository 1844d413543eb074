package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// swapOn gives the node swap for the test's life when it has none: a swap file on the
// root filesystem (written with dd, not fallocate: swapon refuses files with
// unwritten extents on some filesystems), turned off and removed at cleanup.
func swapOn(t *testing.T) {
	t.Helper()
	data, err := os.ReadFile("/proc/swaps")
	if err != nil {
		t.Fatalf("no swap support in this kernel: %v", err)
	}
	if strings.Count(strings.TrimSpace(string(data)), "\n") > 0 {
		t.Logf("the node has swap already:\n%s", data)
		return
	}
	file := filepath.Join("/var/tmp", "crisp-node-swap-"+strconv.Itoa(os.Getpid()))
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
	}
	t.Cleanup(func() {
		if out, err := exec.Command("swapoff", file).CombinedOutput(); err != nil && !os.IsNotExist(err) {
			t.Logf("swapoff %s: %v: %s", file, err, out)
		}
		_ = os.Remove(file)
	})
	run("dd", "if=/dev/zero", "of="+file, "bs=1M", "count=192", "status=none")
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	run("mkswap", file)
	run("swapon", file)
}

// TestNodeStatsCAdvisor checks on cgroup v2 (either driver) what cgroup v1 cannot
// show: a container under a CPU quota is throttled in ListPodSandboxMetrics as its
// cpu.stat says; one whose memory limit is below what it reads stalls on reclaim
// (memory PSI); one that writes 48 MiB of tmpfs under a 32 MiB limit with swap allowed
// (the test turns a swap file on) swaps, in ContainerStats.swap and
// container_memory_swap; one that writes with O_DIRECT shows the bytes in io.stat,
// the IO series of the device and IO PSI in the stats. Labels are cAdvisor's, with the
// cgroup paths of the node's driver.
func TestNodeStatsCAdvisor(t *testing.T) {
	e := newNodeEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	img := e.busybox(ctx)
	swapOn(t)
	kp := e.kubeletPod("cadvisor", nil)
	podID := e.runPod(ctx, kp.cfg)
	// Before swapOn's cleanup: the swapped-out pages must go with the pod, not be
	// brought back under the container's limit by swapoff.
	t.Cleanup(func() { _ = stopRemovePod(context.Background(), e.rt, podID) })
	rel := func(dir string) string { return strings.TrimPrefix(dir, "/sys/fs/cgroup") }
	md := kp.cfg.GetMetadata()
	base := func(ctr, id, cg string) []string {
		return []string{ctr, rel(cg), img, id, md.GetNamespace(), md.GetName()}
	}

	busyCfg := ctrConfig("throttled", img, "sh", "-c", "while :; do :; done")
	busyCfg.Linux.Resources = &cri.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 10000}
	busy := e.runCtr(ctx, podID, kp.cfg, busyCfg)
	pressCfg := ctrConfig("pressure", img, "sh", "-c",
		"dd if=/dev/zero of=/big bs=1M count=64 2>/dev/null; while :; do cat /big >/dev/null; done")
	pressCfg.Linux.Resources = &cri.LinuxContainerResources{MemoryLimitInBytes: 16 << 20}
	press := e.runCtr(ctx, podID, kp.cfg, pressCfg)
	swapCfg := ctrConfig("swapper", img, "sh", "-c", "head -c 50331648 /dev/zero >/dev/shm/f; sleep 3600")
	swapCfg.Linux.Resources = &cri.LinuxContainerResources{MemoryLimitInBytes: 32 << 20, MemorySwapLimitInBytes: 160 << 20}
	swapper := e.runCtr(ctx, podID, kp.cfg, swapCfg)
	writer := e.runCtr(ctx, podID, kp.cfg, ctrConfig("writer", img, "sleep", "3600"))
	busyCg, pressCg := procCgroup(t, e.ctrPid(ctx, busy)), procCgroup(t, e.ctrPid(ctx, press))
	swapCg, writerCg := procCgroup(t, e.ctrPid(ctx, swapper)), procCgroup(t, e.ctrPid(ctx, writer))

	majMin, dev := blockDev(t, "/var/lib/crisp")
	ex, err := e.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: writer, Timeout: 120,
		Cmd: []string{"dd", "if=/dev/zero", "of=/written", "bs=1M", "count=8", "oflag=direct"}})
	if err != nil || ex.GetExitCode() != 0 {
		t.Fatalf("dd with O_DIRECT in the container: %v, exit %d: %s", err, ex.GetExitCode(), ex.GetStderr())
	}

	// Wait for the pressure and the swap to build up.
	var pressStats, swapStats *cri.ContainerStats // the last poll's
	deadline := time.Now().Add(2 * time.Minute)
	for {
		p, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: press})
		if err != nil {
			t.Fatal(err)
		}
		s, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: swapper})
		if err != nil {
			t.Fatal(err)
		}
		pressStats, swapStats = p.GetStats(), s.GetStats()
		if pressStats.GetMemory().GetPsi().GetSome().GetTotal() > 0 && swapStats.GetSwap().GetSwapUsageBytes().GetValue() >= 8<<20 &&
			cfsStat(t, rel(busyCg)).throttled >= 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no memory pressure or swap after 2 minutes: pressure %v, swap %v", pressStats.GetMemory(), swapStats.GetSwap())
		}
		time.Sleep(time.Second)
	}

	e.checkThrottling(ctx, podID, busy, rel(busyCg), base("throttled", busy, busyCg))

	// Memory PSI: the stats' total (ns) is what memory.pressure said (µs), read later.
	psiSome := func(cg, file string) uint64 {
		for _, line := range strings.Split(cgroupFile(t, cg, file), "\n") {
			if rest, ok := strings.CutPrefix(line, "some "); ok {
				for _, f := range strings.Fields(rest) {
					if v, ok := strings.CutPrefix(f, "total="); ok {
						n, _ := strconv.ParseUint(v, 10, 64)
						return n * 1000
					}
				}
			}
		}
		t.Fatalf("%s/%s has no some line", cg, file)
		return 0
	}
	mp := pressStats.GetMemory().GetPsi()
	t.Logf("pressure container: memory psi %v (memory.pressure some total now %d ns)", mp, psiSome(pressCg, "memory.pressure"))
	if got, file := mp.GetSome().GetTotal(), psiSome(pressCg, "memory.pressure"); got == 0 || got > file || mp.GetFull() == nil {
		t.Errorf("memory psi some total %d ns, memory.pressure says %d ns later; full %v", got, file, mp.GetFull())
	}
	if pressStats.GetCpu().GetPsi() == nil || pressStats.GetIo().GetPsi() == nil {
		t.Errorf("cpu psi %v, io %v: cgroup v2 has both", pressStats.GetCpu().GetPsi(), pressStats.GetIo())
	}

	// Swap: usage as memory.swap.current, read before and after the call (the kernel
	// may still be swapping the tmpfs out); available = memory.swap.max (160 - 32
	// MiB) - usage.
	swapBefore := uint64(cgroupInt(t, swapCg, "memory.swap.current"))
	s, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: swapper})
	if err != nil {
		t.Fatal(err)
	}
	swapAfter := uint64(cgroupInt(t, swapCg, "memory.swap.current"))
	sw := s.GetStats().GetSwap()
	t.Logf("swapper: swap %v (memory.swap.current %d before, %d after; memory.swap.max %s)", sw, swapBefore, swapAfter, cgroupFile(t, swapCg, "memory.swap.max"))
	if u := sw.GetSwapUsageBytes().GetValue(); u < 8<<20 || u < min(swapBefore, swapAfter) || u > max(swapBefore, swapAfter) {
		t.Errorf("swap usage %d, memory.swap.current %d before and %d after", u, swapBefore, swapAfter)
	}
	if got := sw.GetSwapUsageBytes().GetValue() + sw.GetSwapAvailableBytes().GetValue(); got != 128<<20 {
		t.Errorf("swap usage + available = %d, want memory.swap.max %d", got, 128<<20)
	}

	descs := e.descriptors(ctx)
	pm := e.podSandboxMetrics(ctx, podID)
	sm := metricSeries(t, descs, containerSeries(pm, swapper), base("swapper", swapper, swapCg))
	if v := sm["container_memory_swap{}"]; v < 8<<20 {
		t.Errorf("container_memory_swap = %d, want the swapped tmpfs", v)
	}
	pmm := metricSeries(t, descs, containerSeries(pm, press), base("pressure", press, pressCg))
	if _, ok := pmm["container_pressure_memory_waiting_seconds_total{}"]; !ok {
		t.Errorf("no container_pressure_memory_waiting_seconds_total: %v", pmm)
	}
	w := metricSeries(t, descs, containerSeries(pm, writer), base("writer", writer, writerCg))
	pod := metricSeries(t, descs, pm.GetMetrics(), []string{"", rel(kp.cgroup), "", "", md.GetNamespace(), md.GetName()})
	fileW := ioWritten(t, rel(writerCg), majMin)
	t.Logf("device %s (%s): writer %d bytes (io.stat %d), pod %d; io psi waiting %d s",
		dev, majMin, w["container_fs_writes_bytes_total{"+dev+"}"], fileW, pod["container_fs_writes_bytes_total{"+dev+"}"],
		w["container_pressure_io_waiting_seconds_total{}"])
	for who, s := range map[string]map[string]uint64{"writer": w, "pod": pod} {
		if v := s["container_fs_writes_bytes_total{"+dev+"}"]; v < 8<<20 {
			t.Errorf("%s: container_fs_writes_bytes_total{%s} = %d, want the 8 MiB written with O_DIRECT", who, dev, v)
		}
		if _, ok := s["container_pressure_io_waiting_seconds_total{}"]; !ok {
			t.Errorf("%s: no container_pressure_io_waiting_seconds_total", who)
		}
	}
	if v := w["container_fs_writes_bytes_total{"+dev+"}"]; v > fileW {
		t.Errorf("writer's container_fs_writes_bytes_total %d is above io.stat's %d read later", v, fileW)
	}
	ws, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: writer})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := e.rt.PodSandboxStats(ctx, &cri.PodSandboxStatsRequest{PodSandboxId: podID})
	if err != nil {
		t.Fatal(err)
	}
	if ws.GetStats().GetIo().GetPsi().GetSome() == nil || ps.GetStats().GetLinux().GetIo().GetPsi().GetSome() == nil {
		t.Errorf("io psi: container %v, pod %v", ws.GetStats().GetIo(), ps.GetStats().GetLinux().GetIo())
	}
	e.stopRemove(ctx, t, podID)
}
