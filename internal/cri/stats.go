package cri

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sync/errgroup"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/controller"
)

const (
	// fsUsageTTL is how long a container's writable-layer walk is reused: kubelet asks
	// every 10-15 s, and a walk of a big upper dir costs far more than the rest of a
	// stats call (containerd refreshes its snapshot usage every 10 s too).
	fsUsageTTL = 10 * time.Second
	// minRateInterval is the shortest interval usage_nano_cores is computed over:
	// closer samples (two clients, or List right after Get) would give noise, so the
	// previous rate is reported until the interval has passed.
	minRateInterval = time.Second
	// statsParallel bounds the pods (ListPodSandboxStats) or containers
	// (ListContainerStats) whose stats are collected at once.
	statsParallel = 8
)

// statsState is what stats keep between calls: the previous CPU sample of every
// container and pod (usage_nano_cores is a rate between two samples), the cached
// writable-layer usage and the names of block devices. The zero value is ready to use.
type statsState struct {
	mu  sync.Mutex
	cpu map[string]cpuSample // by container id, or "pod/"+pod id
	fs  map[string]fsUsage   // by container id
	// devs names the block devices of IO and filesystem series.
	devs blockDevices
}

type cpuSample struct {
	at    time.Time
	usage uint64
	// rate is the usage_nano_cores computed when this sample was stored; hasRate is
	// false for the first sample.
	rate    uint64
	hasRate bool
}

type fsUsage struct {
	at, expiresAt time.Time
	mountpoint    string
	bytes, inodes uint64
	// device is the block device holding the writable layer ("/dev/vda1"), empty when
	// it is on none (tmpfs, overlay); capacity is its filesystem's size and inodes
	// (statfs), known only then: cAdvisor's fs limit and inode series are per device.
	device   string
	capacity *fsCapacity
	err      error
}

// fsCapacity is a filesystem's size, from statfs(2).
type fsCapacity struct {
	limitBytes, inodesTotal, inodesFree uint64
}

// cpuRate returns usage_nano_cores for key at (at, usage), and whether there is one.
func (st *statsState) cpuRate(key string, at time.Time, usage uint64) (uint64, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.cpu == nil {
		st.cpu = map[string]cpuSample{}
	}
	prev, ok := st.cpu[key]
	if ok && at.Sub(prev.at) < minRateInterval && !at.Before(prev.at) {
		return prev.rate, prev.hasRate
	}
	next := cpuSample{at: at, usage: usage}
	if ok && at.After(prev.at) && usage >= prev.usage {
		next.rate = uint64(float64(usage-prev.usage) / float64(at.Sub(prev.at).Nanoseconds()) * 1e9)
		next.hasRate = true
	}
	st.cpu[key] = next
	return next.rate, next.hasRate
}

// prune forgets the samples of containers and pods that no longer exist.
func (st *statsState) prune(live func(key string) bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for k := range st.cpu {
		if !live(k) {
			delete(st.cpu, k)
		}
	}
	for k := range st.fs {
		if !live(k) {
			delete(st.fs, k)
		}
	}
}

func podKey(id string) string { return "pod/" + id }

// writableLayer returns the container's writable-layer usage, walking it at most once
// per fsUsageTTL, and the figures behind it.
func (s *Service) writableLayer(id string, now time.Time) (*runtime.FilesystemUsage, *fsUsage, error) {
	st := &s.stats
	st.mu.Lock()
	u, ok := st.fs[id]
	st.mu.Unlock()
	if !ok || now.After(u.expiresAt) {
		mp, b, n, err := s.images.RootfsUsage(id)
		u = fsUsage{at: time.Now(), mountpoint: mp, err: err}
		if err == nil {
			u.bytes, u.inodes = uint64(b), uint64(n)
			u.device, u.capacity = st.devs.filesystem(mp)
		}
		u.expiresAt = u.at.Add(fsUsageTTL)
		st.mu.Lock()
		if st.fs == nil {
			st.fs = map[string]fsUsage{}
		}
		st.fs[id] = u
		st.mu.Unlock()
	}
	if u.err != nil {
		return nil, nil, u.err
	}
	return &runtime.FilesystemUsage{
		Timestamp:  u.at.UnixNano(),
		FsId:       &runtime.FilesystemIdentifier{Mountpoint: u.mountpoint},
		UsedBytes:  &runtime.UInt64Value{Value: u.bytes},
		InodesUsed: &runtime.UInt64Value{Value: u.inodes},
	}, &u, nil
}

