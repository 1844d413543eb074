package controller

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	cg1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	cg2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	sandboxapi "github.com/containerd/containerd/api/runtime/sandbox/v1"
	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Proto full names of the metrics a runc-style shim returns (containerd's typeurl puts
// the bare name in the Any; anypb.New would prefix type.googleapis.com/, also accepted).
const (
	metricsV1Name = "io.containerd.cgroups.v1.Metrics"
	metricsV2Name = "io.containerd.cgroups.v2.Metrics"
)

// Metrics is one cgroup's figures, the same for cgroup v1 and v2, as the CRI reports
// them. Counters are cumulative since the cgroup was made. A pointer or slice left nil
// means the host has no such figure for the cgroup (no PSI on cgroup v1, no swap
// accounting, no CPU controller): callers leave the field out rather than report 0.
type Metrics struct {
	// Timestamp is when the figures were read.
	Timestamp time.Time
	// CPUUsageNanos is the CPU time used by every task of the cgroup; CPUUserNanos and
	// CPUSystemNanos split it (v1 cpuacct.usage_user/_sys, v2 user_usec/system_usec).
	CPUUsageNanos, CPUUserNanos, CPUSystemNanos uint64
	// Throttling is the CFS bandwidth control figures of cpu.stat.
	Throttling *Throttling
	// MemoryUsage is what the kernel charges the cgroup (page cache included).
	MemoryUsage uint64
	// WorkingSet is MemoryUsage minus the inactive file cache: what kubelet and
	// cAdvisor call the working set and evict on.
	WorkingSet uint64
	// RSS is anonymous memory and swap cache (v1 total_rss, v2 anon).
	RSS uint64
	// Cache is the page cache (v1 total_cache, v2 file); MappedFile the part of it
	// mapped into processes (v1 total_mapped_file, v2 file_mapped).
	Cache, MappedFile uint64
	// ActiveFile and InactiveFile split the page cache by LRU list (v1 total_*, v2).
	ActiveFile, InactiveFile uint64
	// MaxUsage is the highest MemoryUsage seen (v1 max_usage_in_bytes, v2
	// memory.peak); 0 when the kernel has no such file (v2 before Linux 5.19).
	MaxUsage uint64
	// Failcnt counts the times usage hit the limit (v1 memory.failcnt, v2 the max
	// field of memory.events), as cAdvisor's container_memory_failcnt.
	Failcnt uint64
	// PageFaults and MajorPageFaults count faults (v1 total_pgfault/total_pgmajfault,
	// v2 pgfault/pgmajfault).
	PageFaults, MajorPageFaults uint64
	// MemoryLimit is the limit in bytes, 0 when unlimited; AvailableBytes is
	// MemoryLimit - WorkingSet (0 when unlimited or above the limit).
	MemoryLimit, AvailableBytes uint64
	// Swap is the cgroup's swap use; nil without swap accounting.
	Swap *Swap
	// Pids is the number of tasks in the cgroup.
	Pids uint64
	// OOMKills counts processes of the cgroup killed by the OOM killer (v1
	// memory.oom_control oom_kill, v2 memory.events oom_kill: hierarchical, so a pod
	// cgroup counts its containers' kills). No CRI stats field carries it; it is what
	// cAdvisor's container_oom_events_total counts.
	OOMKills uint64
	// IO is the block IO per device, sorted by major:minor (v1 blkio
	// io_service_bytes/io_serviced, recursive where the kernel has it; v2 io.stat).
	IO []IODevice
	// CPUPressure, MemoryPressure and IOPressure are the cgroup's PSI (v2
	// cpu.pressure, memory.pressure, io.pressure); nil on v1 or without PSI.
	CPUPressure, MemoryPressure, IOPressure *Pressure
}

// Throttling is a cgroup's CFS bandwidth control counters. Periods only run while the
// cgroup has a CPU quota and runnable tasks, so Periods == 0 means it never had one.
type Throttling struct {
	// Periods is the number of enforcement periods that elapsed (nr_periods);
	// ThrottledPeriods those in which the cgroup hit its quota (nr_throttled).
	Periods, ThrottledPeriods uint64
	// ThrottledNanos is the total time the cgroup's tasks were throttled (v1
	// throttled_time, v2 throttled_usec × 1000).
	ThrottledNanos uint64
}

// Swap is a cgroup's swap use.
type Swap struct {
	// Usage is the swap in use: v2 memory.swap.current; v1 memsw.usage - usage
	// (memsw counts memory plus swap), as cAdvisor computes it.
	Usage uint64
	// Limit is the most swap the cgroup may use, 0 when unlimited: v2 memory.swap.max;
	// v1 memsw.limit - limit when both are set.
	Limit uint64
}

// IODevice is the block IO of a cgroup on one device.
type IODevice struct {
	Major, Minor uint64
	// Device is the device node (/dev/vda) when the reader knew it (cgroup v1's stats
	// name devices from /proc/partitions), else empty: cgroup v2 names none.
	Device string
	// ReadBytes, WriteBytes, Reads and Writes count what was transferred and the
	// operations completed (v1 Read/Write lines, v2 rbytes/wbytes/rios/wios).
	ReadBytes, WriteBytes, Reads, Writes uint64
}

// Pressure is one resource's pressure stall information.
type Pressure struct {
	// Some is time at least one task stalled on the resource; Full (nil for CPU on
	// kernels before 5.13) time all non-idle tasks stalled at once.
	Some, Full *PressureData
}

// PressureData is one line of a *.pressure file.
type PressureData struct {
	// Avg10, Avg60 and Avg300 are the stalled share of the last 10, 60 and 300 s, in %.
	Avg10, Avg60, Avg300 float64
	// TotalNanos is the cumulative stall time (the kernel's total= is in µs).
	TotalNanos uint64
}

// ContainerMetrics asks the pod's shim for a container's cgroup metrics (task Stats).
func (c *Controller) ContainerMetrics(ctx context.Context, sandboxID, id string) (*Metrics, error) {
	tc, _, err := c.task(sandboxID)
	if err != nil {
		return nil, err
	}
	resp, err := tc.Stats(ctx, &taskapi.StatsRequest{ID: id})
	if err != nil {
		return nil, fmt.Errorf("stats of container %s: %w", id, fromShim(err))
	}
	m, err := DecodeMetrics(resp.GetStats())
	if err != nil {
		return nil, fmt.Errorf("stats of container %s: %w", id, err)
	}
	m.Timestamp = time.Now()
	return m, nil
}

// SandboxMetrics asks the pod's shim for the pod cgroup's metrics (sandbox
// SandboxMetrics): the pod's cgroup_parent when it has one, else the pause cgroup.
func (c *Controller) SandboxMetrics(ctx context.Context, id string) (*Metrics, error) {
	svc, err := c.sandboxClient(id)
	if err != nil {
		return nil, err
	}
	resp, err := svc.SandboxMetrics(ctx, &sandboxapi.SandboxMetricsRequest{SandboxID: id})
	if err != nil {
		return nil, fmt.Errorf("metrics of pod %s: %w", id, fromShim(err))
	}
	m, err := DecodeMetrics(resp.GetMetrics().GetData())
	if err != nil {
		return nil, fmt.Errorf("metrics of pod %s: %w", id, err)
	}
	m.Timestamp = time.Now()
	if ts := resp.GetMetrics().GetTimestamp(); ts != nil {
		m.Timestamp = ts.AsTime()
	}
	if c.isTaskOnly(id) {
		c.sumMetrics(ctx, id, m)
	}
	return m, nil
}

// DecodeMetrics turns a shim's cgroup v1 or v2 metrics into Metrics, computing the
// working set and available bytes as kubelet (cAdvisor) does.
func DecodeMetrics(a *anypb.Any) (*Metrics, error) {
	if a == nil {
		return nil, fmt.Errorf("shim returned no metrics: %w", errdefs.ErrUnavailable)
	}
	name := a.GetTypeUrl()
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	switch name {
	case metricsV1Name:
		var m cg1.Metrics
		if err := proto.Unmarshal(a.GetValue(), &m); err != nil {
			return nil, fmt.Errorf("decode %s: %w", name, err)
		}
		return fromV1(&m), nil
	case metricsV2Name:
		var m cg2.Metrics
		if err := proto.Unmarshal(a.GetValue(), &m); err != nil {
			return nil, fmt.Errorf("decode %s: %w", name, err)
		}
		return fromV2(&m), nil
	}
	return nil, fmt.Errorf("shim metrics of type %q: want %s or %s: %w", a.GetTypeUrl(), metricsV1Name, metricsV2Name, errdefs.ErrNotImplemented)
}

func fromV1(m *cg1.Metrics) *Metrics {
	out := &Metrics{Pids: m.GetPids().GetCurrent(), OOMKills: m.GetMemoryOomControl().GetOomKill()}
	if cpu := m.GetCPU(); cpu != nil {
		out.CPUUsageNanos = cpu.GetUsage().GetTotal()
		out.CPUUserNanos = cpu.GetUsage().GetUser()
		out.CPUSystemNanos = cpu.GetUsage().GetKernel()
		if th := cpu.GetThrottling(); th != nil {
			out.Throttling = &Throttling{Periods: th.GetPeriods(), ThrottledPeriods: th.GetThrottledPeriods(), ThrottledNanos: th.GetThrottledTime()}
		}
	}
	if mem := m.GetMemory(); mem != nil {
		out.MemoryUsage = mem.GetUsage().GetUsage()
		out.WorkingSet = workingSet(out.MemoryUsage, mem.GetTotalInactiveFile())
		out.RSS = mem.GetTotalRSS()
		out.Cache = mem.GetTotalCache()
		out.MappedFile = mem.GetTotalMappedFile()
		out.ActiveFile = mem.GetTotalActiveFile()
		out.InactiveFile = mem.GetTotalInactiveFile()
		out.MaxUsage = mem.GetUsage().GetMax()
		out.Failcnt = mem.GetUsage().GetFailcnt()
		out.PageFaults = mem.GetTotalPgFault()
		out.MajorPageFaults = mem.GetTotalPgMajFault()
		out.MemoryLimit, out.AvailableBytes = available(mem.GetUsage().GetLimit(), out.WorkingSet)
		// memsw.limit_in_bytes is never 0 where the kernel accounts swap (at least the
		// memory limit, PAGE_COUNTER_MAX when unlimited): 0 is the file missing.
		if sw := mem.GetSwap(); sw.GetLimit() != 0 {
			out.Swap = &Swap{}
			if u := mem.GetUsage().GetUsage(); sw.GetUsage() > u {
				out.Swap.Usage = sw.GetUsage() - u
			}
			if lim, _ := available(sw.GetLimit(), 0); lim > 0 && out.MemoryLimit > 0 && lim > out.MemoryLimit {
				out.Swap.Limit = lim - out.MemoryLimit
			}
		}
	}
	if b := m.GetBlkio(); b != nil {
		out.IO = blkioDevices(b.GetIoServiceBytesRecursive(), b.GetIoServicedRecursive())
	}
	return out
}

// blkioDevices folds cgroup v1's per-operation blkio lines into one entry per device.
func blkioDevices(bytes, ops []*cg1.BlkIOEntry) []IODevice {
	devs := map[[2]uint64]*IODevice{}
	get := func(e *cg1.BlkIOEntry) *IODevice {
		k := [2]uint64{e.GetMajor(), e.GetMinor()}
		d := devs[k]
		if d == nil {
			d = &IODevice{Major: k[0], Minor: k[1]}
			devs[k] = d
		}
		if d.Device == "" {
			d.Device = e.GetDevice()
		}
		return d
	}
	for _, e := range bytes {
		switch strings.ToLower(e.GetOp()) {
		case "read":
			get(e).ReadBytes = e.GetValue()
		case "write":
			get(e).WriteBytes = e.GetValue()
		}
	}
	for _, e := range ops {
		switch strings.ToLower(e.GetOp()) {
		case "read":
			get(e).Reads = e.GetValue()
		case "write":
			get(e).Writes = e.GetValue()
		}
	}
	return sortedDevices(devs)
}

func sortedDevices(devs map[[2]uint64]*IODevice) []IODevice {
	if len(devs) == 0 {
		return nil
	}
	out := make([]IODevice, 0, len(devs))
	for _, d := range devs {
		out = append(out, *d)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Major != out[j].Major {
			return out[i].Major < out[j].Major
		}
		return out[i].Minor < out[j].Minor
	})
	return out
}

