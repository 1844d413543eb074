package cri

import (
	"context"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/controller"
	"github.com/crisp-runtime/crisp/internal/cri/spec"
)

// baseLabels are the label keys kubelet's embedded cAdvisor gives every series on
// /metrics/cadvisor (containerPrometheusLabelsFunc), so that a node whose kubelet takes
// pod and container stats from the CRI (PodAndContainerStatsFromCRI) serves the same
// series; kubelet passes descriptors and values through unchanged. Their values are
// cAdvisor's (metricLabels): a series with container="" is the pod's own cgroup.
var baseLabels = []string{"container", "id", "image", "name", "namespace", "pod"}

// withLabels is baseLabels followed by what a series is about.
func withLabels(extra ...string) []string {
	return append(append([]string(nil), baseLabels...), extra...)
}

var (
	cpuLabels     = withLabels("cpu")
	netLabels     = withLabels("interface")
	fsLabels      = withLabels("device")
	blkioLabels   = withLabels("device", "major", "minor", "operation")
	failureLabels = withLabels("failure_type", "scope")
)

// metricDef is one cAdvisor metric crisp reports: its descriptor and type.
type metricDef struct {
	name, help string
	labels     []string
	typ        runtime.MetricType
}

// Names of the series whose values are built in more than one place.
const (
	mCPUUsage         = "container_cpu_usage_seconds_total"
	mFsUsage          = "container_fs_usage_bytes"
	mFsInodesUsed     = "container_fs_inodes_used"
	mFsLimit          = "container_fs_limit_bytes"
	mFsInodesFree     = "container_fs_inodes_free"
	mFsInodesTotal    = "container_fs_inodes_total"
	mFsReadsBytes     = "container_fs_reads_bytes_total"
	mFsWritesBytes    = "container_fs_writes_bytes_total"
	mFsReads          = "container_fs_reads_total"
	mFsWrites         = "container_fs_writes_total"
	mBlkioDeviceUsage = "container_blkio_device_usage_total"
)

