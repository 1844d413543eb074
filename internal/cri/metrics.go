package cri

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/controller"
)

// Label keys of the metrics, as containerd's CRI names them: id and name of the
// container (of the pod for pod-level metrics), plus what a series is about.
var (
	baseLabels    = []string{"id", "name"}
	netLabels     = []string{"id", "name", "interface"}
	fsLabels      = []string{"id", "name", "device"}
	failureLabels = []string{"id", "name", "failure_type", "scope"}
)

// metricDef is one cAdvisor metric crisp reports: its descriptor and type.
type metricDef struct {
	name, help string
	labels     []string
	typ        runtime.MetricType
}

// metricDefs are the cAdvisor metric names kubelet's /metrics/cadvisor serves from the
// CRI (PodAndContainerStatsFromCRI), limited to what crisp has a value for: a
// descriptor with no series would only confuse.
var metricDefs = []metricDef{
	{"container_cpu_usage_seconds_total", "Cumulative CPU time consumed in seconds.", baseLabels, runtime.MetricType_COUNTER},
	{"container_memory_usage_bytes", "Current memory usage in bytes, including all memory regardless of when it was accessed", baseLabels, runtime.MetricType_GAUGE},
	{"container_memory_working_set_bytes", "Current working set in bytes.", baseLabels, runtime.MetricType_GAUGE},
	{"container_memory_rss", "Size of RSS in bytes.", baseLabels, runtime.MetricType_GAUGE},
	{"container_memory_failures_total", "Cumulative count of memory allocation failures.", failureLabels, runtime.MetricType_COUNTER},
	{"container_processes", "Number of processes running inside the container.", baseLabels, runtime.MetricType_GAUGE},
	{"container_fs_usage_bytes", "Number of bytes that are consumed by the container on this filesystem.", fsLabels, runtime.MetricType_GAUGE},
	{"container_fs_inodes_used", "Number of inodes that are consumed by the container on this filesystem.", fsLabels, runtime.MetricType_GAUGE},
	{"container_network_receive_bytes_total", "Cumulative count of bytes received", netLabels, runtime.MetricType_COUNTER},
	{"container_network_receive_packets_total", "Cumulative count of packets received", netLabels, runtime.MetricType_COUNTER},
	{"container_network_receive_packets_dropped_total", "Cumulative count of packets dropped while receiving", netLabels, runtime.MetricType_COUNTER},
	{"container_network_receive_errors_total", "Cumulative count of errors encountered while receiving", netLabels, runtime.MetricType_COUNTER},
	{"container_network_transmit_bytes_total", "Cumulative count of bytes transmitted", netLabels, runtime.MetricType_COUNTER},
	{"container_network_transmit_packets_total", "Cumulative count of packets transmitted", netLabels, runtime.MetricType_COUNTER},
	{"container_network_transmit_packets_dropped_total", "Cumulative count of packets dropped while transmitting", netLabels, runtime.MetricType_COUNTER},
	{"container_network_transmit_errors_total", "Cumulative count of errors encountered while transmitting", netLabels, runtime.MetricType_COUNTER},
}

// ListMetricDescriptors lists the metrics ListPodSandboxMetrics reports.
func (s *Service) ListMetricDescriptors(context.Context, *runtime.ListMetricDescriptorsRequest) (*runtime.ListMetricDescriptorsResponse, error) {
	out := make([]*runtime.MetricDescriptor, len(metricDefs))
	for i, d := range metricDefs {
		out[i] = &runtime.MetricDescriptor{Name: d.name, Help: d.help, LabelKeys: append([]string(nil), d.labels...)}
	}
	return &runtime.ListMetricDescriptorsResponse{Descriptors: out}, nil
}

// ListPodSandboxMetrics reports the metrics of every ready pod, built from the same
// figures as ListPodSandboxStats: pod-level CPU, memory, processes and network
// (labelled with the pod's id and name), and per running container CPU, memory,
// processes and writable layer (labelled with the container's id and name).
func (s *Service) ListPodSandboxMetrics(ctx context.Context, _ *runtime.ListPodSandboxMetricsRequest) (*runtime.ListPodSandboxMetricsResponse, error) {
	items, err := s.listPodSandboxMetrics(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtime.ListPodSandboxMetricsResponse{PodMetrics: items}, nil
}

// StreamPodSandboxMetrics is ListPodSandboxMetrics in messages of at most
// streamChunkBytes (KEP-5825).
func (s *Service) StreamPodSandboxMetrics(_ *runtime.StreamPodSandboxMetricsRequest, stream runtime.RuntimeService_StreamPodSandboxMetricsServer) error {
	items, err := s.listPodSandboxMetrics(stream.Context())
	if err != nil {
		return toStatus(err)
	}
	return toStatus(sendChunks(stream.Context(), items, streamChunkBytes, func(chunk []*runtime.PodSandboxMetrics) error {
		return stream.Send(&runtime.StreamPodSandboxMetricsResponse{PodSandboxMetrics: chunk})
	}))
}

func (s *Service) listPodSandboxMetrics(ctx context.Context) ([]*runtime.PodSandboxMetrics, error) {
	s.pruneStats()
	pods := s.readyPods("", nil)
	out := make([]*runtime.PodSandboxMetrics, len(pods))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(statsParallel)
	for i, p := range pods {
		g.Go(func() error {
			st, raw := s.podSandboxStats(gctx, p)
			out[i] = podMetrics(st, raw)
			return nil
		})
	}
	_ = g.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("pod sandbox metrics: %w", err)
	}
	return out, nil
}

