package cri

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/controller"
)

func TestParseNetDev(t *testing.T) {
	const sample = `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     560       8    0    0    0     0          0         0      560       8    0    0    0     0       0          0
  eth0: 1234567     890    1    2    0     0          0         0   765432     321    3    4    0     0       0          0
`
	got, err := parseNetDev([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	want := []netIface{{name: "eth0", rxBytes: 1234567, rxPackets: 890, rxErrors: 1, rxDropped: 2, txBytes: 765432, txPackets: 321, txErrors: 3, txDropped: 4}}
	if len(got) != 1 || got[0] != want[0] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	u := networkUsage(got, time.Unix(0, 42))
	if u.GetDefaultInterface().GetName() != "eth0" || u.GetDefaultInterface().GetRxBytes().GetValue() != 1234567 || u.GetTimestamp() != 42 || len(u.GetInterfaces()) != 1 {
		t.Errorf("network usage = %v", u)
	}
	for _, bad := range []string{"h1\nh2\neth0 1 2 3\n", "h1\nh2\neth0: 1 2 3\n", "h1\nh2\neth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 x\n"} {
		if _, err := parseNetDev([]byte(bad)); err == nil {
			t.Errorf("parseNetDev(%q) succeeded", bad)
		}
	}
}

func TestValidateStatsFilter(t *testing.T) {
	for _, tc := range []struct {
		name       string
		id, pod    string
		labels     map[string]string
		wantErrArg bool
	}{
		{"empty", "", "", nil, false},
		{"full id", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "", nil, false},
		{"prefixes", "ab12", "cd", map[string]string{"app": "x"}, false},
		{"uppercase id", "AB12", "", nil, true},
		{"path in pod id", "", "../x", nil, true},
		{"too long", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0", "", nil, true},
		{"empty label key", "", "", map[string]string{"": "x"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validateStatsFilter(tc.id, tc.pod, tc.labels)
			if got := errdefs.IsInvalidArgument(err); got != tc.wantErrArg {
				t.Errorf("err = %v, want InvalidArgument %v", err, tc.wantErrArg)
			}
		})
	}
}

func TestCPURate(t *testing.T) {
	var st statsState
	t0 := time.Unix(1000, 0)
	if _, ok := st.cpuRate("c", t0, 1e9); ok {
		t.Error("first sample has a rate")
	}
	// Two seconds later, 1.5 s more CPU: 0.75 cores.
	if r, ok := st.cpuRate("c", t0.Add(2*time.Second), 2.5e9); !ok || r != 750_000_000 {
		t.Errorf("rate = %d, %v; want 750000000", r, ok)
	}
	// Too close to the last sample: the last rate again, the sample kept.
	if r, ok := st.cpuRate("c", t0.Add(2100*time.Millisecond), 9e9); !ok || r != 750_000_000 {
		t.Errorf("rate after 100 ms = %d, %v; want the previous 750000000", r, ok)
	}
	// A counter that went backwards (a new cgroup under the same id) restarts.
	if _, ok := st.cpuRate("c", t0.Add(5*time.Second), 1); ok {
		t.Error("a reset counter gave a rate")
	}
	st.prune(func(k string) bool { return k != "c" })
	if _, ok := st.cpuRate("c", t0.Add(10*time.Second), 5); ok {
		t.Error("a pruned key kept its sample")
	}
}

// TestPodMetricsMatchDescriptors checks that every series has a descriptor with as many
// label keys as it has values, that the labels are cAdvisor's with cAdvisor's values,
// and that the values are the stats' own: CFS throttling, swap, IO per named device,
// PSI (in whole seconds), the filesystem's capacity.
func TestPodMetricsMatchDescriptors(t *testing.T) {
	desc := map[string]int{}
	for _, d := range metricDefs {
		if _, dup := desc[d.name]; dup {
			t.Errorf("descriptor %s listed twice", d.name)
		}
		desc[d.name] = len(d.labels)
		if d.labels[0] != "container" || d.labels[5] != "pod" {
			t.Errorf("descriptor %s labels %v: want cAdvisor's base labels first", d.name, d.labels)
		}
	}
	sys := t.TempDir()
	if err := os.MkdirAll(filepath.Join(sys, "dev/block/254:0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sys, "dev/block/254:0/uevent"), []byte("MAJOR=254\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	devs := &blockDevices{sysRoot: sys}

	now := time.Unix(2000, 0)
	cm := &controller.Metrics{
		Timestamp: now, CPUUsageNanos: 3_700_000_000, CPUUserNanos: 2_100_000_000, CPUSystemNanos: 1_600_000_000,
		Throttling:  &controller.Throttling{Periods: 300, ThrottledPeriods: 280, ThrottledNanos: 25_900_000_000},
		MemoryUsage: 50 << 20, WorkingSet: 40 << 20, RSS: 30 << 20, Cache: 20 << 20, MappedFile: 1 << 20, MaxUsage: 60 << 20,
		PageFaults: 10, MajorPageFaults: 1, Pids: 2, OOMKills: 1, Failcnt: 5,
		Swap: &controller.Swap{Usage: 8 << 20},
		IO: []controller.IODevice{
			{Major: 254, Minor: 0, ReadBytes: 4096, WriteBytes: 8 << 20, Reads: 1, Writes: 8},
			{Major: 7, Minor: 3, WriteBytes: 512, Writes: 1},
		},
		MemoryPressure: &controller.Pressure{Some: &controller.PressureData{TotalNanos: 2_500_000_000}, Full: &controller.PressureData{TotalNanos: 1_200_000_000}},
	}
	pm := &controller.Metrics{Timestamp: now, CPUUsageNanos: 4_000_000_000, MemoryUsage: 60 << 20, WorkingSet: 45 << 20, RSS: 31 << 20, Pids: 3,
		Throttling: &controller.Throttling{}} // no quota: no CFS series
	st := &runtime.PodSandboxStats{
		Attributes: &runtime.PodSandboxAttributes{Id: "pod1", Metadata: &runtime.PodSandboxMetadata{Name: "web", Namespace: "shop"}},
		Linux: &runtime.LinuxPodSandboxStats{
			Network: networkUsage([]netIface{{name: "eth0", rxBytes: 100, txBytes: 200}}, now),
			Containers: []*runtime.ContainerStats{
				{Attributes: &runtime.ContainerAttributes{Id: "c1", Metadata: &runtime.ContainerMetadata{Name: "app"}}},
				{Attributes: &runtime.ContainerAttributes{Id: "c2", Metadata: &runtime.ContainerMetadata{Name: "created"}}},
			},
		},
	}
	podL := metricLabels{id: "/kubepods/burstable/pod1", namespace: "shop", pod: "web"}
	appL := podL
	appL.container, appL.id, appL.image, appL.name = "app", "/kubepods/burstable/pod1/crisp-c1", "registry.example/app:1", "c1"
	raw := &podStats{
		pod: pm, network: []netIface{{name: "eth0", rxBytes: 100, txBytes: 200}},
		containers: map[string]*containerRaw{"c1": {m: cm, fs: &fsUsage{
			at: now, mountpoint: "/var", bytes: 4096, inodes: 3, device: "/dev/vda1",
			capacity: &fsCapacity{limitBytes: 10 << 30, inodesTotal: 1000, inodesFree: 900},
		}}},
		labels: podL, ctrsLabels: map[string]metricLabels{"c1": appL},
	}
	got := podMetrics(st, raw, devs)
	if got.GetPodSandboxId() != "pod1" || len(got.GetContainerMetrics()) != 1 || got.GetContainerMetrics()[0].GetContainerId() != "c1" {
		t.Fatalf("metrics = %v", got)
	}
	values := map[string]uint64{}
	check := func(ms []*runtime.Metric, l metricLabels, who string) {
		for _, m := range ms {
			n, ok := desc[m.GetName()]
			if !ok {
				t.Errorf("series %s has no descriptor", m.GetName())
			}
			lv := m.GetLabelValues()
			if len(lv) != n || !slices.Equal(lv[:6], l.values()) {
				t.Errorf("series %s labels %v, want %d starting with %v", m.GetName(), lv, n, l.values())
				continue
			}
			k := who + "/" + m.GetName() + "{" + strings.Join(lv[6:], ",") + "}"
			if _, dup := values[k]; dup {
				t.Errorf("series %s twice", k)
			}
			values[k] = m.GetValue().GetValue()
		}
	}
	check(got.GetMetrics(), podL, "pod")
	check(got.GetContainerMetrics()[0].GetMetrics(), appL, "app")
	for k, want := range map[string]uint64{
		"pod/container_network_receive_bytes_total{eth0}":              100,
		"pod/container_network_transmit_bytes_total{eth0}":             200,
		"pod/container_cpu_usage_seconds_total{total}":                 4,
		"pod/container_processes{}":                                    3,
		"app/container_cpu_usage_seconds_total{total}":                 3,
		"app/container_cpu_user_seconds_total{}":                       2,
		"app/container_cpu_system_seconds_total{}":                     1,
		"app/container_cpu_cfs_periods_total{}":                        300,
		"app/container_cpu_cfs_throttled_periods_total{}":              280,
		"app/container_cpu_cfs_throttled_seconds_total{}":              25, // 25.9 s, rounded down
		"app/container_memory_working_set_bytes{}":                     40 << 20,
		"app/container_memory_cache{}":                                 20 << 20,
		"app/container_memory_mapped_file{}":                           1 << 20,
		"app/container_memory_max_usage_bytes{}":                       60 << 20,
		"app/container_memory_failcnt{}":                               5,
		"app/container_memory_swap{}":                                  8 << 20,
		"app/container_oom_events_total{}":                             1,
		"app/container_memory_failures_total{pgfault,container}":       10,
		"app/container_memory_failures_total{pgmajfault,container}":    1,
		"app/container_pressure_memory_waiting_seconds_total{}":        2,
		"app/container_pressure_memory_stalled_seconds_total{}":        1,
		"app/container_fs_reads_bytes_total{/dev/vda}":                 4096,
		"app/container_fs_writes_bytes_total{/dev/vda}":                8 << 20,
		"app/container_fs_reads_total{/dev/vda}":                       1,
		"app/container_fs_writes_total{/dev/vda}":                      8,
		"app/container_fs_writes_bytes_total{7:3}":                     512, // no DEVNAME: major:minor
		"app/container_blkio_device_usage_total{/dev/vda,254,0,Write}": 8 << 20,
		"app/container_blkio_device_usage_total{/dev/vda,254,0,Read}":  4096,
		"app/container_fs_usage_bytes{/dev/vda1}":                      4096,
		"app/container_fs_inodes_used{/dev/vda1}":                      3,
		"app/container_fs_limit_bytes{/dev/vda1}":                      10 << 30,
		"app/container_fs_inodes_total{/dev/vda1}":                     1000,
		"app/container_fs_inodes_free{/dev/vda1}":                      900,
	} {
		if v, ok := values[k]; !ok || v != want {
			t.Errorf("%s = %d (%v), want %d", k, v, ok, want)
		}
	}
	// Figures the host does not have are no series, not zeros.
	for _, k := range []string{
		"pod/container_cpu_cfs_periods_total{}",              // no quota
		"pod/container_memory_swap{}",                        // no swap accounting
		"pod/container_memory_max_usage_bytes{}",             // no peak
		"pod/container_pressure_cpu_waiting_seconds_total{}", // no PSI (cgroup v1)
		"app/container_pressure_io_waiting_seconds_total{}",
	} {
		if v, ok := values[k]; ok {
			t.Errorf("%s = %d: the host has no such figure", k, v)
		}
	}
}

// TestStatsFields checks the CRI's swap, io and psi fields: filled from the cgroup's
// figures, left out where the host has none (never a zero standing for "unknown").
func TestStatsFields(t *testing.T) {
	now := time.Unix(3000, 0)
	psi := &controller.Pressure{
		Some: &controller.PressureData{Avg10: 12.5, Avg60: 3, Avg300: 1, TotalNanos: 4_000_000},
		Full: &controller.PressureData{Avg10: 2.5, TotalNanos: 1_000_000},
	}
	wantPSI := &runtime.PsiStats{
		Some: &runtime.PsiData{Avg10: 12.5, Avg60: 3, Avg300: 1, Total: 4_000_000},
		Full: &runtime.PsiData{Avg10: 2.5, Total: 1_000_000},
	}
	v2 := &controller.Metrics{Timestamp: now, CPUPressure: psi, MemoryPressure: psi, IOPressure: psi, Swap: &controller.Swap{Usage: 3 << 20, Limit: 64 << 20}, MemoryLimit: 1 << 30}
	var s Service
	if got := s.cpuUsage("c", v2).GetPsi(); !proto.Equal(got, wantPSI) {
		t.Errorf("cpu psi = %v, want %v", got, wantPSI)
	}
	if got := memoryUsage(v2).GetPsi(); !proto.Equal(got, wantPSI) {
		t.Errorf("memory psi = %v, want %v", got, wantPSI)
	}
	if got := ioUsage(v2); got.GetTimestamp() != now.UnixNano() || !proto.Equal(got.GetPsi(), wantPSI) {
		t.Errorf("io = %v, want psi %v", got, wantPSI)
	}
	if got := swapUsage(v2); got.GetTimestamp() != now.UnixNano() || got.GetSwapUsageBytes().GetValue() != 3<<20 || got.GetSwapAvailableBytes().GetValue() != 61<<20 {
		t.Errorf("swap = %v, want 3 MiB used, 61 MiB available", got)
	}
	unlimited := &controller.Metrics{Timestamp: now, Swap: &controller.Swap{Usage: 1}}
	if got := swapUsage(unlimited); got.GetSwapUsageBytes().GetValue() != 1 || got.GetSwapAvailableBytes() != nil {
		t.Errorf("unlimited swap = %v, want usage 1 and no available", got)
	}
	v1 := &controller.Metrics{Timestamp: now}
	if s.cpuUsage("d", v1).GetPsi() != nil || memoryUsage(v1).GetPsi() != nil || ioUsage(v1) != nil || swapUsage(v1) != nil {
		t.Errorf("cgroup v1 without swap accounting: psi, io or swap filled")
	}
}

// TestCgroupName checks the id label against where crisp's containers and kubelet's
// pod cgroups are, for both drivers.
func TestCgroupName(t *testing.T) {
	for _, tc := range []struct {
		driver, parent, id, want string
	}{
		{"cgroupfs", "/kubepods/burstable/podab", "c1", "/kubepods/burstable/podab/crisp-c1"},
		{"cgroupfs", "/kubepods/burstable/podab", "", "/kubepods/burstable/podab"},
		{"cgroupfs", "", "c1", "/crisp/crisp-c1"},
		{"cgroupfs", "", "", ""},
		{"systemd", "kubepods-burstable-podab.slice", "c1", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podab.slice/crisp-c1.scope"},
		{"systemd", "kubepods-burstable-podab.slice", "", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podab.slice"},
		{"systemd", "kubepods-pod-pod.slice", "", "/kubepods.slice/kubepods-pod.slice/kubepods-pod-pod.slice"},
		{"systemd", "", "c1", "/system.slice/crisp-c1.scope"},
		{"systemd", "-.slice", "", "/"},
	} {
		var s Service
		s.cfg.CgroupDriver = tc.driver
		if got := s.cgroupName(tc.parent, tc.id); got != tc.want {
			t.Errorf("%s %q %q: %q, want %q", tc.driver, tc.parent, tc.id, got, tc.want)
		}
	}
}

// TestBlockDevices checks the device names of IO and filesystem series: the kernel's
// DEVNAME under /dev, remembered (a miss too), major:minor when there is none.
func TestBlockDevices(t *testing.T) {
	sys := t.TempDir()
	dir := filepath.Join(sys, "dev/block/8:16")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "uevent"), []byte("MAJOR=8\nMINOR=16\nDEVNAME=sdb\nDEVTYPE=disk\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &blockDevices{sysRoot: sys}
	if got := b.name(8, 16); got != "/dev/sdb" {
		t.Errorf("name(8:16) = %q", got)
	}
	if got := b.label(9, 9, ""); got != "9:9" {
		t.Errorf("label of an unknown device = %q, want 9:9", got)
	}
	if got := b.label(8, 16, "/dev/given"); got != "/dev/given" {
		t.Errorf("label with a known name = %q", got)
	}
	// Looked up once: a rename on disk is not read again.
	if err := os.WriteFile(filepath.Join(dir, "uevent"), []byte("DEVNAME=other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := b.name(8, 16); got != "/dev/sdb" {
		t.Errorf("second lookup = %q, want the remembered /dev/sdb", got)
	}
	// The host's own: the filesystem of / is on some device or none, never an error.
	var host blockDevices
	if dev, c := host.filesystem("/"); dev != "" && (c == nil || c.limitBytes == 0 || c.inodesTotal == 0) {
		t.Errorf("filesystem(/) on %s: capacity %+v", dev, c)
	}
	if dev, c := host.filesystem("/proc"); dev != "" || c != nil {
		t.Errorf("/proc is on block device %q (%+v)", dev, c)
	}
}
