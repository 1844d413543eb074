package controller

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	cg1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	cg2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/crisp-runtime/crisp/internal/cgstats"
	"github.com/crisp-runtime/crisp/internal/cgstats/v2test"
)

func packAs(t *testing.T, url string, m proto.Message) *anypb.Any {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return &anypb.Any{TypeUrl: url, Value: b}
}

func TestDecodeMetrics(t *testing.T) {
	v1 := &cg1.Metrics{
		CPU: &cg1.CPUStat{
			Usage:      &cg1.CPUUsage{Total: 1_500_000_000, User: 1_000_000_000, Kernel: 400_000_000, PerCPU: []uint64{1_000_000_000, 500_000_000}},
			Throttling: &cg1.Throttle{Periods: 40, ThrottledPeriods: 30, ThrottledTime: 2_750_000_000},
		},
		Pids:             &cg1.PidsStat{Current: 3},
		MemoryOomControl: &cg1.MemoryOomControl{OomKill: 2},
		Memory: &cg1.MemoryStat{
			// memsw.usage counts memory plus swap: 16 MiB swapped; memsw.limit is
			// memory + 64 MiB swap.
			Usage:             &cg1.MemoryEntry{Usage: 100 << 20, Limit: 256 << 20, Max: 120 << 20, Failcnt: 4},
			Swap:              &cg1.MemoryEntry{Usage: 116 << 20, Limit: 320 << 20},
			TotalInactiveFile: 30 << 20,
			TotalActiveFile:   5 << 20,
			TotalCache:        35 << 20,
			TotalMappedFile:   2 << 20,
			TotalRSS:          60 << 20,
			TotalPgFault:      1000,
			TotalPgMajFault:   7,
		},
		Blkio: &cg1.BlkIOStat{
			IoServiceBytesRecursive: []*cg1.BlkIOEntry{
				{Op: "Read", Device: "/dev/vda", Major: 254, Minor: 0, Value: 4096},
				{Op: "Write", Device: "/dev/vda", Major: 254, Minor: 0, Value: 8 << 20},
				{Op: "Sync", Device: "/dev/vda", Major: 254, Minor: 0, Value: 8 << 20},
				{Op: "Total", Device: "/dev/vda", Major: 254, Minor: 0, Value: 8<<20 + 4096},
				{Op: "Read", Device: "/dev/sda", Major: 8, Minor: 0, Value: 512},
			},
			IoServicedRecursive: []*cg1.BlkIOEntry{
				{Op: "Read", Device: "/dev/vda", Major: 254, Minor: 0, Value: 1},
				{Op: "Write", Device: "/dev/vda", Major: 254, Minor: 0, Value: 8},
				{Op: "Total", Device: "/dev/vda", Major: 254, Minor: 0, Value: 9},
			},
		},
	}
	v1NoSwap := proto.Clone(v1).(*cg1.Metrics)
	v1NoSwap.Memory.Swap = &cg1.MemoryEntry{} // no memsw files: IgnoreNotExist left it empty
	v1SwapUnlimited := proto.Clone(v1).(*cg1.Metrics)
	v1SwapUnlimited.Memory.Swap.Limit = 9223372036854771712
	v1Unlimited := proto.Clone(v1).(*cg1.Metrics)
	v1Unlimited.Memory.Usage.Limit = 9223372036854771712 // PAGE_COUNTER_MAX in pages
	v1CacheAboveUsage := proto.Clone(v1).(*cg1.Metrics)
	v1CacheAboveUsage.Memory.TotalInactiveFile = 200 << 20
	v1OverLimit := proto.Clone(v1).(*cg1.Metrics)
	v1OverLimit.Memory.Usage.Limit = 50 << 20
	psi := func(some, full uint64) *cg2.PSIStats {
		return &cg2.PSIStats{
			Some: &cg2.PSIData{Avg10: 1.5, Avg60: 0.5, Avg300: 0.25, Total: some},
			Full: &cg2.PSIData{Avg10: 0.5, Total: full},
		}
	}
	v2 := &cg2.Metrics{
		CPU: &cg2.CPUStat{
			UsageUsec: 2_000_000, UserUsec: 1_500_000, SystemUsec: 500_000,
			NrPeriods: 50, NrThrottled: 10, ThrottledUsec: 300_000, PSI: psi(100, 50),
		},
		Pids:         &cg2.PidsStat{Current: 5},
		MemoryEvents: &cg2.MemoryEvents{Max: 4, Oom: 1, OomKill: 1},
		Memory: &cg2.MemoryStat{
			Usage:        80 << 20,
			UsageLimit:   128 << 20,
			MaxUsage:     90 << 20,
			SwapUsage:    4 << 20,
			SwapLimit:    math.MaxUint64,
			InactiveFile: 20 << 20,
			ActiveFile:   6 << 20,
			File:         26 << 20,
			FileMapped:   3 << 20,
			Anon:         50 << 20,
			Pgfault:      2000,
			Pgmajfault:   9,
			PSI:          psi(200, 150),
		},
		Io: &cg2.IOStat{
			Usage: []*cg2.IOEntry{
				{Major: 254, Minor: 0, Rbytes: 4096, Wbytes: 8 << 20, Rios: 1, Wios: 8},
				{Major: 8, Minor: 0, Rbytes: 512, Rios: 1},
			},
			PSI: psi(300, 250),
		},
	}
	v2Max := proto.Clone(v2).(*cg2.Metrics)
	v2Max.Memory.UsageLimit = math.MaxUint64
	v2NoSwapNoPSI := proto.Clone(v2).(*cg2.Metrics)
	v2NoSwapNoPSI.Memory.SwapUsage, v2NoSwapNoPSI.Memory.SwapLimit = 0, 0
	v2NoSwapNoPSI.CPU.PSI, v2NoSwapNoPSI.Memory.PSI, v2NoSwapNoPSI.Io.PSI = nil, nil, nil

	pd := func(some, full uint64) *Pressure {
		return &Pressure{
			Some: &PressureData{Avg10: 1.5, Avg60: 0.5, Avg300: 0.25, TotalNanos: some * 1000},
			Full: &PressureData{Avg10: 0.5, TotalNanos: full * 1000},
		}
	}
	v1IO := []IODevice{
		{Major: 8, Minor: 0, Device: "/dev/sda", ReadBytes: 512},
		{Major: 254, Minor: 0, Device: "/dev/vda", ReadBytes: 4096, WriteBytes: 8 << 20, Reads: 1, Writes: 8},
	}
	wantV1 := Metrics{
		CPUUsageNanos: 1_500_000_000, CPUUserNanos: 1_000_000_000, CPUSystemNanos: 400_000_000,
		Throttling: &Throttling{Periods: 40, ThrottledPeriods: 30, ThrottledNanos: 2_750_000_000},
		Pids:       3, MemoryUsage: 100 << 20, WorkingSet: 70 << 20, RSS: 60 << 20,
		Cache: 35 << 20, MappedFile: 2 << 20, ActiveFile: 5 << 20, InactiveFile: 30 << 20, MaxUsage: 120 << 20, Failcnt: 4,
		PageFaults: 1000, MajorPageFaults: 7, OOMKills: 2, MemoryLimit: 256 << 20, AvailableBytes: 186 << 20,
		Swap: &Swap{Usage: 16 << 20, Limit: 64 << 20},
		IO:   v1IO,
	}
	with := func(m Metrics, f func(*Metrics)) Metrics {
		f(&m)
		return m
	}
	wantV2 := Metrics{
		CPUUsageNanos: 2_000_000_000, CPUUserNanos: 1_500_000_000, CPUSystemNanos: 500_000_000,
		Throttling: &Throttling{Periods: 50, ThrottledPeriods: 10, ThrottledNanos: 300_000_000},
		Pids:       5, MemoryUsage: 80 << 20, WorkingSet: 60 << 20, RSS: 50 << 20,
		Cache: 26 << 20, MappedFile: 3 << 20, ActiveFile: 6 << 20, InactiveFile: 20 << 20, MaxUsage: 90 << 20, Failcnt: 4,
		PageFaults: 2000, MajorPageFaults: 9, OOMKills: 1, MemoryLimit: 128 << 20, AvailableBytes: 68 << 20,
		Swap: &Swap{Usage: 4 << 20},
		IO: []IODevice{
			{Major: 8, Minor: 0, ReadBytes: 512, Reads: 1},
			{Major: 254, Minor: 0, ReadBytes: 4096, WriteBytes: 8 << 20, Reads: 1, Writes: 8},
		},
		CPUPressure: pd(100, 50), MemoryPressure: pd(200, 150), IOPressure: pd(300, 250),
	}

	for _, tc := range []struct {
		name string
		in   *anypb.Any
		want Metrics
	}{
		{"v1 with limit", packAs(t, "io.containerd.cgroups.v1.Metrics", v1), wantV1},
		{"v1 anypb prefix", packAs(t, "type.googleapis.com/io.containerd.cgroups.v1.Metrics", v1), wantV1},
		{"v1 unlimited", packAs(t, "io.containerd.cgroups.v1.Metrics", v1Unlimited), with(wantV1, func(m *Metrics) {
			m.MemoryLimit, m.AvailableBytes = 0, 0
			m.Swap = &Swap{Usage: 16 << 20} // memsw limited, memory not: no swap figure of its own
		})},
		{"v1 inactive file above usage", packAs(t, "io.containerd.cgroups.v1.Metrics", v1CacheAboveUsage), with(wantV1, func(m *Metrics) {
			m.WorkingSet, m.AvailableBytes, m.InactiveFile = 0, 256<<20, 200<<20
		})},
		{"v1 working set above limit", packAs(t, "io.containerd.cgroups.v1.Metrics", v1OverLimit), with(wantV1, func(m *Metrics) {
			m.MemoryLimit, m.AvailableBytes = 50<<20, 0
			m.Swap = &Swap{Usage: 16 << 20, Limit: 270 << 20}
		})},
		{"v1 no swap accounting", packAs(t, "io.containerd.cgroups.v1.Metrics", v1NoSwap), with(wantV1, func(m *Metrics) { m.Swap = nil })},
		{"v1 swap unlimited", packAs(t, "io.containerd.cgroups.v1.Metrics", v1SwapUnlimited), with(wantV1, func(m *Metrics) {
			m.Swap = &Swap{Usage: 16 << 20}
		})},
		{"v1 empty", packAs(t, "io.containerd.cgroups.v1.Metrics", &cg1.Metrics{}), Metrics{}},
		{"v2 with limit", packAs(t, "io.containerd.cgroups.v2.Metrics", v2), wantV2},
		{"v2 max", packAs(t, "io.containerd.cgroups.v2.Metrics", v2Max), with(wantV2, func(m *Metrics) { m.MemoryLimit, m.AvailableBytes = 0, 0 })},
		{"v2 no swap accounting, no PSI", packAs(t, "io.containerd.cgroups.v2.Metrics", v2NoSwapNoPSI), with(wantV2, func(m *Metrics) {
			m.Swap, m.CPUPressure, m.MemoryPressure, m.IOPressure = nil, nil, nil, nil
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeMetrics(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", *got, tc.want)
			}
		})
	}
}

func TestDecodeMetricsErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    *anypb.Any
		check func(error) bool
	}{
		{"nil", nil, errdefs.IsUnavailable},
		{"other type", &anypb.Any{TypeUrl: "io.containerd.cgroups.v3.Metrics"}, errdefs.IsNotImplemented},
		{"garbage", &anypb.Any{TypeUrl: "io.containerd.cgroups.v2.Metrics", Value: []byte{0xff, 0xff}}, func(err error) bool { return err != nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeMetrics(tc.in)
			if err == nil || !tc.check(err) {
				t.Errorf("err = %v", err)
			}
		})
	}
}