// cpuUsage is the CRI CpuUsage of m, with the rate against key's previous sample.
func (s *Service) cpuUsage(key string, m *controller.Metrics) *runtime.CpuUsage {
	u := &runtime.CpuUsage{
		Timestamp:            m.Timestamp.UnixNano(),
		UsageCoreNanoSeconds: &runtime.UInt64Value{Value: m.CPUUsageNanos},
	}
	if rate, ok := s.stats.cpuRate(key, m.Timestamp, m.CPUUsageNanos); ok {
		u.UsageNanoCores = &runtime.UInt64Value{Value: rate}
	}
	u.Psi = psiStats(m.CPUPressure)
	return u
}

// psiStats is the CRI form of a cgroup's PSI; nil (the field left out) where the host
// has none: cgroup v1, a kernel without PSI.
func psiStats(p *controller.Pressure) *runtime.PsiStats {
	if p == nil {
		return nil
	}
	conv := func(d *controller.PressureData) *runtime.PsiData {
		if d == nil {
			return nil
		}
		return &runtime.PsiData{Total: d.TotalNanos, Avg10: d.Avg10, Avg60: d.Avg60, Avg300: d.Avg300}
	}
	return &runtime.PsiStats{Some: conv(p.Some), Full: conv(p.Full)}
}

// ioUsage is the CRI IoUsage of m: the CRI carries only IO PSI (the bytes and
// operations per device go to the metrics RPCs), so without PSI there is nothing.
func ioUsage(m *controller.Metrics) *runtime.IoUsage {
	if m.IOPressure == nil {
		return nil
	}
	return &runtime.IoUsage{Timestamp: m.Timestamp.UnixNano(), Psi: psiStats(m.IOPressure)}
}

// swapUsage is the CRI SwapUsage of m; nil without swap accounting. Available is left
// out when the swap is unlimited, as available_bytes is for memory.
func swapUsage(m *controller.Metrics) *runtime.SwapUsage {
	if m.Swap == nil {
		return nil
	}
	u := &runtime.SwapUsage{Timestamp: m.Timestamp.UnixNano(), SwapUsageBytes: &runtime.UInt64Value{Value: m.Swap.Usage}}
	if m.Swap.Limit > 0 {
		avail := uint64(0)
		if m.Swap.Limit > m.Swap.Usage {
			avail = m.Swap.Limit - m.Swap.Usage
		}
		u.SwapAvailableBytes = &runtime.UInt64Value{Value: avail}
	}
	return u
}

func memoryUsage(m *controller.Metrics) *runtime.MemoryUsage {
	u := &runtime.MemoryUsage{
		Timestamp:       m.Timestamp.UnixNano(),
		WorkingSetBytes: &runtime.UInt64Value{Value: m.WorkingSet},
		UsageBytes:      &runtime.UInt64Value{Value: m.MemoryUsage},
		RssBytes:        &runtime.UInt64Value{Value: m.RSS},
		PageFaults:      &runtime.UInt64Value{Value: m.PageFaults},
		MajorPageFaults: &runtime.UInt64Value{Value: m.MajorPageFaults},
	}
	// Without a limit there is nothing to be available against: left out, as
	// cAdvisor does.
	if m.MemoryLimit > 0 {
		u.AvailableBytes = &runtime.UInt64Value{Value: m.AvailableBytes}
	}
	u.Psi = psiStats(m.MemoryPressure)
	return u
}