// metricDefs are the cAdvisor metrics (names, help and labels of cAdvisor's
// metrics/prometheus.go) kubelet's /metrics/cadvisor serves from the CRI, limited to
// what crisp has a value for: a descriptor with no series would only confuse. Help
// texts are cAdvisor's word for word, so that the HELP lines match too.
var metricDefs = []metricDef{
	{"container_cpu_user_seconds_total", "Cumulative user cpu time consumed in seconds.", baseLabels, runtime.MetricType_COUNTER},
	{"container_cpu_system_seconds_total", "Cumulative system cpu time consumed in seconds.", baseLabels, runtime.MetricType_COUNTER},
	{mCPUUsage, "Cumulative cpu time consumed in seconds.", cpuLabels, runtime.MetricType_COUNTER},
	{"container_cpu_cfs_periods_total", "Number of elapsed enforcement period intervals.", baseLabels, runtime.MetricType_COUNTER},
	{"container_cpu_cfs_throttled_periods_total", "Number of throttled period intervals.", baseLabels, runtime.MetricType_COUNTER},
	{"container_cpu_cfs_throttled_seconds_total", "Total time duration the container has been throttled.", baseLabels, runtime.MetricType_COUNTER},
	{"container_memory_cache", "Number of bytes of page cache memory.", baseLabels, runtime.MetricType_GAUGE},
	{"container_memory_rss", "Size of RSS in bytes.", baseLabels, runtime.MetricType_GAUGE},
	{"container_memory_mapped_file", "Size of memory mapped files in bytes.", baseLabels, runtime.MetricType_GAUGE},
	{"container_memory_swap", "Container swap usage in bytes.", baseLabels, runtime.MetricType_GAUGE},
	{"container_memory_failcnt", "Number of memory usage hits limits", baseLabels, runtime.MetricType_COUNTER},
	{"container_memory_usage_bytes", "Current memory usage in bytes, including all memory regardless of when it was accessed", baseLabels, runtime.MetricType_GAUGE},
	{"container_memory_max_usage_bytes", "Maximum memory usage recorded in bytes", baseLabels, runtime.MetricType_GAUGE},
	{"container_memory_working_set_bytes", "Current working set in bytes.", baseLabels, runtime.MetricType_GAUGE},
	{"container_memory_total_active_file_bytes", "Current total active file in bytes.", baseLabels, runtime.MetricType_GAUGE},
	{"container_memory_total_inactive_file_bytes", "Current total inactive file in bytes.", baseLabels, runtime.MetricType_GAUGE},
	{"container_memory_failures_total", "Cumulative count of memory allocation failures.", failureLabels, runtime.MetricType_COUNTER},
	{"container_oom_events_total", "Count of out of memory events observed for the container", baseLabels, runtime.MetricType_COUNTER},
	{"container_pressure_cpu_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to CPU congestion.", baseLabels, runtime.MetricType_COUNTER},
	{"container_pressure_cpu_waiting_seconds_total", "Total time duration tasks in the container have waited due to CPU congestion.", baseLabels, runtime.MetricType_COUNTER},
	{"container_pressure_memory_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to memory congestion.", baseLabels, runtime.MetricType_COUNTER},
	{"container_pressure_memory_waiting_seconds_total", "Total time duration tasks in the container have waited due to memory congestion.", baseLabels, runtime.MetricType_COUNTER},
	{"container_pressure_io_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to IO congestion.", baseLabels, runtime.MetricType_COUNTER},
	{"container_pressure_io_waiting_seconds_total", "Total time duration tasks in the container have waited due to IO congestion.", baseLabels, runtime.MetricType_COUNTER},
	{"container_processes", "Number of processes running inside the container.", baseLabels, runtime.MetricType_GAUGE},
	{mFsUsage, "Number of bytes that are consumed by the container on this filesystem.", fsLabels, runtime.MetricType_GAUGE},
	{mFsInodesUsed, "Number of inodes that are consumed by the container on this filesystem.", fsLabels, runtime.MetricType_GAUGE},
	{mFsLimit, "Number of bytes that can be consumed by the container on this filesystem.", fsLabels, runtime.MetricType_GAUGE},
	{mFsInodesFree, "Number of available Inodes", fsLabels, runtime.MetricType_GAUGE},
	{mFsInodesTotal, "Number of Inodes", fsLabels, runtime.MetricType_GAUGE},
	{mFsReadsBytes, "Cumulative count of bytes read", fsLabels, runtime.MetricType_COUNTER},
	{mFsReads, "Cumulative count of reads completed", fsLabels, runtime.MetricType_COUNTER},
	{mFsWritesBytes, "Cumulative count of bytes written", fsLabels, runtime.MetricType_COUNTER},
	{mFsWrites, "Cumulative count of writes completed", fsLabels, runtime.MetricType_COUNTER},
	{mBlkioDeviceUsage, "Blkio Device bytes usage", blkioLabels, runtime.MetricType_COUNTER},
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
// figures as ListPodSandboxStats: the pod cgroup's CPU, memory, IO, PSI and processes
// and the pod's network (container=""), and per running container its cgroup's and
// its writable layer's (labelled as cAdvisor labels them, see metricLabels).
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
			out[i] = podMetrics(st, raw, &s.stats.devs)
			return nil
		})
	}
	_ = g.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("pod sandbox metrics: %w", err)
	}
	return out, nil
}

// metricLabels are the values of baseLabels for one container or pod, with the
// meanings kubelet's cAdvisor gives them: container is the container's name ("" for
// the pod's own cgroup), id the cgroup's path below the hierarchy root, image the
// container's image as the pod spec names it, name the container's id (cAdvisor's
// containerd and CRI-O handlers alias a container by its id; a raw pod cgroup has
// no name), namespace and pod the pod's.
type metricLabels struct {
	container, id, image, name, namespace, pod string
}

func (l metricLabels) values() []string {
	return []string{l.container, l.id, l.image, l.name, l.namespace, l.pod}
}

// podLabels are the labels of a pod's own series.
func (s *Service) podLabels(p *pod) metricLabels {
	md := p.config.GetMetadata()
	return metricLabels{
		id:        s.cgroupName(p.config.GetLinux().GetCgroupParent(), ""),
		namespace: md.GetNamespace(), pod: md.GetName(),
	}
}