func TestMetricsAdd(t *testing.T) {
	th := &Throttling{Periods: 10, ThrottledPeriods: 2, ThrottledNanos: 5}
	ps := &Pressure{Some: &PressureData{TotalNanos: 7}}
	for _, tc := range []struct {
		name string
		a, b Metrics
		want Metrics
	}{
		{
			name: "usage and counters add, limits drop",
			a:    Metrics{CPUUsageNanos: 1, CPUUserNanos: 1, MemoryUsage: 10, WorkingSet: 5, RSS: 3, Cache: 4, MappedFile: 1, ActiveFile: 2, InactiveFile: 2, PageFaults: 2, MajorPageFaults: 1, Pids: 1, OOMKills: 1, MemoryLimit: 100, AvailableBytes: 95, MaxUsage: 12, Failcnt: 3},
			b:    Metrics{CPUUsageNanos: 2, CPUSystemNanos: 2, MemoryUsage: 20, WorkingSet: 10, RSS: 4, Cache: 6, MappedFile: 1, ActiveFile: 3, InactiveFile: 3, PageFaults: 3, MajorPageFaults: 1, Pids: 2, OOMKills: 2, MemoryLimit: 50, MaxUsage: 30},
			want: Metrics{CPUUsageNanos: 3, CPUUserNanos: 1, CPUSystemNanos: 2, MemoryUsage: 30, WorkingSet: 15, RSS: 7, Cache: 10, MappedFile: 2, ActiveFile: 5, InactiveFile: 5, PageFaults: 5, MajorPageFaults: 2, Pids: 3, OOMKills: 3},
		},
		{
			// A sum of siblings has no quota of its own and overlapping stalls.
			name: "throttling and PSI of one cgroup drop",
			a:    Metrics{Throttling: th, CPUPressure: ps, MemoryPressure: ps, IOPressure: ps},
			b:    Metrics{Throttling: th, CPUPressure: ps, MemoryPressure: ps, IOPressure: ps},
			want: Metrics{},
		},
		{
			name: "swap usage adds, limit drops",
			a:    Metrics{Swap: &Swap{Usage: 1 << 20, Limit: 64 << 20}},
			b:    Metrics{Swap: &Swap{Usage: 2 << 20}},
			want: Metrics{Swap: &Swap{Usage: 3 << 20}},
		},
		{
			name: "swap of the added only",
			a:    Metrics{},
			b:    Metrics{Swap: &Swap{Usage: 2 << 20, Limit: 1}},
			want: Metrics{Swap: &Swap{Usage: 2 << 20}},
		},
		{
			name: "no swap figure stays none",
			a:    Metrics{},
			b:    Metrics{},
			want: Metrics{},
		},
		{
			name: "IO adds per device",
			a: Metrics{IO: []IODevice{
				{Major: 254, Minor: 0, ReadBytes: 1, WriteBytes: 2, Reads: 3, Writes: 4},
			}},
			b: Metrics{IO: []IODevice{
				{Major: 254, Minor: 0, Device: "/dev/vda", ReadBytes: 10, WriteBytes: 20, Reads: 30, Writes: 40},
				{Major: 8, Minor: 0, Device: "/dev/sda", ReadBytes: 5},
			}},
			want: Metrics{IO: []IODevice{
				{Major: 8, Minor: 0, Device: "/dev/sda", ReadBytes: 5},
				{Major: 254, Minor: 0, Device: "/dev/vda", ReadBytes: 11, WriteBytes: 22, Reads: 33, Writes: 44},
			}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tc.a, tc.b
			a.Add(&b)
			if !reflect.DeepEqual(a, tc.want) {
				t.Errorf("sum = %+v, want %+v", a, tc.want)
			}
			a.Add(nil)
			if !reflect.DeepEqual(a, tc.want) {
				t.Errorf("adding nil changed the sum: %+v", a)
			}
		})
	}
}