func fromV2(m *cg2.Metrics) *Metrics {
	out := &Metrics{Pids: m.GetPids().GetCurrent(), OOMKills: m.GetMemoryEvents().GetOomKill(), Failcnt: m.GetMemoryEvents().GetMax()}
	if cpu := m.GetCPU(); cpu != nil {
		out.CPUUsageNanos = cpu.GetUsageUsec() * 1000
		out.CPUUserNanos = cpu.GetUserUsec() * 1000
		out.CPUSystemNanos = cpu.GetSystemUsec() * 1000
		out.Throttling = &Throttling{Periods: cpu.GetNrPeriods(), ThrottledPeriods: cpu.GetNrThrottled(), ThrottledNanos: cpu.GetThrottledUsec() * 1000}
		out.CPUPressure = pressure(cpu.GetPSI())
	}
	if mem := m.GetMemory(); mem != nil {
		out.MemoryUsage = mem.GetUsage()
		out.WorkingSet = workingSet(out.MemoryUsage, mem.GetInactiveFile())
		out.RSS = mem.GetAnon()
		out.Cache = mem.GetFile()
		out.MappedFile = mem.GetFileMapped()
		out.ActiveFile = mem.GetActiveFile()
		out.InactiveFile = mem.GetInactiveFile()
		out.MaxUsage = mem.GetMaxUsage()
		out.PageFaults = mem.GetPgfault()
		out.MajorPageFaults = mem.GetPgmajfault()
		out.MemoryLimit, out.AvailableBytes = available(mem.GetUsageLimit(), out.WorkingSet)
		// The cgroups library reads a missing memory.swap.max as 0 and "max" as
		// MaxUint64: with swap accounting the file is there and says max or a number,
		// so 0 with no usage is taken for no accounting (a swap.max of 0, a cgroup
		// that may not swap, is reported the same way: it has no swap to show).
		if mem.GetSwapLimit() != 0 || mem.GetSwapUsage() != 0 {
			out.Swap = &Swap{Usage: mem.GetSwapUsage()}
			out.Swap.Limit, _ = available(mem.GetSwapLimit(), 0)
		}
		out.MemoryPressure = pressure(mem.GetPSI())
	}
	if io := m.GetIo(); io != nil {
		devs := map[[2]uint64]*IODevice{}
		for _, e := range io.GetUsage() {
			devs[[2]uint64{e.GetMajor(), e.GetMinor()}] = &IODevice{
				Major: e.GetMajor(), Minor: e.GetMinor(),
				ReadBytes: e.GetRbytes(), WriteBytes: e.GetWbytes(), Reads: e.GetRios(), Writes: e.GetWios(),
			}
		}
		out.IO = sortedDevices(devs)
		out.IOPressure = pressure(io.GetPSI())
	}
	return out
}