// containerLabels are the labels of the series of container c, whose id is id.
func (s *Service) containerLabels(p *pod, c *container, id string) metricLabels {
	l := s.podLabels(p)
	l.container = c.config.GetMetadata().GetName()
	l.id = s.cgroupName(p.config.GetLinux().GetCgroupParent(), id)
	l.name = id
	l.image = c.config.GetImage().GetUserSpecifiedImage()
	if l.image == "" {
		l.image = c.config.GetImage().GetImage()
	}
	return l
}

// cgroupName is cAdvisor's id of a cgroup: its path below the hierarchy root. With
// id empty it is the pod's own cgroup, its cgroup_parent ("" without one: such a pod
// is reported as the sum of its pause and container cgroups, which is no one cgroup);
// else container id's cgroup, where spec.CgroupsPath and libcontainer put it.
func (s *Service) cgroupName(parent, id string) string {
	systemd := s.cfg.CgroupDriver == "systemd"
	if id == "" {
		if parent == "" {
			return ""
		}
		if systemd {
			return expandSlice(parent)
		}
		return parent
	}
	p, err := spec.CgroupsPath(parent, id, systemd)
	if err != nil || !systemd {
		return p
	}
	// "slice:prefix:name" is the scope "prefix-name.scope" in the expanded slice.
	slice, rest, _ := strings.Cut(p, ":")
	prefix, name, _ := strings.Cut(rest, ":")
	return path.Join(expandSlice(slice), prefix+"-"+name+".scope")
}

// expandSlice is systemd's path of a slice: every dash-separated prefix is a parent
// slice ("a-b.slice" is /a.slice/a-b.slice; "-.slice" is the root). Names were checked
// when the pod was made (validateCgroupParent).
func expandSlice(slice string) string {
	name := strings.TrimSuffix(slice, ".slice")
	if name == "-" || name == "" {
		return "/"
	}
	var b strings.Builder
	prefix := ""
	for _, part := range strings.Split(name, "-") {
		prefix += part
		b.WriteString("/" + prefix + ".slice")
		prefix += "-"
	}
	return b.String()
}

// metricSet builds the series of one container or pod.
type metricSet struct {
	labels []string
	ts     int64
	out    []*runtime.Metric
}

func (m *metricSet) add(name string, typ runtime.MetricType, v uint64, extra ...string) {
	m.out = append(m.out, &runtime.Metric{
		Name: name, Timestamp: m.ts, MetricType: typ,
		LabelValues: append(append([]string(nil), m.labels...), extra...),
		Value:       &runtime.UInt64Value{Value: v},
	})
}

// seconds turns nanoseconds into the whole seconds a CRI metric can carry (its value
// is an integer; cAdvisor's is a float): rounded down, so a counter never runs ahead
// of the exact figure, which the stats RPCs carry in nanoseconds.
func seconds(ns uint64) uint64 { return ns / uint64(time.Second) }