// TestMetricsFromV2Files reads container cgroups laid out as on a cgroup v2 node with
// the shim's reader (cgstats, what task Stats and SandboxMetrics send) and decodes them
// as the CRI server does: the figures kubelet gets for a v2 container.
func TestMetricsFromV2Files(t *testing.T) {
	const rel = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/crisp-c1.scope"
	busy := Metrics{
		CPUUsageNanos:  2_500_000_000, // cpu.stat usage_usec 2500000
		CPUUserNanos:   2_000_000_000, // user_usec
		CPUSystemNanos: 500_000_000,   // system_usec
		// nr_periods, nr_throttled, throttled_usec
		Throttling:   &Throttling{Periods: 100, ThrottledPeriods: 5, ThrottledNanos: 12_345_000},
		MemoryUsage:  100 << 20, // memory.current
		WorkingSet:   70 << 20,  // memory.current - inactive_file, as kubelet computes it
		RSS:          60 << 20,  // memory.stat anon
		Cache:        40 << 20,  // file
		MappedFile:   4 << 20,   // file_mapped
		ActiveFile:   10 << 20,
		InactiveFile: 30 << 20,
		MaxUsage:     128 << 20, // memory.peak
		Failcnt:      12,        // memory.events max
		PageFaults:   1000, MajorPageFaults: 7,
		MemoryLimit:    256 << 20,                              // memory.max
		AvailableBytes: 186 << 20,                              // memory.max - working set
		Swap:           &Swap{Usage: 8 << 20, Limit: 64 << 20}, // memory.swap.current, memory.swap.max
		Pids:           3,                                      // pids.current
		OOMKills:       1,                                      // memory.events oom_kill
		IO: []IODevice{ // io.stat
			{Major: 8, Minor: 0, ReadBytes: 1 << 20, WriteBytes: 4096, Reads: 10, Writes: 1},
			{Major: 253, Minor: 1, ReadBytes: 512, Reads: 1},
		},
		CPUPressure: &Pressure{
			Some: &PressureData{Avg10: 1.5, Avg60: 0.5, Avg300: 0.1, TotalNanos: 2_000_000},
			Full: &PressureData{TotalNanos: 900_000},
		},
		MemoryPressure: &Pressure{Some: &PressureData{TotalNanos: 1_500_000}, Full: &PressureData{TotalNanos: 700_000}},
		IOPressure: &Pressure{
			Some: &PressureData{Avg10: 0.25, Avg60: 0.05, Avg300: 0.01, TotalNanos: 3_000_000},
			Full: &PressureData{Avg10: 0.2, Avg60: 0.04, Avg300: 0.01, TotalNanos: 2_500_000},
		},
	}
	unlimited := busy
	unlimited.MemoryLimit, unlimited.AvailableBytes = 0, 0
	cacheHeavy := busy
	cacheHeavy.WorkingSet, cacheHeavy.AvailableBytes = 0, 256<<20
	for _, tc := range []struct {
		name string
		over map[string]string // files that differ from v2test.Busy
		want Metrics
	}{
		{"busy container", nil, busy},
		{"memory.max max", map[string]string{"memory.max": "max\n"}, unlimited},
		// inactive_file above memory.current (the two are not read atomically).
		{"inactive file above usage", map[string]string{"memory.current": "1048576\n"}, func() Metrics {
			m := cacheHeavy
			m.MemoryUsage = 1 << 20
			return m
		}()},
		{"no kill yet", map[string]string{"memory.events": "low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\n"}, func() Metrics {
			m := busy
			m.OOMKills, m.Failcnt = 0, 3
			return m
		}()},
		{"unlimited swap", map[string]string{"memory.swap.max": "max\n"}, func() Metrics {
			m := busy
			m.Swap = &Swap{Usage: 8 << 20}
			return m
		}()},
		// A kernel without swap accounting has no memory.swap.* files; one without
		// PSI no *.pressure files: those figures are absent, not zero.
		{"no swap accounting", map[string]string{"memory.swap.max": "", "memory.swap.current": ""}, func() Metrics {
			m := busy
			m.Swap = nil
			return m
		}()},
		{"throttled", map[string]string{"cpu.stat": "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n" +
			"nr_periods 250\nnr_throttled 240\nthrottled_usec 19000000\n"}, func() Metrics {
			m := busy
			m.Throttling = &Throttling{Periods: 250, ThrottledPeriods: 240, ThrottledNanos: 19_000_000_000}
			return m
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := v2test.New(t)
			dir := node.Mkdir(rel)
			node.Write(dir, v2test.Busy)
			for name, content := range tc.over {
				if content == "" {
					if err := os.Remove(filepath.Join(dir, name)); err != nil {
						t.Fatal(err)
					}
					delete(tc.over, name)
				}
			}
			node.Write(dir, tc.over)
			cg, err := cgstats.LoadV2(node.Root, rel)
			if err != nil {
				t.Fatal(err)
			}
			a, err := cg.Read()
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeMetrics(a)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", *got, tc.want)
			}
		})
	}
}