// validateStatsFilter refuses filters that cannot name anything: ids are hex (crisp
// makes 64 hex digits; a prefix is accepted as in ListContainers), label keys are
// non-empty.
func validateStatsFilter(id, podID string, labels map[string]string) error {
	for what, v := range map[string]string{"id": id, "pod_sandbox_id": podID} {
		if len(v) > 64 || strings.IndexFunc(v, func(r rune) bool { return !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') }) >= 0 {
			return invalid("filter %s %q: ids are (prefixes of) 64 lowercase hex digits", what, v)
		}
	}
	for k := range labels {
		if k == "" {
			return invalid("filter label_selector has an empty key")
		}
	}
	return nil
}

// ContainerStats reports one container's usage. Unknown ids are NotFound.
func (s *Service) ContainerStats(ctx context.Context, req *runtime.ContainerStatsRequest) (*runtime.ContainerStatsResponse, error) {
	c, err := s.resolveContainer(req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtime.ContainerStatsResponse{Stats: s.containerStats(ctx, c)}, nil
}

// ListContainerStats reports every container the filter selects, created and exited
// ones included with their attributes only (they use nothing).
func (s *Service) ListContainerStats(ctx context.Context, req *runtime.ListContainerStatsRequest) (*runtime.ListContainerStatsResponse, error) {
	items, err := s.listContainerStats(ctx, req.GetFilter())
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtime.ListContainerStatsResponse{Stats: items}, nil
}

// StreamContainerStats is ListContainerStats in messages of at most streamChunkBytes.
func (s *Service) StreamContainerStats(req *runtime.StreamContainerStatsRequest, stream runtime.RuntimeService_StreamContainerStatsServer) error {
	items, err := s.listContainerStats(stream.Context(), req.GetFilter())
	if err != nil {
		return toStatus(err)
	}
	return toStatus(sendChunks(stream.Context(), items, streamChunkBytes, func(chunk []*runtime.ContainerStats) error {
		return stream.Send(&runtime.StreamContainerStatsResponse{ContainerStats: chunk})
	}))
}

func (s *Service) listContainerStats(ctx context.Context, f *runtime.ContainerStatsFilter) ([]*runtime.ContainerStats, error) {
	if err := validateStatsFilter(f.GetId(), f.GetPodSandboxId(), f.GetLabelSelector()); err != nil {
		return nil, err
	}
	s.pruneStats()
	type item struct {
		created int64
		c       *container
	}
	var items []item
	for _, c := range s.containersWithPrefix(f.GetId()) {
		rec := c.snapshot()
		if f.GetPodSandboxId() != "" && !strings.HasPrefix(rec.PodID, f.GetPodSandboxId()) {
			continue
		}
		if !labelsMatch(c.config.GetLabels(), f.GetLabelSelector()) {
			continue
		}
		items = append(items, item{rec.CreatedAt, c})
	}
	sort.Slice(items, func(i, j int) bool { return items[i].created < items[j].created })
	// One shim round trip per running container: asked in parallel, as the pods of
	// ListPodSandboxStats are, since kubelet asks for all of them every 10-15 s and a
	// node's shims answer independently of each other.
	out := make([]*runtime.ContainerStats, len(items))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(statsParallel)
	for i, it := range items {
		g.Go(func() error {
			out[i] = s.containerStats(gctx, it.c)
			return nil
		})
	}
	_ = g.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("container stats: %w", err)
	}
	return out, nil
}

// containerStats builds one container's stats; a running container whose shim cannot
// answer (gone, or the container just exited) is reported with its attributes only.
func (s *Service) containerStats(ctx context.Context, c *container) *runtime.ContainerStats {
	st, _ := s.containerStatsMetrics(ctx, c)
	return st
}

// containerRaw is what a running container's stats were built from, for the metrics
// RPCs.
type containerRaw struct {
	m  *controller.Metrics
	fs *fsUsage // nil when the writable layer's usage is unknown
}

// containerStatsMetrics is containerStats plus what it was built from (nil when the
// container uses nothing or its shim could not answer).
func (s *Service) containerStatsMetrics(ctx context.Context, c *container) (*runtime.ContainerStats, *containerRaw) {
	rec := c.snapshot()
	st := &runtime.ContainerStats{Attributes: &runtime.ContainerAttributes{
		Id: rec.ID, Metadata: c.config.GetMetadata(),
		Labels: c.config.GetLabels(), Annotations: c.config.GetAnnotations(),
	}}
	if rec.State != stateRunning {
		return st, nil
	}
	m, err := s.ctrl.ContainerMetrics(ctx, rec.PodID, rec.ID)
	if err != nil {
		// Not worth a warning when it raced with the exit: the next call sees it.
		lvl := s.log.Warn
		if errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err) || errdefs.IsUnavailable(err) {
			lvl = s.log.Debug
		}
		lvl("container stats: usage unavailable, reporting attributes only", "container", rec.ID, "pod", rec.PodID, "err", err)
		return st, nil
	}
	st.Cpu = s.cpuUsage(rec.ID, m)
	st.Memory = memoryUsage(m)
	st.Swap = swapUsage(m)
	st.Io = ioUsage(m)
	raw := &containerRaw{m: m}
	if fsu, u, err := s.writableLayer(rec.ID, time.Now()); err != nil {
		s.log.Debug("container stats: writable layer usage unavailable", "container", rec.ID, "err", err)
	} else {
		st.WritableLayer, raw.fs = fsu, u
	}
	return st, raw
}

