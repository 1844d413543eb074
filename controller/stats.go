package controller

import (
	"context"
	"fmt"
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
// them. Counters are cumulative since the cgroup was made.
type Metrics struct {
	// Timestamp is when the figures were read.
	Timestamp time.Time
	// CPUUsageNanos is the CPU time used by every task of the cgroup.
	CPUUsageNanos uint64
	// MemoryUsage is what the kernel charges the cgroup (page cache included).
	MemoryUsage uint64
	// WorkingSet is MemoryUsage minus the inactive file cache: what kubelet and
	// cAdvisor call the working set and evict on.
	WorkingSet uint64
	// RSS is anonymous memory and swap cache (v1 total_rss, v2 anon).
	RSS uint64
	// PageFaults and MajorPageFaults count faults (v1 total_pgfault/total_pgmajfault,
	// v2 pgfault/pgmajfault).
	PageFaults, MajorPageFaults uint64
	// MemoryLimit is the limit in bytes, 0 when unlimited; AvailableBytes is
	// MemoryLimit - WorkingSet (0 when unlimited or above the limit).
	MemoryLimit, AvailableBytes uint64
	// Pids is the number of tasks in the cgroup.
	Pids uint64
	// OOMKills counts processes of the cgroup killed by the OOM killer (v1
	// memory.oom_control oom_kill, v2 memory.events oom_kill: hierarchical, so a pod
	// cgroup counts its containers' kills). No CRI stats field carries it; it is what
	// cAdvisor's container_oom_events_total counts.
	OOMKills uint64
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
	out := &Metrics{CPUUsageNanos: m.GetCPU().GetUsage().GetTotal(), Pids: m.GetPids().GetCurrent(), OOMKills: m.GetMemoryOomControl().GetOomKill()}
	if mem := m.GetMemory(); mem != nil {
		out.MemoryUsage = mem.GetUsage().GetUsage()
		out.WorkingSet = workingSet(out.MemoryUsage, mem.GetTotalInactiveFile())
		out.RSS = mem.GetTotalRSS()
		out.PageFaults = mem.GetTotalPgFault()
		out.MajorPageFaults = mem.GetTotalPgMajFault()
		out.MemoryLimit, out.AvailableBytes = available(mem.GetUsage().GetLimit(), out.WorkingSet)
	}
	return out
}

func fromV2(m *cg2.Metrics) *Metrics {
	out := &Metrics{CPUUsageNanos: m.GetCPU().GetUsageUsec() * 1000, Pids: m.GetPids().GetCurrent(), OOMKills: m.GetMemoryEvents().GetOomKill()}
	if mem := m.GetMemory(); mem != nil {
		out.MemoryUsage = mem.GetUsage()
		out.WorkingSet = workingSet(out.MemoryUsage, mem.GetInactiveFile())
		out.RSS = mem.GetAnon()
		out.PageFaults = mem.GetPgfault()
		out.MajorPageFaults = mem.GetPgmajfault()
		out.MemoryLimit, out.AvailableBytes = available(mem.GetUsageLimit(), out.WorkingSet)
	}
	return out
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
// the sum of its pause and container cgroups. Limits do not add up and are dropped.
func (m *Metrics) Add(o *Metrics) {
	if o == nil {
		return
	}
	m.CPUUsageNanos += o.CPUUsageNanos
	m.MemoryUsage += o.MemoryUsage
	m.WorkingSet += o.WorkingSet
	m.RSS += o.RSS
	m.PageFaults += o.PageFaults
	m.MajorPageFaults += o.MajorPageFaults
	m.Pids += o.Pids
	m.OOMKills += o.OOMKills
	m.MemoryLimit, m.AvailableBytes = 0, 0
	if o.Timestamp.After(m.Timestamp) {
		m.Timestamp = o.Timestamp
	}
}