// pressure converts the cgroups library's PSI (nil when the file is missing or the
// kernel runs with psi=0).
func pressure(p *cg2.PSIStats) *Pressure {
	if p == nil || (p.GetSome() == nil && p.GetFull() == nil) {
		return nil
	}
	conv := func(d *cg2.PSIData) *PressureData {
		if d == nil {
			return nil
		}
		return &PressureData{Avg10: d.GetAvg10(), Avg60: d.GetAvg60(), Avg300: d.GetAvg300(), TotalNanos: d.GetTotal() * 1000}
	}
	return &Pressure{Some: conv(p.GetSome()), Full: conv(p.GetFull())}
}

// workingSet is usage minus inactive file pages, never below zero (the two files are
// not read atomically).
func workingSet(usage, inactiveFile uint64) uint64 {
	if inactiveFile >= usage {
		return 0
	}
	return usage - inactiveFile
}

// unlimitedMemory: limits above this are "no limit". v1 reports PAGE_COUNTER_MAX
// rounded to pages, v2 "max" (read as MaxUint64); cAdvisor and containerd use 1<<62.
const unlimitedMemory = uint64(1) << 62

func available(limit, ws uint64) (uint64, uint64) {
	if limit == 0 || limit > unlimitedMemory {
		return 0, 0
	}
	if ws >= limit {
		return limit, 0
	}
	return limit, limit - ws
}