// pruneStats drops the samples of removed containers and pods.
func (s *Service) pruneStats() {
	s.mu.RLock()
	defer s.mu.RUnlock()
	s.stats.prune(func(key string) bool {
		if id, ok := strings.CutPrefix(key, "pod/"); ok {
			return s.pods[id] != nil
		}
		return s.containers[key] != nil
	})
}

// PodSandboxStats reports one pod's usage: its cgroup's CPU and memory, its network
// namespace's interfaces, its process count and each container's stats. Unknown ids
// are NotFound; a pod that is not ready is reported with what is still known.
func (s *Service) PodSandboxStats(ctx context.Context, req *runtime.PodSandboxStatsRequest) (*runtime.PodSandboxStatsResponse, error) {
	p, err := s.resolvePod(req.GetPodSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	st, _ := s.podSandboxStats(ctx, p)
	return &runtime.PodSandboxStatsResponse{Stats: st}, nil
}

// ListPodSandboxStats reports every ready pod the filter selects.
func (s *Service) ListPodSandboxStats(ctx context.Context, req *runtime.ListPodSandboxStatsRequest) (*runtime.ListPodSandboxStatsResponse, error) {
	items, err := s.listPodSandboxStats(ctx, req.GetFilter())
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtime.ListPodSandboxStatsResponse{Stats: items}, nil
}

// StreamPodSandboxStats is ListPodSandboxStats in messages of at most streamChunkBytes.
func (s *Service) StreamPodSandboxStats(req *runtime.StreamPodSandboxStatsRequest, stream runtime.RuntimeService_StreamPodSandboxStatsServer) error {
	items, err := s.listPodSandboxStats(stream.Context(), req.GetFilter())
	if err != nil {
		return toStatus(err)
	}
	return toStatus(sendChunks(stream.Context(), items, streamChunkBytes, func(chunk []*runtime.PodSandboxStats) error {
		return stream.Send(&runtime.StreamPodSandboxStatsResponse{PodSandboxStats: chunk})
	}))
}

// readyPods returns the ready pods the id prefix and label selector select, oldest first.
func (s *Service) readyPods(id string, labels map[string]string) []*pod {
	pods := s.podsWithPrefix(id)
	ready := pods[:0]
	for _, p := range pods {
		// A pod that is not ready uses nothing: its cgroup and namespaces are gone.
		if labelsMatch(p.config.GetLabels(), labels) && s.ctrl.Ready(p.rec.ID) {
			ready = append(ready, p)
		}
	}
	sort.Slice(ready, func(i, j int) bool { return ready[i].rec.CreatedAt < ready[j].rec.CreatedAt })
	return ready
}

func (s *Service) listPodSandboxStats(ctx context.Context, f *runtime.PodSandboxStatsFilter) ([]*runtime.PodSandboxStats, error) {
	if err := validateStatsFilter(f.GetId(), "", f.GetLabelSelector()); err != nil {
		return nil, err
	}
	s.pruneStats()
	pods := s.readyPods(f.GetId(), f.GetLabelSelector())
	out := make([]*runtime.PodSandboxStats, len(pods))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(statsParallel)
	for i, p := range pods {
		g.Go(func() error {
			out[i], _ = s.podSandboxStats(gctx, p)
			return nil
		})
	}
	_ = g.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("pod sandbox stats: %w", err)
	}
	return out, nil
}

