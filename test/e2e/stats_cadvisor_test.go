package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The stats and metrics kubelet's embedded cAdvisor would report, checked against the
// kernel's own files: CFS throttling, IO per device, PSI and swap (docs/stats.md).

// kv reads the "key value" lines of a cgroup file (cpu.stat, memory.stat).
func kv(t *testing.T, path string) map[string]uint64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			out[k] = n
		}
	}
	return out
}

// cfs is a cgroup's CFS bandwidth counters.
type cfs struct{ periods, throttled, throttledNs uint64 }

// cfsStat reads cpu.stat of the cgroup at rel: v1 counts throttled_time in ns, v2
// throttled_usec.
func cfsStat(t *testing.T, rel string) cfs {
	t.Helper()
	if unifiedCgroup() {
		m := kv(t, filepath.Join("/sys/fs/cgroup", rel, "cpu.stat"))
		return cfs{m["nr_periods"], m["nr_throttled"], m["throttled_usec"] * 1000}
	}
	m := kv(t, filepath.Join("/sys/fs/cgroup/cpu", rel, "cpu.stat"))
	return cfs{m["nr_periods"], m["nr_throttled"], m["throttled_time"]}
}

// blockDev is the major:minor of the filesystem holding path and the kernel's name of
// it (/sys/dev/block/MAJ:MIN/uevent DEVNAME), as cAdvisor labels devices.
func blockDev(t *testing.T, path string) (majMin, name string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	majMin = fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	data, err := os.ReadFile("/sys/dev/block/" + majMin + "/uevent")
	if err != nil {
		t.Skipf("%s is on no block device (%s): no IO to count", path, majMin)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "DEVNAME="); ok {
			return majMin, "/dev/" + v
		}
	}
	t.Fatalf("%s has no DEVNAME: %q", majMin, data)
	return "", ""
}

// ioWritten is what the cgroup at rel wrote to device majMin, from the kernel's files:
// v2 io.stat wbytes, v1 the recursive blkio throttle statistics.
func ioWritten(t *testing.T, rel, majMin string) uint64 {
	t.Helper()
	if unifiedCgroup() {
		data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", rel, "io.stat"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != majMin {
				continue
			}
			for _, kv := range f[1:] {
				if v, ok := strings.CutPrefix(kv, "wbytes="); ok {
					n, _ := strconv.ParseUint(v, 10, 64)
					return n
				}
			}
		}
		return 0
	}
	data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/blkio", rel, "blkio.throttle.io_service_bytes_recursive"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == majMin && f[1] == "Write" {
			n, _ := strconv.ParseUint(f[2], 10, 64)
			return n
		}
	}
	return 0
}

// enableV1BlkioStats makes a cgroup v1 kernel count block IO on device majMin: since
// Linux 6.10 blk-throttle, which keeps v1's blkio statistics, is set up on a device
// only when a cgroup first gets a throttle rule for it, and counts nothing before.
// The rule set here on the container's own cgroup is far above anything the test
// writes (1 TiB/s) and is removed with the container. cAdvisor reads the same files
// and would show the same zeros without it. No-op on cgroup v2 (io.stat always
// counts).
func enableV1BlkioStats(t *testing.T, rel, majMin string) {
	t.Helper()
	if unifiedCgroup() {
		return
	}
	if err := os.WriteFile(filepath.Join("/sys/fs/cgroup/blkio", rel, "blkio.throttle.write_bps_device"), []byte(majMin+" 1099511627776"), 0); err != nil {
		t.Fatalf("blkio throttle rule: %v", err)
	}
}

// metricSeries indexes a set of CRI metrics as "name{extra label values}" → value,
// checking what kubelet's collector needs: a descriptor for every series with as many
// label keys as the series has values (else kubelet drops it), cAdvisor's base labels
// with the values base, and no series twice.
func metricSeries(t *testing.T, descs map[string][]string, ms []*cri.Metric, base []string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, m := range ms {
		keys, ok := descs[m.GetName()]
		lv := m.GetLabelValues()
		switch {
		case !ok:
			t.Errorf("series %s has no descriptor", m.GetName())
		case len(keys) != len(lv):
			t.Errorf("series %s: %d label values for %d keys %v", m.GetName(), len(lv), len(keys), keys)
		case !slices.Equal(keys[:len(base)], []string{"container", "id", "image", "name", "namespace", "pod"}):
			t.Errorf("series %s: label keys %v, want cAdvisor's base labels first", m.GetName(), keys)
		case !slices.Equal(lv[:len(base)], base):
			t.Errorf("series %s: labels %v, want %q first", m.GetName(), lv, base)
		default:
			k := m.GetName() + "{" + strings.Join(lv[len(base):], ",") + "}"
			if _, dup := out[k]; dup {
				t.Errorf("series %s twice", k)
			}
			out[k] = m.GetValue().GetValue()
		}
	}
	return out
}

