package controller

import (
	"math"
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
		CPU:              &cg1.CPUStat{Usage: &cg1.CPUUsage{Total: 1_500_000_000}},
		Pids:             &cg1.PidsStat{Current: 3},
		MemoryOomControl: &cg1.MemoryOomControl{OomKill: 2},
		Memory: &cg1.MemoryStat{
			Usage:             &cg1.MemoryEntry{Usage: 100 << 20, Limit: 256 << 20},
			TotalInactiveFile: 30 << 20,
			TotalRSS:          60 << 20,
			TotalPgFault:      1000,
			TotalPgMajFault:   7,
		},
	}
	v1Unlimited := proto.Clone(v1).(*cg1.Metrics)
	v1Unlimited.Memory.Usage.Limit = 9223372036854771712 // PAGE_COUNTER_MAX in pages
	v1CacheAboveUsage := proto.Clone(v1).(*cg1.Metrics)
	v1CacheAboveUsage.Memory.TotalInactiveFile = 200 << 20
	v1OverLimit := proto.Clone(v1).(*cg1.Metrics)
	v1OverLimit.Memory.Usage.Limit = 50 << 20
	v2 := &cg2.Metrics{
		CPU:          &cg2.CPUStat{UsageUsec: 2_000_000},
		Pids:         &cg2.PidsStat{Current: 5},
		MemoryEvents: &cg2.MemoryEvents{Max: 4, Oom: 1, OomKill: 1},
		Memory: &cg2.MemoryStat{
			Usage:        80 << 20,
			UsageLimit:   128 << 20,
			InactiveFile: 20 << 20,
			Anon:         50 << 20,
			Pgfault:      2000,
			Pgmajfault:   9,
		},
	}
	v2Max := proto.Clone(v2).(*cg2.Metrics)
	v2Max.Memory.UsageLimit = math.MaxUint64

	for _, tc := range []struct {
		name string
		in   *anypb.Any
		want Metrics
	}{
		{"v1 with limit", packAs(t, "io.containerd.cgroups.v1.Metrics", v1), Metrics{
			CPUUsageNanos: 1_500_000_000, Pids: 3, MemoryUsage: 100 << 20, WorkingSet: 70 << 20, RSS: 60 << 20,
			PageFaults: 1000, MajorPageFaults: 7, OOMKills: 2, MemoryLimit: 256 << 20, AvailableBytes: 186 << 20,
		}},
		{"v1 anypb prefix", packAs(t, "type.googleapis.com/io.containerd.cgroups.v1.Metrics", v1), Metrics{
			CPUUsageNanos: 1_500_000_000, Pids: 3, MemoryUsage: 100 << 20, WorkingSet: 70 << 20, RSS: 60 << 20,
			PageFaults: 1000, MajorPageFaults: 7, OOMKills: 2, MemoryLimit: 256 << 20, AvailableBytes: 186 << 20,
		}},
		{"v1 unlimited", packAs(t, "io.containerd.cgroups.v1.Metrics", v1Unlimited), Metrics{
			CPUUsageNanos: 1_500_000_000, Pids: 3, MemoryUsage: 100 << 20, WorkingSet: 70 << 20, RSS: 60 << 20,
			PageFaults: 1000, MajorPageFaults: 7, OOMKills: 2,
		}},
		{"v1 inactive file above usage", packAs(t, "io.containerd.cgroups.v1.Metrics", v1CacheAboveUsage), Metrics{
			CPUUsageNanos: 1_500_000_000, Pids: 3, MemoryUsage: 100 << 20, WorkingSet: 0, RSS: 60 << 20,
			PageFaults: 1000, MajorPageFaults: 7, OOMKills: 2, MemoryLimit: 256 << 20, AvailableBytes: 256 << 20,
		}},
		{"v1 working set above limit", packAs(t, "io.containerd.cgroups.v1.Metrics", v1OverLimit), Metrics{
			CPUUsageNanos: 1_500_000_000, Pids: 3, MemoryUsage: 100 << 20, WorkingSet: 70 << 20, RSS: 60 << 20,
			PageFaults: 1000, MajorPageFaults: 7, OOMKills: 2, MemoryLimit: 50 << 20, AvailableBytes: 0,
		}},
		{"v1 empty", packAs(t, "io.containerd.cgroups.v1.Metrics", &cg1.Metrics{}), Metrics{}},
		{"v2 with limit", packAs(t, "io.containerd.cgroups.v2.Metrics", v2), Metrics{
			CPUUsageNanos: 2_000_000_000, Pids: 5, MemoryUsage: 80 << 20, WorkingSet: 60 << 20, RSS: 50 << 20,
			PageFaults: 2000, MajorPageFaults: 9, OOMKills: 1, MemoryLimit: 128 << 20, AvailableBytes: 68 << 20,
		}},
		{"v2 max", packAs(t, "io.containerd.cgroups.v2.Metrics", v2Max), Metrics{
			CPUUsageNanos: 2_000_000_000, Pids: 5, MemoryUsage: 80 << 20, WorkingSet: 60 << 20, RSS: 50 << 20,
			PageFaults: 2000, MajorPageFaults: 9, OOMKills: 1,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeMetrics(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if *got != tc.want {
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
	a := &Metrics{CPUUsageNanos: 1, MemoryUsage: 10, WorkingSet: 5, RSS: 3, PageFaults: 2, MajorPageFaults: 1, Pids: 1, OOMKills: 1, MemoryLimit: 100, AvailableBytes: 95}
	a.Add(&Metrics{CPUUsageNanos: 2, MemoryUsage: 20, WorkingSet: 10, RSS: 4, PageFaults: 3, MajorPageFaults: 1, Pids: 2, OOMKills: 2, MemoryLimit: 50})
	want := Metrics{CPUUsageNanos: 3, MemoryUsage: 30, WorkingSet: 15, RSS: 7, PageFaults: 5, MajorPageFaults: 2, Pids: 3, OOMKills: 3}
	if *a != want {
		t.Errorf("sum = %+v, want %+v", *a, want)
	}
	a.Add(nil)
	if *a != want {
		t.Errorf("adding nil changed the sum: %+v", *a)
	}
}

// TestMetricsFromV2Files reads container cgroups laid out as on a cgroup v2 node with
// the shim's reader (cgstats, what task Stats and SandboxMetrics send) and decodes them
// as the CRI server does: the figures kubelet gets for a v2 container.
func TestMetricsFromV2Files(t *testing.T) {
	const rel = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/crisp-c1.scope"
	busy := Metrics{
		CPUUsageNanos: 2_500_000_000, // cpu.stat usage_usec 2500000
		MemoryUsage:   100 << 20,     // memory.current
		WorkingSet:    70 << 20,      // memory.current - inactive_file, as kubelet computes it
		RSS:           60 << 20,      // memory.stat anon
		PageFaults:    1000, MajorPageFaults: 7,
		MemoryLimit:    256 << 20, // memory.max
		AvailableBytes: 186 << 20, // memory.max - working set
		Pids:           3,         // pids.current
		OOMKills:       1,         // memory.events oom_kill
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
			m.OOMKills = 0
			return m
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := v2test.New(t)
			dir := node.Mkdir(rel)
			node.Write(dir, v2test.Busy)
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
			if *got != tc.want {
				t.Errorf("got  %+v\nwant %+v", *got, tc.want)
			}
		})
	}
}