// podStats is what one pod's stats were built from, for the metrics RPCs.
type podStats struct {
	pod        *controller.Metrics // nil when the shim could not answer
	network    []netIface
	containers map[string]*containerRaw // by container id, running ones only
	// labels are the cAdvisor label values of the pod's series and, by container id,
	// of its containers' (see metricLabels).
	labels     metricLabels
	ctrsLabels map[string]metricLabels
}

// podSandboxStats builds a pod's stats. Each part the pod cannot give (shim gone,
// pause gone, host network) is left out and logged; nothing here fails the call.
func (s *Service) podSandboxStats(ctx context.Context, p *pod) (*runtime.PodSandboxStats, *podStats) {
	id := p.rec.ID
	log := s.log.With("pod", id)
	out := &runtime.PodSandboxStats{
		Attributes: &runtime.PodSandboxAttributes{
			Id: id, Metadata: p.config.GetMetadata(),
			Labels: p.config.GetLabels(), Annotations: p.config.GetAnnotations(),
		},
		Linux: &runtime.LinuxPodSandboxStats{},
	}
	raw := &podStats{
		containers: map[string]*containerRaw{},
		labels:     s.podLabels(p),
		ctrsLabels: map[string]metricLabels{},
	}
	for _, c := range s.containersOf(id) {
		cs, cr := s.containerStatsMetrics(ctx, c)
		out.Linux.Containers = append(out.Linux.Containers, cs)
		if cr != nil {
			cid := cs.GetAttributes().GetId()
			raw.containers[cid] = cr
			raw.ctrsLabels[cid] = s.containerLabels(p, c, cid)
		}
	}
	sort.Slice(out.Linux.Containers, func(i, j int) bool {
		return out.Linux.Containers[i].GetAttributes().GetId() < out.Linux.Containers[j].GetAttributes().GetId()
	})

	ready := s.ctrl.Ready(id)
	if !ready {
		return out, raw
	}
	podM, err := s.ctrl.SandboxMetrics(ctx, id)
	switch {
	case err != nil:
		log.Warn("pod stats: cgroup metrics unavailable", "err", err)
	default:
		if p.config.GetLinux().GetCgroupParent() == "" {
			// The default parent is shared by every pod: the shim reported the pause's
			// own cgroup, and the pod is that plus its containers' (siblings of it).
			for _, cr := range raw.containers {
				podM.Add(cr.m)
			}
		}
		raw.pod = podM
		out.Linux.Cpu = s.cpuUsage(podKey(id), podM)
		out.Linux.Memory = memoryUsage(podM)
		out.Linux.Io = ioUsage(podM)
		out.Linux.Process = &runtime.ProcessUsage{
			Timestamp:    podM.Timestamp.UnixNano(),
			ProcessCount: &runtime.UInt64Value{Value: podM.Pids},
		}
	}

	if p.config.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtime.NamespaceMode_NODE {
		// The host's interfaces are not the pod's.
		return out, raw
	}
	st, err := s.ctrl.Status(id)
	if err != nil || st.Pid == 0 {
		log.Debug("pod stats: no pause process for network stats", "err", err)
		return out, raw
	}
	ifaces, at, err := readNetDev(int(st.Pid))
	if err != nil {
		log.Warn("pod stats: network counters unavailable", "pause_pid", st.Pid, "err", err)
		return out, raw
	}
	raw.network = ifaces
	out.Linux.Network = networkUsage(ifaces, at)
	return out, raw
}
