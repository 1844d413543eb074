package cri

import (
	"testing"
	"time"

	"github.com/containerd/errdefs"
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
// label keys as it has values, and that the values are the stats' own.
func TestPodMetricsMatchDescriptors(t *testing.T) {
	desc := map[string]int{}
	for _, d := range metricDefs {
		if _, dup := desc[d.name]; dup {
			t.Errorf("descriptor %s listed twice", d.name)
		}
		desc[d.name] = len(d.labels)
	}
	now := time.Unix(2000, 0)
	cm := &controller.Metrics{Timestamp: now, CPUUsageNanos: 3_700_000_000, MemoryUsage: 50 << 20, WorkingSet: 40 << 20, RSS: 30 << 20, PageFaults: 10, MajorPageFaults: 1, Pids: 2}
	pm := &controller.Metrics{Timestamp: now, CPUUsageNanos: 4_000_000_000, MemoryUsage: 60 << 20, WorkingSet: 45 << 20, RSS: 31 << 20, Pids: 3}
	st := &runtime.PodSandboxStats{
		Attributes: &runtime.PodSandboxAttributes{Id: "pod1", Metadata: &runtime.PodSandboxMetadata{Name: "web"}},
		Linux: &runtime.LinuxPodSandboxStats{
			Network: networkUsage([]netIface{{name: "eth0", rxBytes: 100, txBytes: 200}}, now),
			Containers: []*runtime.ContainerStats{
				{Attributes: &runtime.ContainerAttributes{Id: "c1", Metadata: &runtime.ContainerMetadata{Name: "app"}},
					WritableLayer: &runtime.FilesystemUsage{FsId: &runtime.FilesystemIdentifier{Mountpoint: "/var"}, UsedBytes: &runtime.UInt64Value{Value: 4096}, InodesUsed: &runtime.UInt64Value{Value: 3}}},
				{Attributes: &runtime.ContainerAttributes{Id: "c2", Metadata: &runtime.ContainerMetadata{Name: "created"}}},
			},
		},
	}
	raw := &podStats{pod: pm, network: []netIface{{name: "eth0", rxBytes: 100, txBytes: 200}}, containers: map[string]*controller.Metrics{"c1": cm}}
	got := podMetrics(st, raw)
	if got.GetPodSandboxId() != "pod1" || len(got.GetContainerMetrics()) != 1 || got.GetContainerMetrics()[0].GetContainerId() != "c1" {
		t.Fatalf("metrics = %v", got)
	}
	values := map[string]uint64{}
	check := func(ms []*runtime.Metric, id string) {
		for _, m := range ms {
			n, ok := desc[m.GetName()]
			if !ok {
				t.Errorf("series %s has no descriptor", m.GetName())
			}
			if len(m.GetLabelValues()) != n || m.GetLabelValues()[0] != id {
				t.Errorf("series %s labels %v, want %d starting with %s", m.GetName(), m.GetLabelValues(), n, id)
			}
			values[id+"/"+m.GetName()+"/"+m.GetLabelValues()[len(m.GetLabelValues())-1]] = m.GetValue().GetValue()
		}
	}
	check(got.GetMetrics(), "pod1")
	check(got.GetContainerMetrics()[0].GetMetrics(), "c1")
	for k, want := range map[string]uint64{
		"pod1/container_network_receive_bytes_total/eth0":  100,
		"pod1/container_network_transmit_bytes_total/eth0": 200,
		"pod1/container_cpu_usage_seconds_total/web":       4,
		"pod1/container_processes/web":                     3,
		"c1/container_cpu_usage_seconds_total/app":         3,
		"c1/container_memory_working_set_bytes/app":        40 << 20,
		"c1/container_memory_failures_total/container":     1, // the last of the two: pgmajfault
		"c1/container_fs_usage_bytes//var":                 4096,
	} {
		if values[k] != want {
			t.Errorf("%s = %d, want %d", k, values[k], want)
		}
	}
}