// cgroupMetrics adds the series of a cgroup's figures.
func (m *metricSet) cgroupMetrics(cm *controller.Metrics, devs *blockDevices) {
	m.ts = cm.Timestamp.UnixNano()
	const counter, gauge = runtime.MetricType_COUNTER, runtime.MetricType_GAUGE
	m.add("container_cpu_user_seconds_total", counter, seconds(cm.CPUUserNanos))
	m.add("container_cpu_system_seconds_total", counter, seconds(cm.CPUSystemNanos))
	// cpu="total": kubelet's cAdvisor leaves per-CPU usage out (no PerCpuUsageMetrics
	// in its metric set) and reports the sum under that label.
	m.add(mCPUUsage, counter, seconds(cm.CPUUsageNanos), "total")
	// cAdvisor reports CFS figures only for a container with a quota; periods only
	// elapse while there is one.
	if th := cm.Throttling; th != nil && th.Periods > 0 {
		m.add("container_cpu_cfs_periods_total", counter, th.Periods)
		m.add("container_cpu_cfs_throttled_periods_total", counter, th.ThrottledPeriods)
		m.add("container_cpu_cfs_throttled_seconds_total", counter, seconds(th.ThrottledNanos))
	}
	m.add("container_memory_usage_bytes", gauge, cm.MemoryUsage)
	m.add("container_memory_working_set_bytes", gauge, cm.WorkingSet)
	m.add("container_memory_rss", gauge, cm.RSS)
	m.add("container_memory_cache", gauge, cm.Cache)
	m.add("container_memory_mapped_file", gauge, cm.MappedFile)
	m.add("container_memory_total_active_file_bytes", gauge, cm.ActiveFile)
	m.add("container_memory_total_inactive_file_bytes", gauge, cm.InactiveFile)
	if cm.MaxUsage > 0 {
		m.add("container_memory_max_usage_bytes", gauge, cm.MaxUsage)
	}
	m.add("container_memory_failcnt", counter, cm.Failcnt)
	if cm.Swap != nil {
		m.add("container_memory_swap", gauge, cm.Swap.Usage)
	}
	m.add("container_memory_failures_total", counter, cm.PageFaults, "pgfault", "container")
	m.add("container_memory_failures_total", counter, cm.MajorPageFaults, "pgmajfault", "container")
	m.add("container_oom_events_total", counter, cm.OOMKills)
	m.add("container_processes", gauge, cm.Pids)
	for _, p := range []struct {
		res string
		p   *controller.Pressure
	}{{"cpu", cm.CPUPressure}, {"memory", cm.MemoryPressure}, {"io", cm.IOPressure}} {
		if p.p == nil {
			continue
		}
		if p.p.Some != nil {
			m.add("container_pressure_"+p.res+"_waiting_seconds_total", counter, seconds(p.p.Some.TotalNanos))
		}
		if p.p.Full != nil {
			m.add("container_pressure_"+p.res+"_stalled_seconds_total", counter, seconds(p.p.Full.TotalNanos))
		}
	}
	for _, d := range cm.IO {
		dev := devs.label(d.Major, d.Minor, d.Device)
		m.add(mFsReadsBytes, counter, d.ReadBytes, dev)
		m.add(mFsWritesBytes, counter, d.WriteBytes, dev)
		m.add(mFsReads, counter, d.Reads, dev)
		m.add(mFsWrites, counter, d.Writes, dev)
		major, minor := strconv.FormatUint(d.Major, 10), strconv.FormatUint(d.Minor, 10)
		m.add(mBlkioDeviceUsage, counter, d.ReadBytes, dev, major, minor, "Read")
		m.add(mBlkioDeviceUsage, counter, d.WriteBytes, dev, major, minor, "Write")
	}
}

// podMetrics turns a pod's stats (and the raw figures behind them) into metrics.
func podMetrics(st *runtime.PodSandboxStats, raw *podStats, devs *blockDevices) *runtime.PodSandboxMetrics {
	attrs := st.GetAttributes()
	out := &runtime.PodSandboxMetrics{PodSandboxId: attrs.GetId()}
	pm := &metricSet{labels: raw.labels.values(), ts: time.Now().UnixNano()}
	if raw.pod != nil {
		pm.cgroupMetrics(raw.pod, devs)
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
		cr := raw.containers[ca.GetId()]
		if cr == nil {
			continue // created or exited: it uses nothing
		}
		set := &metricSet{labels: raw.ctrsLabels[ca.GetId()].values()}
		set.cgroupMetrics(cr.m, devs)
		if u := cr.fs; u != nil {
			set.ts = u.at.UnixNano()
			// cAdvisor's device is the block device of the writable layer's
			// filesystem; on none (tmpfs, overlay) crisp names its mount point.
			dev := u.device
			if dev == "" {
				dev = u.mountpoint
			}
			set.add(mFsUsage, runtime.MetricType_GAUGE, u.bytes, dev)
			set.add(mFsInodesUsed, runtime.MetricType_GAUGE, u.inodes, dev)
			if c := u.capacity; c != nil {
				set.add(mFsLimit, runtime.MetricType_GAUGE, c.limitBytes, dev)
				set.add(mFsInodesTotal, runtime.MetricType_GAUGE, c.inodesTotal, dev)
				set.add(mFsInodesFree, runtime.MetricType_GAUGE, c.inodesFree, dev)
			}
		}
		out.ContainerMetrics = append(out.ContainerMetrics, &runtime.ContainerMetrics{ContainerId: ca.GetId(), Metrics: set.out})
	}
	return out
}