// descriptors lists ListMetricDescriptors as name → label keys.
func (e *env) descriptors(ctx context.Context) map[string][]string {
	e.t.Helper()
	resp, err := e.rt.ListMetricDescriptors(ctx, &cri.ListMetricDescriptorsRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string][]string{}
	for _, d := range resp.GetDescriptors() {
		out[d.GetName()] = d.GetLabelKeys()
	}
	return out
}

// podSandboxMetrics is one pod's ListPodSandboxMetrics entry.
func (e *env) podSandboxMetrics(ctx context.Context, podID string) *cri.PodSandboxMetrics {
	e.t.Helper()
	resp, err := e.rt.ListPodSandboxMetrics(ctx, &cri.ListPodSandboxMetricsRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, pm := range resp.GetPodMetrics() {
		if pm.GetPodSandboxId() == podID {
			return pm
		}
	}
	e.t.Fatalf("ListPodSandboxMetrics has no pod %s", podID)
	return nil
}

func containerSeries(pm *cri.PodSandboxMetrics, id string) []*cri.Metric {
	for _, cm := range pm.GetContainerMetrics() {
		if cm.GetContainerId() == id {
			return cm.GetMetrics()
		}
	}
	return nil
}

// checkThrottling reads cpu.stat of the cgroup at rel before and after
// ListPodSandboxMetrics and checks that the container's CFS series lie between the
// two reads (the container keeps running into its quota meanwhile).
func (e *env) checkThrottling(ctx context.Context, podID, ctrID, rel string, base []string) {
	t := e.t
	t.Helper()
	descs := e.descriptors(ctx)
	before := cfsStat(t, rel)
	pm := e.podSandboxMetrics(ctx, podID)
	after := cfsStat(t, rel)
	got := metricSeries(t, descs, containerSeries(pm, ctrID), base)
	t.Logf("cpu.stat before %+v, after %+v; metrics periods %d, throttled %d, throttled %d s",
		before, after, got["container_cpu_cfs_periods_total{}"], got["container_cpu_cfs_throttled_periods_total{}"], got["container_cpu_cfs_throttled_seconds_total{}"])
	if before.throttled < 10 {
		t.Fatalf("a busy loop under a 10 ms/100 ms quota was throttled in %d of %d periods", before.throttled, before.periods)
	}
	for _, c := range []struct {
		name          string
		before, after uint64
	}{
		{"container_cpu_cfs_periods_total{}", before.periods, after.periods},
		{"container_cpu_cfs_throttled_periods_total{}", before.throttled, after.throttled},
		{"container_cpu_cfs_throttled_seconds_total{}", before.throttledNs / 1e9, after.throttledNs / 1e9},
	} {
		if v, ok := got[c.name]; !ok || v < c.before || v > c.after {
			t.Errorf("%s = %d (%v), want between cpu.stat's %d and %d", c.name, v, ok, c.before, c.after)
		}
	}
}

// TestE2EStatsCAdvisor runs a pod in its own cgroup parent (as kubelet gives one)
// with a busy container under a 10 ms/100 ms CPU quota and one that writes 8 MiB with
// O_DIRECT, and checks, on this host's cgroup version: CFS throttling in
// ListPodSandboxMetrics between two reads of the cgroup's cpu.stat; the written bytes
// in the IO series of the writable layer's device, for the container and its pod
// (whose cgroup holds no task of its own); the filesystem's capacity; cAdvisor's
// labels with cAdvisor's values; PSI, io and swap in the stats RPCs where the host has
// them and absent where it has not.
func TestE2EStatsCAdvisor(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)

	cfg, podID, parent := e.runPodInParent(ctx, t, "cadvisor")
	busyCfg := ctrConfig("throttled", img, "sh", "-c", "while :; do :; done")
	busyCfg.Linux.Resources = &cri.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 10000}
	busy := e.runCtr(ctx, podID, cfg, busyCfg)
	writer := e.runCtr(ctx, podID, cfg, ctrConfig("writer", img, "sleep", "3600"))

	// The writable layer is on the filesystem of crisp's root.
	majMin, dev := blockDev(t, e.root)
	writerRel := parent + "/crisp-" + writer
	enableV1BlkioStats(t, writerRel, majMin)
	ex, err := e.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: writer, Timeout: 60,
		Cmd: []string{"dd", "if=/dev/zero", "of=/written", "bs=1M", "count=8", "oflag=direct"}})
	if err != nil || ex.GetExitCode() != 0 {
		t.Fatalf("dd with O_DIRECT in the container: %v, exit %d: %s", err, ex.GetExitCode(), ex.GetStderr())
	}
	// Let the quota bite for a couple of seconds: ~20 periods, nearly all throttled.
	time.Sleep(2500 * time.Millisecond)

	base := func(ctr, id string) []string {
		return []string{ctr, parent + "/crisp-" + id, img, id, "e2e", "cadvisor"}
	}
	podBase := []string{"", parent, "", "", "e2e", "cadvisor"}
	e.checkThrottling(ctx, podID, busy, parent+"/crisp-"+busy, base("throttled", busy))

	descs := e.descriptors(ctx)
	pm := e.podSandboxMetrics(ctx, podID)
	w := metricSeries(t, descs, containerSeries(pm, writer), base("writer", writer))
	pod := metricSeries(t, descs, pm.GetMetrics(), podBase)
	fileW, podFileW := ioWritten(t, writerRel, majMin), ioWritten(t, parent, majMin)
	t.Logf("device %s (%s): writer wrote %d bytes (cgroup file %d), pod %d (file %d); writes %d",
		dev, majMin, w["container_fs_writes_bytes_total{"+dev+"}"], fileW, pod["container_fs_writes_bytes_total{"+dev+"}"], podFileW,
		w["container_fs_writes_total{"+dev+"}"])
	for who, s := range map[string]map[string]uint64{"writer": w, "pod": pod} {
		if v := s["container_fs_writes_bytes_total{"+dev+"}"]; v < 8<<20 {
			t.Errorf("%s: container_fs_writes_bytes_total{%s} = %d, want the 8 MiB written with O_DIRECT", who, dev, v)
		}
		mj, mn, _ := strings.Cut(majMin, ":")
		if v := s["container_blkio_device_usage_total{"+dev+","+mj+","+mn+",Write}"]; v < 8<<20 {
			t.Errorf("%s: container_blkio_device_usage_total{%s,%s,%s,Write} = %d, want 8 MiB", who, dev, mj, mn, v)
		}
		if v := s["container_fs_writes_total{"+dev+"}"]; v == 0 {
			t.Errorf("%s: container_fs_writes_total{%s} = 0", who, dev)
		}
	}
	if v := w["container_fs_writes_bytes_total{"+dev+"}"]; v > fileW {
		t.Errorf("writer's container_fs_writes_bytes_total %d is above the cgroup's own count %d read later", v, fileW)
	}
	// The pod's parent has no quota: no CFS series, as cAdvisor reports none.
	if v, ok := pod["container_cpu_cfs_periods_total{}"]; ok {
		t.Errorf("pod without a CPU quota has container_cpu_cfs_periods_total %d", v)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(e.root, &fs); err != nil {
		t.Fatal(err)
	}
	if v := w["container_fs_limit_bytes{"+dev+"}"]; v != fs.Blocks*uint64(fs.Bsize) {
		t.Errorf("container_fs_limit_bytes{%s} = %d, statfs says %d", dev, v, fs.Blocks*uint64(fs.Bsize))
	}
	if v := w["container_fs_inodes_total{"+dev+"}"]; v != fs.Files {
		t.Errorf("container_fs_inodes_total{%s} = %d, statfs says %d", dev, v, fs.Files)
	}
	if _, ok := w["container_fs_usage_bytes{"+dev+"}"]; !ok {
		t.Errorf("no container_fs_usage_bytes{%s}: %v", dev, w)
	}

	// The stats RPCs: PSI and io on cgroup v2 only; swap where the kernel accounts it.
	resp, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: busy})
	if err != nil {
		t.Fatal(err)
	}
	st := resp.GetStats()
	v2 := unifiedCgroup()
	if (st.GetCpu().GetPsi() != nil) != v2 || (st.GetMemory().GetPsi() != nil) != v2 || (st.GetIo() != nil) != v2 {
		t.Errorf("cgroup v2 %v: cpu psi %v, memory psi %v, io %v", v2, st.GetCpu().GetPsi(), st.GetMemory().GetPsi(), st.GetIo())
	}
	swapFile := filepath.Join("/sys/fs/cgroup/memory", parent, "crisp-"+busy, "memory.memsw.usage_in_bytes")
	if v2 {
		swapFile = filepath.Join("/sys/fs/cgroup", parent, "crisp-"+busy, "memory.swap.current")
	}
	_, err = os.Stat(swapFile)
	if hasSwap := err == nil; (st.GetSwap() != nil) != hasSwap {
		t.Errorf("swap accounting %v (%s), ContainerStats swap %v", hasSwap, swapFile, st.GetSwap())
	}
	ps, err := e.rt.PodSandboxStats(ctx, &cri.PodSandboxStatsRequest{PodSandboxId: podID})
	if err != nil {
		t.Fatal(err)
	}
	if (ps.GetStats().GetLinux().GetIo() != nil) != v2 {
		t.Errorf("cgroup v2 %v: pod io %v", v2, ps.GetStats().GetLinux().GetIo())
	}
	t.Logf("busy container: cpu psi %v, swap %v", st.GetCpu().GetPsi(), st.GetSwap())
}