// Add accumulates o into m: a pod whose cgroup is not its own (no cgroup_parent) is
// the sum of its pause and container cgroups. Usage, counters and per-device IO add
// up; what describes one cgroup does not and is dropped: limits (and with them
// available bytes, the swap limit and failcnt), the peak usage (the peak of a sum is
// not the sum of peaks), CFS throttling (such a pod has no quota of its own) and
// PSI (stalls of siblings overlap in time).
func (m *Metrics) Add(o *Metrics) {
	if o == nil {
		return
	}
	m.CPUUsageNanos += o.CPUUsageNanos
	m.CPUUserNanos += o.CPUUserNanos
	m.CPUSystemNanos += o.CPUSystemNanos
	m.MemoryUsage += o.MemoryUsage
	m.WorkingSet += o.WorkingSet
	m.RSS += o.RSS
	m.Cache += o.Cache
	m.MappedFile += o.MappedFile
	m.ActiveFile += o.ActiveFile
	m.InactiveFile += o.InactiveFile
	m.PageFaults += o.PageFaults
	m.MajorPageFaults += o.MajorPageFaults
	m.Pids += o.Pids
	m.OOMKills += o.OOMKills
	m.MemoryLimit, m.AvailableBytes, m.MaxUsage, m.Failcnt = 0, 0, 0, 0
	m.Throttling, m.CPUPressure, m.MemoryPressure, m.IOPressure = nil, nil, nil, nil
	switch {
	case m.Swap == nil:
		if o.Swap != nil {
			m.Swap = &Swap{Usage: o.Swap.Usage}
		}
	case o.Swap != nil:
		m.Swap = &Swap{Usage: m.Swap.Usage + o.Swap.Usage}
	default:
		m.Swap = &Swap{Usage: m.Swap.Usage}
	}
	if len(o.IO) > 0 {
		devs := map[[2]uint64]*IODevice{}
		for _, d := range append(append([]IODevice(nil), m.IO...), o.IO...) {
			k := [2]uint64{d.Major, d.Minor}
			if s := devs[k]; s != nil {
				s.ReadBytes += d.ReadBytes
				s.WriteBytes += d.WriteBytes
				s.Reads += d.Reads
				s.Writes += d.Writes
				if s.Device == "" {
					s.Device = d.Device
				}
				continue
			}
			d := d
			devs[k] = &d
		}
		m.IO = sortedDevices(devs)
	}
	if o.Timestamp.After(m.Timestamp) {
		m.Timestamp = o.Timestamp
	}
}