// metricSet builds the series of one container or pod.
type metricSet struct {
	id, name string
	ts       int64
	out      []*runtime.Metric
}

func (m *metricSet) add(name string, typ runtime.MetricType, v uint64, extra ...string) {
	m.out = append(m.out, &runtime.Metric{
		Name: name, Timestamp: m.ts, MetricType: typ,
		LabelValues: append([]string{m.id, m.name}, extra...),
		Value:       &runtime.UInt64Value{Value: v},
	})
}

// cgroupMetrics adds the CPU, memory and process series of a cgroup's metrics.
func (m *metricSet) cgroupMetrics(cm *controller.Metrics) {
	m.ts = cm.Timestamp.UnixNano()
	// The CRI carries integers: whole seconds, as the name promises. The exact
	// nanoseconds are in the stats RPCs' usage_core_nano_seconds.
	m.add("container_cpu_usage_seconds_total", runtime.MetricType_COUNTER, cm.CPUUsageNanos/uint64(time.Second))
	m.add("container_memory_usage_bytes", runtime.MetricType_GAUGE, cm.MemoryUsage)
	m.add("container_memory_working_set_bytes", runtime.MetricType_GAUGE, cm.WorkingSet)
	m.add("container_memory_rss", runtime.MetricType_GAUGE, cm.RSS)
	m.add("container_memory_failures_total", runtime.MetricType_COUNTER, cm.PageFaults, "pgfault", "container")
	m.add("container_memory_failures_total", runtime.MetricType_COUNTER, cm.MajorPageFaults, "pgmajfault", "container")
	m.add("container_processes", runtime.MetricType_GAUGE, cm.Pids)
}

// podMetrics turns a pod's stats (and the raw figures behind them) into metrics.
func podMetrics(st *runtime.PodSandboxStats, raw *podStats) *runtime.PodSandboxMetrics {
	attrs := st.GetAttributes()
	out := &runtime.PodSandboxMetrics{PodSandboxId: attrs.GetId()}
	pm := &metricSet{id: attrs.GetId(), name: attrs.GetMetadata().GetName(), ts: time.Now().UnixNano()}
	if raw.pod != nil {
		pm.cgroupMetrics(raw.pod)
	}
	if nu := st.GetLinux().GetNetwork(); nu != nil {
		pm.ts = nu.GetTimestamp()
		for _, i := range raw.network {
			pm.add("container_network_receive_bytes_total", runtime.MetricType_COUNTER, i.rxBytes, i.name)
			pm.add("container_network_receive_packets_total", runtime.MetricType_COUNTER, i.rxPackets, i.name)
			pm.add("container_network_receive_packets_dropped_total", runtime.MetricType_COUNTER, i.rxDropped, i.name)
			pm.add("container_network_receive_errors_total", runtime.MetricType_COUNTER, i.rxErrors, i.name)
			pm.add("container_network_transmit_bytes_total", runtime.MetricType_COUNTER, i.txBytes, i.name)
			pm.add("container_network_transmit_packets_total", runtime.MetricType_COUNTER, i.txPackets, i.name)
			pm.add("container_network_transmit_packets_dropped_total", runtime.MetricType_COUNTER, i.txDropped, i.name)
			pm.add("container_network_transmit_errors_total", runtime.MetricType_COUNTER, i.txErrors, i.name)
		}
	}
	out.Metrics = pm.out
	for _, cs := range st.GetLinux().GetContainers() {
		ca := cs.GetAttributes()
		cm := raw.containers[ca.GetId()]
		if cm == nil {
			continue // created or exited: it uses nothing
		}
		set := &metricSet{id: ca.GetId(), name: ca.GetMetadata().GetName()}
		set.cgroupMetrics(cm)
		if wl := cs.GetWritableLayer(); wl != nil {
			set.ts = wl.GetTimestamp()
			dev := wl.GetFsId().GetMountpoint()
			set.add("container_fs_usage_bytes", runtime.MetricType_GAUGE, wl.GetUsedBytes().GetValue(), dev)
			set.add("container_fs_inodes_used", runtime.MetricType_GAUGE, wl.GetInodesUsed().GetValue(), dev)
		}
		out.ContainerMetrics = append(out.ContainerMetrics, &runtime.ContainerMetrics{ContainerId: ca.GetId(), Metrics: set.out})
	}
	return out
}
